"""The control plane's tables: typed reads and writes over one Redis connection.

::

    head service / node managers / drivers
        |  put_node, heartbeat, put_job, export_function, put_actor, ...
        v
    ControlPlane --(RespClient, pipelined)--> Redis: hashes, sets, a stream
        ^                                        (key names: keys.py)
        |  write_task_records, append_events  (batched off the hot path)
    BatchedWriter (writer.py)

Records are Redis hashes whose fields are ``str`` names and whose values are
msgpack-encoded (so ints, floats, bools, lists, dicts and bytes round-trip and a
write merges field by field). ``get_*`` returns values as stored; ``list_*``
returns JSON-friendly dicts in which every ``bytes`` value is a hex string.

Every Redis failure surfaces as :class:`rtml.exceptions.RtmlSystemError`, whose
``__cause__`` is the :mod:`rtml.control_plane.resp` error, so no caller outside this
package needs to know how Redis is spoken to.
"""

from __future__ import annotations

import functools
import os
import ssl
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import msgspec

from rtml.control_plane.address import RedisAddress
from rtml.control_plane.keys import DEFAULT_NAMESPACE, Keys
from rtml.control_plane.resp import (
    Arg,
    AuthError,
    RespBaseError,
    RespClient,
    RespConnectionError,
    RespError,
    Script,
)
from rtml.exceptions import RtmlSystemError
from rtml.ids import ActorID, JobID, NodeID, ObjectID, PlacementGroupID

COMMANDS = ("PING", "INFO", "GET", "SET", "DEL", "EXISTS", "HSET", "HDEL", "HGETALL", "HSCAN",
            "SADD", "SREM", "SMEMBERS", "SSCAN", "ZADD", "ZREM", "ZRANGE", "XADD", "XRANGE",
            "MULTI", "EXEC", "EVALSHA", "EVAL")
"""Every command this module sends (those of ``_DELETE_IF_EQUAL`` too): all that rtml's
user may run on rtml's own Redis."""
EVENTS_MAXLEN = 100_000
_EVENT_FIELD = b"e"
_EVENTS_MAXLEN_ARGS: tuple[Arg, ...] = ("MAXLEN", "~", EVENTS_MAXLEN)
_SCAN_CHUNK = 1000
_FINAL = frozenset({"FINISHED", "FAILED"})  # task statuses no later PENDING undoes

SUBMITTED = 0
"""Tag of a compact task record written as a task is pushed (status PENDING, attempt 0)."""
RAN = 2
"""Tag of a compact task record written once a task ran and FINISHED; its phases are
microseconds from its start (``_PHASES``), which pack in a byte or two where a time
takes nine. (Tag 1 was an earlier layout with the status a field: readers skip it.)"""
RAN_FAILED = 3
"""As ``RAN``, for a task that FAILED by its code."""
_RAN_FIELDS = ("task_id", "attempt", "start_ts", "worker_pid", "node_id", "end_us", "args_us",
               "ran_us", "call")
_COMPACT: dict[int, tuple[tuple[str, ...], dict[str, Any]]] = {
    SUBMITTED: (("task_id", "name", "job_id", "owner_id", "function_id", "submit_ts"),
                {"status": "PENDING", "attempt": 0}),
    RAN: (_RAN_FIELDS, {"status": "FINISHED"}),
    RAN_FAILED: (_RAN_FIELDS, {"status": "FAILED"}),
}
"""tag -> (the fields that follow it, in order; the fields it implies)."""
_PHASES = (("end_us", "end_ts"), ("args_us", "args_ts"), ("ran_us", "run_end_ts"))
"""A ran record's phases as written (us from ``start_ts``; -1: not reached) and as read
(times; 0.0: not reached)."""
TaskRecordData = dict[str, Any] | tuple[Any, ...]
"""A task record as written: a dict, or a compact tuple (see ``write_task_records``)."""

