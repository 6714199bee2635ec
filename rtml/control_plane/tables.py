"""The control plane's tables: typed reads and writes over one Redis connection pool.

::

    head service / node managers / drivers
        |  put_node, heartbeat, put_job, export_function, put_actor, ...
        v
    ControlPlane --(redis-py, pipelined)--> Redis: hashes, sets, a zset, a stream
        ^                                        (key names: keys.py)
        |  write_task_records, append_events  (batched off the hot path)
    BatchedWriter (writer.py)

Records are Redis hashes whose fields are ``str`` names and whose values are
msgpack-encoded (so ints, floats, bools, lists, dicts and bytes round-trip and a
write merges field by field). ``get_*`` returns values as stored; ``list_*``
returns JSON-friendly dicts in which every ``bytes`` value is a hex string.

Every Redis failure surfaces as :class:`rtml.exceptions.RtmlSystemError`, whose
``__cause__`` is the redis-py error, so no caller outside this package needs to
import ``redis``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

import msgspec
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rtml.control_plane.keys import DEFAULT_NAMESPACE, Keys
from rtml.exceptions import RtmlSystemError

EVENTS_MAXLEN = 100_000
_EVENT_FIELD = b"e"
_SCAN_CHUNK = 1000

# Deletes KEYS[1] only while it still holds ARGV[1]: compare-and-delete in one step.
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# One call writes a whole batch of task records, so the client packs one command, not
# two per task. ARGV: key prefix, then per task: id, submit_ts ("" if none), field
# count, field, value, field, value, ...
_WRITE_TASKS = """
local i, n = 2, #ARGV
while i <= n do
  local id, ts, count = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  redis.call('HSET', ARGV[1] .. id, unpack(ARGV, i + 3, i + 2 + 2 * count))
  if ts ~= '' then redis.call('ZADD', KEYS[1], ts, id) end
  i = i + 3 + 2 * count
end
return 0
"""

# Transient connection errors are retried briefly (2 ms doubling, ~0.25 s in all); callers
# own longer outages. A wrong password is never retried: it will not get better.
_RETRIES = 7
_BACKOFF_BASE = 0.002
_BACKOFF_CAP = 0.1

P = ParamSpec("P")
R = TypeVar("R")


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"control plane values must be msgpack-able, got {type(obj).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder()


def _pack(info: dict[str, Any]) -> dict[str, bytes]:
    return {str(k): _encoder.encode(v) for k, v in info.items()}


def _unpack(raw: dict[bytes, bytes]) -> dict[str, Any]:
    return {k.decode(): _decoder.decode(v) for k, v in raw.items()}


def to_jsonable(value: Any) -> Any:
    """``value`` with bytes as hex strings, tuples as lists and dict keys as str."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


class _NoAuthRetry(Retry):
    """redis-py's Retry, minus retrying AuthenticationError (a ConnectionError subclass)."""

    def call_with_retry(self, do: Callable[[], R], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> R:
        def retryable(exc: Exception) -> bool:
            if isinstance(exc, redis.AuthenticationError):
                return False
            return is_retryable is None or is_retryable(exc)

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def _redis_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Re-raise redis-py errors from a ControlPlane method as RtmlSystemError."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            plane: ControlPlane = args[0]  # type: ignore[assignment]
            raise plane._system_error(method.__name__, exc) from exc

    return wrapper


class ControlPlane:
    """Client for the cluster's Redis: nodes, jobs, functions, tasks, objects, actors, events.

    Thread-safe (redis-py pools connections). Every method raises
    :class:`RtmlSystemError` when Redis is unreachable or refuses the password.
    """

    def __init__(self, host: str, port: int, password: str,
                 namespace: str = DEFAULT_NAMESPACE) -> None:
        self.host = host
        self.port = port
        self.keys = Keys(namespace)
        self._client = redis.Redis(host=host, port=port, password=password,
                                   decode_responses=False, socket_timeout=10.0,
                                   socket_connect_timeout=5.0,
                                   retry=_NoAuthRetry(ExponentialBackoff(_BACKOFF_CAP,
                                                                         _BACKOFF_BASE),
                                                      _RETRIES))
        self._delete_if_equal = self._client.register_script(_DELETE_IF_EQUAL)
        self._write_tasks = self._client.register_script(_WRITE_TASKS)

    def __repr__(self) -> str:
        return f"ControlPlane({self.host}:{self.port}, namespace={self.keys.namespace!r})"

    def _system_error(self, op: str, exc: redis.RedisError) -> RtmlSystemError:
        where = f"Redis at {self.host}:{self.port}"
        if isinstance(exc, redis.AuthenticationError):
            return RtmlSystemError(f"{where} rejected the cluster password ({op}: {exc}); "
                                   f"connect with the password the cluster was started with")
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            return RtmlSystemError(f"cannot reach {where} ({op}: {exc}); check that the "
                                   f"head node is running and the address is right")
        return RtmlSystemError(f"{where} failed {op}: {exc!r}")

    # -- connection ---------------------------------------------------------------

    def ping(self) -> bool:
        """True if Redis answers, False if it cannot be reached.

        Raises:
            RtmlSystemError: Redis answered but refused the password.
        """
        try:
            return bool(self._client.ping())
        except redis.AuthenticationError as exc:
            raise self._system_error("ping", exc) from exc
        except (redis.ConnectionError, redis.TimeoutError):
            return False

    def close(self) -> None:
        """Close every pooled connection; the object must not be used afterwards."""
        self._client.close()

    # -- nodes --------------------------------------------------------------------

    @_redis_errors
    def put_node(self, node_id: bytes, info: dict[str, Any]) -> None:
        """Register (or re-register) a live node; ``info`` fields are merged in."""
        hex_id = node_id.hex()
        fields = {"NodeManagerAddress": info.get("address", ""),
                  "Resources": info.get("resources", {}),
                  **info, "NodeID": hex_id, "Alive": True, "RegisteredAt": time.time()}
        pipe = self._client.pipeline()
        pipe.hset(self.keys.node(hex_id), mapping=_pack(fields))  # type: ignore[arg-type]
        pipe.sadd(self.keys.nodes, hex_id)
        pipe.execute()

    @_redis_errors
    def heartbeat(self, node_id: bytes, available: dict[str, float],
                  pending_shapes: list[dict[str, Any]]) -> None:
        """Record a node's free resources, the shapes it cannot place, and the time."""
        hex_id = node_id.hex()
        fields = {"Available": available, "PendingShapes": pending_shapes,
                  "LastHeartbeat": time.time()}
        pipe = self._client.pipeline()
        pipe.hset(self.keys.node(hex_id), mapping=_pack(fields))  # type: ignore[arg-type]
        if pending_shapes:
            pipe.hset(self.keys.pending_demand, hex_id, _encoder.encode(pending_shapes))
        else:
            pipe.hdel(self.keys.pending_demand, hex_id)
        pipe.execute()

    @_redis_errors
    def mark_node_dead(self, node_id: bytes) -> None:
        """Record that a node is dead; its pending demand no longer counts."""
        hex_id = node_id.hex()
        fields = {"Alive": False, "DeathTime": time.time()}
        pipe = self._client.pipeline()
        pipe.hset(self.keys.node(hex_id), mapping=_pack(fields))  # type: ignore[arg-type]
        pipe.hdel(self.keys.pending_demand, hex_id)
        pipe.execute()

    @_redis_errors
    def list_nodes(self) -> list[dict[str, Any]]:
        """Every registered node, alive or dead, sorted by NodeID."""
        defaults: dict[str, Any] = {"Alive": False, "NodeManagerAddress": "", "Resources": {},
                                    "Available": {}, "PendingShapes": [],
                                    "LastHeartbeat": None}
        nodes = []
        for hex_id, record in self._hashes(self.keys.node, self._members(self.keys.nodes)):
            nodes.append({**defaults, **to_jsonable(record), "NodeID": hex_id})
        return sorted(nodes, key=lambda n: n["NodeID"])

    # -- jobs ---------------------------------------------------------------------

    @_redis_errors
    def put_job(self, job_id: bytes, info: dict[str, Any]) -> None:
        """Register a running job; ``info`` fields are merged in."""
        hex_id = job_id.hex()
        fields = {"StartTime": time.time(), **info, "JobID": hex_id, "IsDead": False}
        pipe = self._client.pipeline()
        pipe.hset(self.keys.job(hex_id), mapping=_pack(fields))  # type: ignore[arg-type]
        pipe.sadd(self.keys.jobs, hex_id)
        pipe.execute()

    @_redis_errors
    def finish_job(self, job_id: bytes) -> None:
        """Record that a job's driver has finished."""
        fields = {"IsDead": True, "EndTime": time.time()}
        self._client.hset(self.keys.job(job_id.hex()), mapping=_pack(fields))  # type: ignore[arg-type]

    @_redis_errors
    def list_jobs(self) -> list[dict[str, Any]]:
        """Every job, oldest first."""
        jobs = [{"IsDead": False, "StartTime": 0.0, **to_jsonable(record), "JobID": hex_id}
                for hex_id, record in self._hashes(self.keys.job, self._members(self.keys.jobs))]
        return sorted(jobs, key=lambda j: (j["StartTime"] or 0.0, j["JobID"]))

    # -- functions ----------------------------------------------------------------

    @_redis_errors
    def export_function(self, function_id: bytes, blob: bytes) -> None:
        """Store a pickled function once; later exports of the same id are no-ops."""
        self._client.set(self.keys.function(function_id.hex()), blob, nx=True)

    @_redis_errors
    def fetch_function(self, function_id: bytes) -> bytes | None:
        """The pickled function exported under ``function_id``, or None."""
        return self._client.get(self.keys.function(function_id.hex()))  # type: ignore[return-value]

    # -- tasks --------------------------------------------------------------------

    @_redis_errors
    def write_task_records(self, records: list[dict[str, Any]]) -> None:
        """Merge task records (each with a ``task_id``) into their hashes, one round trip.

        A record with ``submit_ts`` also indexes the task in the ``tasks`` sorted set.
        """
        if not records:
            return
        args: list[Any] = [self.keys.task("")]
        for record in records:
            submit_ts = record.get("submit_ts")
            args += (record["task_id"].hex(), "" if submit_ts is None else submit_ts,
                     len(record))
            for key, value in record.items():
                args += (key, _encoder.encode(value))
        self._write_tasks(keys=[self.keys.tasks], args=args)

    @_redis_errors
    def list_tasks(self, filters: dict[str, str] | None = None,
                   limit: int = 10000) -> list[dict[str, Any]]:
        """Up to ``limit`` most recently submitted tasks matching ``filters``, oldest first.

        A filter matches when the field's JSON-friendly value, as ``str``, equals it
        (ids as hex, e.g. ``{"job_id": job.hex(), "status": "FINISHED"}``).
        """
        found: list[dict[str, Any]] = []
        for chunk in self._newest_first(self.keys.tasks):
            for _, record in self._hashes(self.keys.task, chunk):
                task = to_jsonable(record)
                if _matches(task, filters):
                    found.append(task)
                    if len(found) >= limit:
                        return found[::-1]
        return found[::-1]

    def _newest_first(self, zset_key: str) -> Iterable[list[str]]:
        start = 0
        while True:
            members = self._client.zrevrange(zset_key, start, start + _SCAN_CHUNK - 1)
            if not members:
                return
            yield [m.decode() for m in members]  # type: ignore[union-attr]
            start += _SCAN_CHUNK

    # -- objects ------------------------------------------------------------------

    @_redis_errors
    def put_object(self, object_id: bytes, info: dict[str, Any]) -> None:
        """Create or merge into an object's record (owner, size, locations...)."""
        hex_id = object_id.hex()
        pipe = self._client.pipeline()
        pipe.hset(self.keys.object(hex_id),
                  mapping=_pack({**info, "object_id": hex_id}))  # type: ignore[arg-type]
        pipe.sadd(self.keys.objects, hex_id)
        pipe.execute()

    @_redis_errors
    def remove_objects(self, object_ids: list[bytes]) -> None:
        """Forget the records of freed objects."""
        if not object_ids:
            return
        hex_ids = [oid.hex() for oid in object_ids]
        pipe = self._client.pipeline()
        pipe.delete(*[self.keys.object(h) for h in hex_ids])
        pipe.srem(self.keys.objects, *hex_ids)
        pipe.execute()

    @_redis_errors
    def write_objects(self, puts: dict[bytes, dict[str, Any]], removes: list[bytes]) -> None:
        """Merge ``puts`` into their records and forget ``removes``, in one round trip.

        An id should not be in both; if it is, the removal is applied last.
        """
        if not puts and not removes:
            return
        pipe = self._client.pipeline(transaction=False)
        for object_id, info in puts.items():
            hex_id = object_id.hex()
            pipe.hset(self.keys.object(hex_id),
                      mapping=_pack({**info, "object_id": hex_id}))  # type: ignore[arg-type]
            pipe.sadd(self.keys.objects, hex_id)
        if removes:
            hex_ids = [oid.hex() for oid in removes]
            pipe.delete(*[self.keys.object(h) for h in hex_ids])
            pipe.srem(self.keys.objects, *hex_ids)
        pipe.execute()

    @_redis_errors
    def list_objects(self, limit: int = 10000) -> list[dict[str, Any]]:
        """Up to ``limit`` object records, in no particular order."""
        hex_ids: list[str] = []
        for member in self._client.sscan_iter(self.keys.objects, count=_SCAN_CHUNK):
            hex_ids.append(member.decode())
            if len(hex_ids) >= limit:
                break
        return [to_jsonable(record) for _, record in self._hashes(self.keys.object, hex_ids)]

    # -- actors -------------------------------------------------------------------

    @_redis_errors
    def put_actor(self, actor_id: bytes, info: dict[str, Any]) -> None:
        """Create or merge into an actor's record (spec, state, address, restarts...)."""
        hex_id = actor_id.hex()
        pipe = self._client.pipeline()
        pipe.hset(self.keys.actor(hex_id),
                  mapping=_pack({**info, "actor_id": hex_id}))  # type: ignore[arg-type]
        pipe.sadd(self.keys.actors, hex_id)
        pipe.execute()

    @_redis_errors
    def get_actor(self, actor_id: bytes) -> dict[str, Any] | None:
        """The actor's record with values as stored (bytes stay bytes), or None."""
        raw = self._client.hgetall(self.keys.actor(actor_id.hex()))
        return _unpack(raw) if raw else None  # type: ignore[arg-type]

    @_redis_errors
    def list_actors(self) -> list[dict[str, Any]]:
        """Every actor record, JSON-friendly, sorted by actor_id."""
        actors = [to_jsonable(record) for _, record in
                  self._hashes(self.keys.actor, self._members(self.keys.actors))]
        return sorted(actors, key=lambda a: a["actor_id"])

    @_redis_errors
    def set_named_actor(self, namespace: str, name: str, actor_id: bytes) -> bool:
        """Claim ``name`` in ``namespace`` for ``actor_id``; False if already taken."""
        return bool(self._client.set(self.keys.named_actor(namespace, name), actor_id, nx=True))

    @_redis_errors
    def get_named_actor(self, namespace: str, name: str) -> bytes | None:
        """The id of the actor holding ``name`` in ``namespace``, or None."""
        return self._client.get(self.keys.named_actor(namespace, name))  # type: ignore[return-value]

    @_redis_errors
    def delete_named_actor(self, namespace: str, name: str, actor_id: bytes) -> None:
        """Release ``name`` only if it still maps to ``actor_id`` (atomic)."""
        self._delete_if_equal(keys=[self.keys.named_actor(namespace, name)], args=[actor_id])

    # -- events -------------------------------------------------------------------

    @_redis_errors
    def append_events(self, events: list[dict[str, Any]]) -> None:
        """Append events to the stream (trimmed to about 100,000 entries), one round trip."""
        if not events:
            return
        pipe = self._client.pipeline(transaction=False)
        for event in events:
            pipe.xadd(self.keys.events, {_EVENT_FIELD: _encoder.encode(event)},
                      maxlen=EVENTS_MAXLEN, approximate=True)
        pipe.execute()

    @_redis_errors
    def read_events(self, job_id: bytes | None = None,
                    count: int = 100000) -> list[dict[str, Any]]:
        """The oldest ``count`` events in append order, optionally only one job's."""
        entries: list[tuple[bytes, dict[bytes, bytes]]]
        entries = self._client.xrange(self.keys.events, count=count)  # type: ignore[assignment]
        wanted = job_id.hex() if job_id is not None else None
        events = []
        for _, fields in entries:
            event = to_jsonable(_decoder.decode(fields[_EVENT_FIELD]))
            if wanted is None or event.get("job_id") == wanted:
                events.append(event)
        return events

    # -- helpers ------------------------------------------------------------------

    def _members(self, set_key: str) -> list[str]:
        return [m.decode() for m in self._client.smembers(set_key)]  # type: ignore[union-attr]

    def _hashes(self, key_of: Callable[[str], str],
                hex_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
        """(hex id, decoded hash) for each id whose hash exists, one round trip."""
        if not hex_ids:
            return []
        pipe = self._client.pipeline(transaction=False)
        for hex_id in hex_ids:
            pipe.hgetall(key_of(hex_id))
        return [(h, _unpack(raw)) for h, raw in zip(hex_ids, pipe.execute(), strict=True) if raw]


def _matches(record: dict[str, Any], filters: dict[str, str] | None) -> bool:
    if not filters:
        return True
    return all(k in record and str(record[k]) == v for k, v in filters.items())