# Deletes KEYS[1] only while it still holds ARGV[1]: compare-and-delete in one step.
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Transient connection errors are retried briefly (2 ms doubling, ~0.25 s in all); callers
# own longer outages. A wrong password is never retried: it will not get better; nor is a
# request that timed out (a hung Redis: each try would wait the whole timeout again). A
# write that is not idempotent is retried only if it surely never reached Redis.
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


def _hset(key: str, info: dict[str, Any]) -> tuple[Arg, ...]:
    """``HSET key field value ...`` with every value msgpack-encoded."""
    args: list[Arg] = ["HSET", key]
    for k, v in info.items():
        args += (str(k), _encoder.encode(v))
    return tuple(args)


def _unpack(raw: list[bytes]) -> dict[str, Any]:
    """An HGETALL reply (field, value, field, value, ...) as a decoded dict."""
    pairs = iter(raw)
    return {k.decode(): _decoder.decode(v) for k, v in zip(pairs, pairs, strict=True)}


LOCATION_PREFIX = "loc:"


def location_field(node_id: NodeID) -> str:
    """The object-record field that says ``node_id`` holds a copy (value: its state)."""
    return LOCATION_PREFIX + node_id.hex()


def _with_locations(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its per-node location fields folded into ``locations`` (hex ids)
    and ``location_states`` (hex id -> SEALED or SPILLED)."""
    states = {k[len(LOCATION_PREFIX):]: v for k, v in record.items()
              if k.startswith(LOCATION_PREFIX)}
    out = {k: v for k, v in record.items() if not k.startswith(LOCATION_PREFIX)}
    if states:
        out["locations"] = sorted(states)
        out["location_states"] = dict(sorted(states.items()))
    return out


def to_jsonable(value: Any) -> Any:
    """``value`` with bytes as hex strings, tuples as lists and dict keys as str."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def _guarded(method: Callable[P, R], idempotent: bool) -> Callable[P, R]:
    """``method`` retrying connection errors briefly and raising RtmlSystemError."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        plane: ControlPlane = args[0]  # type: ignore[assignment]
        delay = _BACKOFF_BASE
        for attempt in range(_RETRIES + 1):
            try:
                return method(*args, **kwargs)
            except RespConnectionError as exc:
                if (attempt == _RETRIES or exc.timed_out
                        or (exc.maybe_applied and not idempotent)):
                    raise plane._system_error(method.__name__, exc) from exc
            except RespBaseError as exc:  # AuthError, RespError: retrying will not help
                raise plane._system_error(method.__name__, exc) from exc
            time.sleep(delay)
            delay = min(delay * 2, _BACKOFF_CAP)
        raise AssertionError("unreachable")

    return wrapper


def unreachable(exc: BaseException) -> bool:
    """Whether a ControlPlane error says Redis could not be reached (it may be back soon:
    restarted by the head's supervisor), rather than that it refused the request."""
    return isinstance(exc.__cause__, RespConnectionError)


def timed_out(exc: BaseException) -> bool:
    """Whether a ControlPlane error says Redis took the request but did not answer in
    time (hung, out of reach, or not a Redis)."""
    cause = exc.__cause__
    return isinstance(cause, RespConnectionError) and cause.timed_out


def login_refused(exc: BaseException) -> bool:
    """Whether a ControlPlane error says Redis refused the user or password."""
    return isinstance(exc.__cause__, AuthError)


def _redis_errors(method: Callable[P, R]) -> Callable[P, R]:
    """An idempotent ControlPlane operation: connection errors retried, then RtmlSystemError."""
    return _guarded(method, idempotent=True)


def _redis_errors_no_resend(method: Callable[P, R]) -> Callable[P, R]:
    """Like :func:`_redis_errors`, but never resent once it may have reached Redis."""
    return _guarded(method, idempotent=False)


class ControlPlane:
    """Client for the cluster's Redis: nodes, jobs, functions, tasks, objects, actors, events.

    Thread-safe (one connection, one request/response exchange at a time). Every method raises
    :class:`RtmlSystemError` when Redis is unreachable or refuses the password.
    """

    def __init__(self, host: str, port: int, password: str,
                 namespace: str = DEFAULT_NAMESPACE, user: str = "",
                 tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.keys = Keys(namespace)
        self._client = RespClient(host, port, password, timeout=10.0, connect_timeout=5.0,
                                  username=user, tls=tls)
        self._delete_if_equal = Script(self._client, _DELETE_IF_EQUAL)

    @classmethod
    def at(cls, address: RedisAddress, token: str) -> ControlPlane:
        """The control plane at ``address``, logging in as ``address.login`` says; over
        TLS for a rediss:// one (RtmlSystemError names a TLS file that cannot be used)."""
        user, password = address.login(token)
        return cls(address.host, address.port, password, user=user, tls=address.ssl_context())

    def __repr__(self) -> str:
        return f"ControlPlane({self.host}:{self.port}, namespace={self.keys.namespace!r})"

    def _system_error(self, op: str, exc: RespBaseError) -> RtmlSystemError:
        where = f"Redis at {self.host}:{self.port}"
        if isinstance(exc, AuthError):
            return RtmlSystemError(f"{where} rejected the login ({op}: {exc}); connect with "
                                   f"the token (or Redis user and password) the cluster was "
                                   f"started with")
        if isinstance(exc, RespConnectionError) and exc.timed_out:
            return RtmlSystemError(f"{where} did not answer in time ({op}: {exc}): is it "
                                   f"hung (stopped, out of memory), out of reach, or not a "
                                   f"Redis?")
        if isinstance(exc, RespConnectionError):
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
            return self.check()
        except RtmlSystemError as exc:
            if login_refused(exc):
                raise
            return False

    @_redis_errors
    def memory_used(self) -> int:
        """The bytes Redis uses for its data (INFO memory: used_memory)."""
        info: bytes = self._client.execute("INFO", "memory")
        for line in info.decode().splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":", 1)[1])
        raise RespError("INFO memory has no used_memory line")

    @_redis_errors
    def check(self) -> bool:
        """True if Redis answers; RtmlSystemError (its cause the client's error) if it
        cannot be reached, times out, or refuses the login."""
        return bool(self._client.execute("PING"))

    def close(self) -> None:
        """Close the connection; the object must not be used afterwards."""
        self._client.close()

    # -- nodes --------------------------------------------------------------------

    @_redis_errors
    def put_node(self, node_id: NodeID, info: dict[str, Any]) -> None:
        """Register (or re-register) a live node; ``info`` fields are merged in."""
        hex_id = node_id.hex()
        fields = {"NodeManagerAddress": info.get("address", ""),
                  "Resources": info.get("resources", {}),
                  **info, "NodeID": hex_id, "Alive": True, "RegisteredAt": time.time()}
        self._transaction([_hset(self.keys.node(hex_id), fields),
                           ("SADD", self.keys.nodes, hex_id)])

    @_redis_errors
    def heartbeat(self, node_id: NodeID, available: dict[str, float],
                  pending_shapes: list[dict[str, Any]]) -> None:
        """Record a node's free resources, the shapes it cannot place, and the time."""
        hex_id = node_id.hex()
        fields = {"Available": available, "PendingShapes": pending_shapes,
                  "LastHeartbeat": time.time()}
        demand: tuple[Arg, ...]
        if pending_shapes:
            demand = ("HSET", self.keys.pending_demand, hex_id, _encoder.encode(pending_shapes))
        else:
            demand = ("HDEL", self.keys.pending_demand, hex_id)
        self._transaction([_hset(self.keys.node(hex_id), fields), demand])

    @_redis_errors
    def mark_node_dead(self, node_id: NodeID) -> None:
        """Record that a node is dead; its pending demand no longer counts."""
        hex_id = node_id.hex()
        fields = {"Alive": False, "DeathTime": time.time()}
        self._transaction([_hset(self.keys.node(hex_id), fields),
                           ("HDEL", self.keys.pending_demand, hex_id)])

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
    def put_job(self, job_id: JobID, info: dict[str, Any]) -> None:
        """Register a running job; ``info`` fields are merged in."""
        hex_id = job_id.hex()
        fields = {"StartTime": time.time(), **info, "JobID": hex_id, "IsDead": False}
        self._transaction([_hset(self.keys.job(hex_id), fields),
                           ("SADD", self.keys.jobs, hex_id)])

    @_redis_errors
    def finish_job(self, job_id: JobID) -> None:
        """Record that a job's driver has finished (exited, or died)."""
        now = time.time()
        fields = {"IsDead": True, "EndTime": now, "status": "FINISHED", "end_ts": now}
        self._client.execute(*_hset(self.keys.job(job_id.hex()), fields))

    @_redis_errors
    def list_jobs(self) -> list[dict[str, Any]]:
        """Every job, oldest first."""
        jobs = [{"IsDead": False, "StartTime": 0.0, **to_jsonable(record), "JobID": hex_id}
                for hex_id, record in self._hashes(self.keys.job, self._members(self.keys.jobs))]
        return sorted(jobs, key=lambda j: (j["StartTime"] or 0.0, j["JobID"]))

    # -- submitted jobs (rtml job submit) --------------------------------------------

    @_redis_errors
    def put_submission(self, submission_id: str, info: dict[str, Any]) -> None:
        """Create or merge into a submitted job's record."""
        self._transaction([_hset(self.keys.submission(submission_id),
                                 {**info, "submission_id": submission_id}),
                           ("SADD", self.keys.submissions, submission_id)])

    @_redis_errors
    def list_submissions(self) -> list[dict[str, Any]]:
        """Every submitted job's record, values as stored, oldest first."""
        records = [record for _, record in self._hashes(
            self.keys.submission, self._members(self.keys.submissions))]
        return sorted(records, key=lambda r: (r.get("start_time", 0), r["submission_id"]))

    @_redis_errors
    def delete_submission(self, submission_id: str) -> None:
        """Forget a submitted job."""
        self._transaction([("DEL", self.keys.submission(submission_id)),
                           ("SREM", self.keys.submissions, submission_id)])

    # -- placement groups -------------------------------------------------------

    @_redis_errors
    def put_placement_group(self, pg_id: PlacementGroupID, info: dict[str, Any]) -> None:
        """Create or overwrite a placement group's record (spec, state, nodes)."""
        hex_id = pg_id.hex()
        self._transaction([("DEL", self.keys.placement_group(hex_id)),
                           _hset(self.keys.placement_group(hex_id), info),
                           ("SADD", self.keys.placement_groups, hex_id)])

    @_redis_errors
    def delete_placement_group(self, pg_id: PlacementGroupID) -> None:
        """Forget a removed placement group."""
        hex_id = pg_id.hex()
        self._transaction([("DEL", self.keys.placement_group(hex_id)),
                           ("SREM", self.keys.placement_groups, hex_id)])

    @_redis_errors
    def placement_group_records(self) -> list[dict[str, Any]]:
        """Every recorded placement group, values as stored (what a new head restores)."""
        return [record for _, record in self._hashes(
            self.keys.placement_group, self._members(self.keys.placement_groups))]

    # -- functions ----------------------------------------------------------------

    @_redis_errors
    def export_function(self, function_id: bytes, blob: bytes) -> None:
        """Store a pickled function once; later exports of the same id are no-ops."""
        self._client.execute("SET", self.keys.function(function_id.hex()), blob, "NX")

    @_redis_errors
    def fetch_function(self, function_id: bytes) -> bytes | None:
        """The pickled function exported under ``function_id``, or None."""
        reply: bytes | None = self._client.execute("GET", self.keys.function(function_id.hex()))
        return reply

    # -- runtime_env packages -----------------------------------------------------

    @_redis_errors
    def has_package(self, digest_hex: str) -> bool:
        """Whether a runtime_env package of that hash is stored (checked before one is
        zipped and sent)."""
        return bool(self._client.execute("EXISTS", self.keys.package(digest_hex)))

    @_redis_errors
    def put_package(self, digest_hex: str, data: bytes) -> None:
        """Store a runtime_env package once; a later put of the same hash is a no-op."""
        self._client.execute("SET", self.keys.package(digest_hex), data, "NX")

    @_redis_errors
    def fetch_package(self, digest_hex: str) -> bytes | None:
        """The package stored under ``digest_hex`` (a zip), or None."""
        reply: bytes | None = self._client.execute("GET", self.keys.package(digest_hex))
        return reply

    # -- tasks --------------------------------------------------------------------

    @_redis_errors
    def write_task_records(self, records: list[TaskRecordData], batch_id: bytes = b"") -> None:
        """Add a batch of task records (each with a ``task_id``) to the lineage table.

        A record is a dict, or for the two written per task on the hot path a tuple: a
        tag (``SUBMITTED``, ``RAN`` or ``RAN_FAILED``) and its fields in order (see
        ``_COMPACT``), which costs its writer a quarter of a dict's time to build and pack.

        The table is one hash with one field per batch: ``batch_id`` (a writer's own
        prefix and a big-endian sequence number, so that its batches sort in the order
        written; by default the time, then random bytes), holding the batch's records
        as one msgpack list. Records of a task merge when read, later over earlier.
        One field per batch keeps a task's cost to its writer at ~1 us (a field per
        record cost ~5: packing the command dominated) and to Redis at less.
        """
        if records:
            batch_id = batch_id or time.time_ns().to_bytes(8, "big") + os.urandom(8)
            member = batch_id + len(records).to_bytes(4, "big")  # (see trim_task_records)
            self._client.pipeline([
                ("HSET", self.keys.tasks, batch_id, _encoder.encode(records)),
                ("ZADD", self.keys.task_batches, time.time(), member)])

    @_redis_errors
    def trim_task_records(self, keep: int) -> int:
        """Remove the oldest batches of task records while ``keep`` records or more are
        left (whole batches: up to one batch more is kept); returns how many were
        removed. Nothing rebuilding objects needs lives here: an owner keeps its own
        lineage."""
        members: list[bytes] = self._client.execute("ZRANGE", self.keys.task_batches, 0, -1)
        counts = [int.from_bytes(member[-4:], "big") for member in members]
        left, removed = sum(counts), 0
        while removed < len(members) and left - counts[removed] >= keep:
            left -= counts[removed]
            removed += 1
        if removed:
            gone = members[:removed]
            self._client.pipeline([("HDEL", self.keys.tasks, *[m[:-4] for m in gone]),
                                   ("ZREM", self.keys.task_batches, *gone)])
        return sum(counts[:removed])

    @_redis_errors
    def list_tasks(self, filters: dict[str, str] | None = None,
                   limit: int = 10000) -> list[dict[str, Any]]:
        """Up to ``limit`` most recently submitted tasks matching ``filters``, oldest first;
        a task whose submission record was trimmed is not listed (its outcome goes later).

        A filter matches when the field's JSON-friendly value, as ``str``, equals it
        (ids as hex, e.g. ``{"job_id": job.hex(), "status": "FINISHED"}``). A record's
        call (``task_call``) is left out; ``actor_id`` says whose method it ran.
        """
        tasks = []
        for record in self._merged_tasks().values():
            if "name" not in record:
                continue  # its submission was trimmed: so is the task, for its readers
            call = record.pop("call", None)
            if isinstance(call, bytes):  # an actor call's: its actor
                record["actor_id"] = call
            task = to_jsonable(record)
            if _matches(task, filters):
                tasks.append(task)
        tasks.sort(key=lambda task: task.get("submit_ts", 0.0))
        return tasks[-limit:] if limit > 0 else []

    @_redis_errors
    def task_call(self, task_id: bytes) -> tuple[dict[str, Any], Any]:
        """The task's record (JSON-friendly) and its call as written
        (``rtml.core.kept_calls``: a list, bytes as bytes; an actor call's actor id), or
        None for a task whose call is not recorded (it has not run). Raises KeyError if no
        such task is recorded."""
        record = self._merged_tasks().get(task_id)
        if record is None or "name" not in record:
            raise KeyError(task_id.hex())
        call = record.pop("call", None)
        return to_jsonable(record), call

    def _merged_tasks(self) -> dict[bytes, dict[str, Any]]:
        """Each task's records merged into one, by task id: a final status kept over a
        PENDING read out of order."""
        tasks: dict[bytes, dict[str, Any]] = {}
        for record in self._task_records():
            task = tasks.setdefault(record["task_id"], {})
            status = task.get("status")
            task.update(record)
            if status in _FINAL and record.get("status") not in _FINAL:
                task["status"] = status  # another writer's PENDING, read out of order
        return tasks

    @_redis_errors
    def task_history(self, task_id: bytes) -> list[dict[str, Any]]:
        """Every record of one task as written, unmerged, in the order of their batches
        (its submission, each attempt's outcome and failure): what shows its attempts."""
        return [to_jsonable({k: v for k, v in record.items() if k != "call"})
                for record in self._task_records() if record["task_id"] == task_id]

    def _task_records(self) -> list[dict[str, Any]]:
        """Every task record (compact ones expanded), in the order of their batches."""
        batches: list[tuple[bytes, bytes]] = []
        cursor: Arg = 0
        while True:
            cursor, flat = self._client.execute("HSCAN", self.keys.tasks, cursor,
                                                "COUNT", _SCAN_CHUNK)
            pairs = iter(flat)
            batches += zip(pairs, pairs, strict=True)
            if cursor == b"0":
                break
        records = []
        for _, batch in sorted(batches):
            for stored in _decoder.decode(batch):
                record = _expand(stored)
                if record is not None and "task_id" in record:  # else nothing to merge into
                    records.append(record)
        return records

    # -- objects ------------------------------------------------------------------

    @_redis_errors
    def put_object(self, object_id: ObjectID, info: dict[str, Any]) -> None:
        """Create or merge into an object's record (owner, size, locations...)."""
        hex_id = object_id.hex()
        self._transaction([_hset(self.keys.object(hex_id), {**info, "object_id": hex_id}),
                           ("SADD", self.keys.objects, hex_id)])

    @_redis_errors
    def remove_objects(self, object_ids: list[ObjectID]) -> None:
        """Forget the records of freed objects."""
        if not object_ids:
            return
        hex_ids = [oid.hex() for oid in object_ids]
        self._transaction([("DEL", *[self.keys.object(h) for h in hex_ids]),
                           ("SREM", self.keys.objects, *hex_ids)])

    @_redis_errors
    def write_objects(self, puts: dict[ObjectID, dict[str, Any]], removes: list[ObjectID],
                      drop_fields: dict[ObjectID, list[str]] | None = None) -> None:
        """Merge ``puts`` into their records, delete ``drop_fields`` from them and forget
        ``removes``, in one round trip.

        A node's copy of an object is the record field ``location_field(node_id)``
        (its value: SEALED or SPILLED); records read back list them as ``locations``.
        An id should not be in both ``puts`` and ``removes``; if it is, the removal
        is applied last.
        """
        if not puts and not removes and not drop_fields:
            return
        commands: list[tuple[Arg, ...]] = []
        for object_id, info in puts.items():
            hex_id = object_id.hex()
            commands.append(_hset(self.keys.object(hex_id), {**info, "object_id": hex_id}))
            commands.append(("SADD", self.keys.objects, hex_id))
        for object_id, fields in (drop_fields or {}).items():
            commands.append(("HDEL", self.keys.object(object_id.hex()), *fields))
        if removes:
            hex_ids = [oid.hex() for oid in removes]
            commands.append(("DEL", *[self.keys.object(h) for h in hex_ids]))
            commands.append(("SREM", self.keys.objects, *hex_ids))
        self._client.pipeline(commands)

    @_redis_errors
    def object_locations(self, object_ids: list[ObjectID]) -> dict[ObjectID, list[NodeID]]:
        """The nodes holding a copy of each object that has a record (one round trip)."""
        records = self._hashes(self.keys.object, [oid.hex() for oid in object_ids])
        return {ObjectID(bytes.fromhex(hex_id)):
                [NodeID(bytes.fromhex(k[len(LOCATION_PREFIX):]))
                 for k in record if k.startswith(LOCATION_PREFIX)]
                for hex_id, record in records}

    @_redis_errors
    def list_objects(self, limit: int = 10000) -> list[dict[str, Any]]:
        """Up to ``limit`` object records, in no particular order."""
        hex_ids: list[str] = []
        cursor: bytes = b"0"
        while len(hex_ids) < limit:
            cursor, members = self._client.execute("SSCAN", self.keys.objects, cursor,
                                                   "COUNT", _SCAN_CHUNK)
            hex_ids += [m.decode() for m in members[:limit - len(hex_ids)]]
            if cursor == b"0":
                break
        return [to_jsonable(_with_locations(record))
                for _, record in self._hashes(self.keys.object, hex_ids)]

    # -- actors -------------------------------------------------------------------

    @_redis_errors
    def put_actor(self, actor_id: ActorID, info: dict[str, Any]) -> None:
        """Create or merge into an actor's record (spec, state, address, restarts...)."""
        hex_id = actor_id.hex()
        self._transaction([_hset(self.keys.actor(hex_id), {**info, "actor_id": hex_id}),
                           ("SADD", self.keys.actors, hex_id)])

    @_redis_errors
    def get_actor(self, actor_id: ActorID) -> dict[str, Any] | None:
        """The actor's record with values as stored (bytes stay bytes), or None."""
        raw = self._client.execute("HGETALL", self.keys.actor(actor_id.hex()))
        return _unpack(raw) if raw else None

    @_redis_errors
    def list_actors(self) -> list[dict[str, Any]]:
        """Every actor record, JSON-friendly, sorted by actor_id."""
        actors = [to_jsonable(record) for _, record in
                  self._hashes(self.keys.actor, self._members(self.keys.actors))]
        return sorted(actors, key=lambda a: a["actor_id"])

    @_redis_errors
    def actor_records(self) -> list[dict[str, Any]]:
        """Every actor record with values as stored (bytes stay bytes): what a head that
        restarted rebuilds its actor directory from."""
        return [record for _, record in
                self._hashes(self.keys.actor, self._members(self.keys.actors))]

    @_redis_errors_no_resend  # a resent SET NX that had succeeded would answer "taken"
    def set_named_actor(self, namespace: str, name: str, actor_id: ActorID) -> bool:
        """Claim ``name`` in ``namespace`` for ``actor_id``; False if already taken."""
        reply = self._client.execute("SET", self.keys.named_actor(namespace, name), actor_id,
                                     "NX", idempotent=False)
        return reply is not None

    @_redis_errors
    def get_named_actor(self, namespace: str, name: str) -> ActorID | None:
        """The id of the actor holding ``name`` in ``namespace``, or None."""
        reply: bytes | None = self._client.execute("GET", self.keys.named_actor(namespace, name))
        return None if reply is None else ActorID(reply)

    @_redis_errors
    def delete_named_actor(self, namespace: str, name: str, actor_id: ActorID) -> None:
        """Release ``name`` only if it still maps to ``actor_id`` (atomic)."""
        self._delete_if_equal(keys=[self.keys.named_actor(namespace, name)], args=[actor_id])

    # -- events -------------------------------------------------------------------

    @_redis_errors_no_resend  # a resent batch would duplicate events
    def append_events(self, events: list[dict[str, Any]]) -> None:
        """Append events to the stream (trimmed to about 100,000 entries), one round trip."""
        if not events:
            return
        key = self.keys.events
        self._client.pipeline([("XADD", key, *_EVENTS_MAXLEN_ARGS, "*", _EVENT_FIELD,
                                _encoder.encode(event)) for event in events])

    @_redis_errors
    def read_events(self, job_id: JobID | None = None,
                    count: int = 100000) -> list[dict[str, Any]]:
        """The oldest ``count`` events in append order, optionally only one job's."""
        entries: list[list[Any]]  # [entry id, [field, value, ...]]
        entries = self._client.execute("XRANGE", self.keys.events, "-", "+", "COUNT", count)
        wanted = job_id.hex() if job_id is not None else None
        events = []
        for _, flat in entries:
            pairs = iter(flat)
            fields = dict(zip(pairs, pairs, strict=True))
            event = to_jsonable(_decoder.decode(fields[_EVENT_FIELD]))
            if wanted is None or event.get("job_id") == wanted:
                events.append(event)
        return events

    # -- the dashboard and the head's metrics ---------------------------------------

    @_redis_errors
    def set_dashboard_url(self, url: str) -> None:
        """Record where the cluster's dashboard listens."""
        self._client.execute("SET", self.keys.dashboard, url)

    @_redis_errors
    def dashboard_url(self) -> str:
        """Where the cluster's dashboard listens; "" if it runs none."""
        reply: bytes | None = self._client.execute("GET", self.keys.dashboard)
        return reply.decode() if reply else ""

    @_redis_errors
    def set_head_metrics_address(self, address: str) -> None:
        """Record where the head service serves /metrics ("": it serves none, so an
        earlier head's address is not shown as if it still served)."""
        if address:
            self._client.execute("SET", self.keys.head_metrics, address)
        else:
            self._client.execute("DEL", self.keys.head_metrics)

    @_redis_errors
    def head_metrics_address(self) -> str:
        """host:port of the head service's /metrics; "" if it serves none."""
        reply: bytes | None = self._client.execute("GET", self.keys.head_metrics)
        return reply.decode() if reply else ""

    # -- helpers ------------------------------------------------------------------

    def _members(self, set_key: str) -> list[str]:
        return [m.decode() for m in self._client.execute("SMEMBERS", set_key)]

    def _hashes(self, key_of: Callable[[str], str],
                hex_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
        """(hex id, decoded hash) for each id whose hash exists, one round trip."""
        if not hex_ids:
            return []
        replies = self._client.pipeline([("HGETALL", key_of(h)) for h in hex_ids])
        return [(h, _unpack(raw)) for h, raw in zip(hex_ids, replies, strict=True) if raw]

    def _transaction(self, commands: list[tuple[Arg, ...]]) -> list[Any]:
        """Run ``commands`` atomically (MULTI ... EXEC) in one round trip; their replies."""
        replies = self._client.pipeline([("MULTI",), *commands, ("EXEC",)])
        results: list[Any] = replies[-1]
        for result in results:
            if isinstance(result, RespError):
                raise result
        return results


def _expand(stored: Any) -> dict[str, Any] | None:
    """A stored task record as a dict (a compact one expanded, its phases as times);
    None if it is neither."""
    if isinstance(stored, dict):
        return stored
    if isinstance(stored, list) and stored and stored[0] in _COMPACT:
        fields, implied = _COMPACT[stored[0]]
        if len(stored) == len(fields) + 1:
            record = {**implied, **dict(zip(fields, stored[1:], strict=True))}
            if fields is _RAN_FIELDS:
                start = record["start_ts"]
                for written, read in _PHASES:
                    us = record.pop(written)
                    record[read] = start + us / 1e6 if us >= 0 else 0.0
            return record
    return None


def _matches(record: dict[str, Any], filters: dict[str, str] | None) -> bool:
    if not filters:
        return True
    return all(k in record and str(record[k]) == v for k, v in filters.items())
