"""The public calls of rtml that use the connected runtime (re-exported by
``rtml/__init__.py``); ``init`` and ``shutdown`` are :mod:`rtml.driver`'s."""

from __future__ import annotations

import json
import logging
from itertools import repeat
from operator import attrgetter
from typing import Any

from rtml import cluster, driver  # noqa: F401 - driver: a call before init() starts it
from rtml.control_plane import chrome_trace
from rtml.core import context, current
from rtml.core.actors import ActorClass, ActorHandle, handle_of
from rtml.core.generators import ObjectRefGenerator
from rtml.core.object_ref import ObjectRef
from rtml.core.progress import progress_label
from rtml.core.remote_function import RemoteFunction
from rtml.core.runtime import ClientRuntime
from rtml.core.runtime_context import RuntimeContext, gpu_ids
from rtml.ids import NO_ACTOR
from rtml.rpc import messages as m

log = logging.getLogger(__name__)

_ID = attrgetter("id")  # an ObjectRef's id, at C speed over many refs


def remote(*args: Any, **options: Any) -> Any:
    """``@remote`` or ``@remote(**options)`` on a function or a class."""
    if len(args) == 1 and not options and callable(args[0]):
        return _make_remote(args[0], {})
    if args:
        raise TypeError("use @rtml.remote or @rtml.remote(num_cpus=..., ...)")
    return lambda target: _make_remote(target, options)


def _make_remote(target: Any, options: dict[str, Any]) -> Any:
    if isinstance(target, type):
        return ActorClass(target, options)
    if callable(target):
        return RemoteFunction(target, options)
    raise TypeError(f"@rtml.remote needs a function or a class, got {target!r}")


def _as_refs(value: Any, what: str) -> tuple[list[ObjectRef], bool]:
    if isinstance(value, ObjectRef):
        return [value], True
    if isinstance(value, (list, tuple)) and all(map(isinstance, value, repeat(ObjectRef))):
        return list(value), False
    raise TypeError(f"{what} takes an ObjectRef or a list of ObjectRefs, got "
                    f"{type(value).__name__}; only the result of .remote() or put() can be "
                    f"passed")


def _seconds(timeout: float | None, what: str) -> float | None:
    """``timeout`` checked, as a float (an int or a numpy number is one to the user, not to
    the compiled runtime, which checks its argument types)."""
    if timeout is None:
        return None
    if not timeout >= 0:
        raise ValueError(f"{what} timeout must be None (wait forever) or >= 0 seconds, got "
                         f"{timeout!r}")
    return float(timeout)


def get(refs: Any, *, timeout: float | None = None, progress: bool | str = False) -> Any:
    """Block for the value(s) of ``refs``; raises the task's error or GetTimeoutError.

    ``progress``: True (or a label) shows a bar of the refs ready so far (tqdm)."""
    rt = current.require_runtime()
    ref_list, single = _as_refs(refs, "get()")
    label = progress_label(progress, "get")
    seconds = None if timeout is None else _seconds(timeout, "get()")
    if not label:
        values = rt.get(ref_list, seconds)
        return values[0] if single else values
    end = rt.show_progress(ref_list, label)
    try:
        values = rt.get(ref_list, seconds)
    finally:
        end()
    return values[0] if single else values


def put(value: Any) -> ObjectRef:
    """Store ``value`` in the cluster; returns its ref."""
    return current.require_runtime().put(value)


def wait(refs: list[ObjectRef], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True, progress: bool | str = False
         ) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """Return ``(ready, not_ready)``: the first ``num_returns`` ready refs, in input order.

    With ``fetch_local`` (the default, as in Ray) a ref counts as ready once its value
    is on this node: objects held by other nodes are pulled here meanwhile.
    ``progress``: True (or a label) shows a bar of the refs ready so far (tqdm).
    """
    rt = current.require_runtime()
    if isinstance(refs, ObjectRef) or not isinstance(refs, (list, tuple)):
        raise TypeError(f"wait() takes a list of ObjectRefs, got {type(refs).__name__}")
    ref_list, _ = _as_refs(refs, "wait()") if refs else ([], False)
    timeout = _seconds(timeout, "wait()")
    ids = set(map(_ID, ref_list))
    if len(ids) != len(ref_list):
        raise ValueError("wait() got duplicate ObjectRefs; pass each ref once")
    if not ref_list:
        return [], []
    if not isinstance(num_returns, int) or not 1 <= num_returns <= len(ref_list):
        raise ValueError(f"num_returns must be between 1 and len(refs)={len(ref_list)}, "
                         f"got {num_returns!r}")
    label = progress_label(progress, "wait")
    end = rt.show_progress(ref_list, label) if label else None
    try:
        ready = rt.wait(ref_list, ids, num_returns, timeout, bool(fetch_local))
    finally:
        if end is not None:
            end()
    if len(ready) == len(ids):
        return ref_list[:num_returns], ref_list[num_returns:]
    chosen: list[ObjectRef] = []
    rest: list[ObjectRef] = []
    for ref in ref_list:  # the first num_returns ready ones, in input order
        (chosen if ref.id in ready and len(chosen) < num_returns else rest).append(ref)
    return chosen, rest


def cancel(ref: ObjectRef | ObjectRefGenerator, *, force: bool = False,
           recursive: bool = True) -> None:
    """Cancel the task producing ``ref`` (or a generator task); ``get`` then raises
    TaskCancelledError (a generator's next item is that error).

    ``recursive``: the tasks it submitted (and theirs) are cancelled too. With ``force``
    its worker is killed, and the workers running its tasks stop with their owner."""
    if not isinstance(ref, (ObjectRef, ObjectRefGenerator)):
        raise TypeError(f"cancel() takes an ObjectRef or an ObjectRefGenerator, got "
                        f"{type(ref).__name__}")
    current.require_runtime().owner.cancel(ref.task_id(), bool(force), bool(recursive))


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill an actor; its pending and later calls raise ActorDiedError."""
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() takes an ActorHandle, got {type(actor).__name__}")
    rt = current.require_runtime()
    rt.head.send(m.KillActor(actor._actor_id, no_restart))
    if no_restart:
        with rt.lock:
            rt.owner.caller(actor._actor_id, actor._max_task_retries).dead_error = (
                "it was killed with rtml.kill()")


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """A handle to the live actor called ``name``; ValueError if there is none."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"get_actor() needs the name the actor was created with (a "
                         f"non-empty str), got {name!r}")
    if namespace is not None and not isinstance(namespace, str):
        raise TypeError(f"get_actor()'s namespace must be a str or None, got {namespace!r}")
    rt = current.require_runtime()
    ns = rt.config.namespace if namespace is None else namespace  # a worker's: its job's
    job_id = rt.job_id or context.current_job()
    info: m.ActorInfo = rt.links.request(rt.head, lambda req_id: m.GetActorInfo(
        req_id, NO_ACTOR, name=name, namespace=ns, wait_ready=False, job_id=job_id),
        rt.head.timeout)
    if info.state in ("MISSING", "DEAD") or info.spec is None:
        where = f"namespace {ns!r}" if ns else "this job's namespace"
        raise ValueError(f"no live actor named {name!r} in {where}")
    return _handle_from_spec(rt, info.spec)


def list_named_actors(all_namespaces: bool = False) -> list[Any]:
    """The names of the live named actors in this job's namespace; with
    ``all_namespaces``, ``{"name": ..., "namespace": ...}`` for every namespace's (as
    Ray's ``ray.util.list_named_actors``)."""
    rt = current.require_runtime()
    job_id = rt.job_id or context.current_job()  # a worker's namespace: its job's
    reply: m.NamedActors = rt.links.request(rt.head, lambda req_id: m.ListNamedActors(
        req_id, rt.config.namespace, bool(all_namespaces), job_id), rt.head.timeout)
    if all_namespaces:
        return [{"name": name, "namespace": ns} for ns, name in reply.names]
    return [name for _, name in reply.names]


def get_node_ip_address() -> str:
    """The address of this process's node (where it listens for other nodes); the
    machine's address on its default route before ``init``."""
    rt = current.get_runtime()
    return rt.node_ip if rt is not None else cluster.detect_node_ip()


def _handle_from_spec(rt: ClientRuntime, spec: m.ActorSpec) -> ActorHandle:
    cls = rt.functions.get(spec.class_id)
    if cls is None:
        import cloudpickle
        cls = rt.functions[spec.class_id] = cloudpickle.loads(rt.fetch_function(spec.class_id))
    return handle_of(spec, cls)


def nodes() -> list[dict[str, Any]]:
    """Every node: NodeID, Alive, NodeManagerAddress, Resources."""
    rt = current.require_runtime()
    info: m.ClusterInfo = rt.links.request(rt.head, lambda req_id: m.GetClusterInfo(req_id),
                                     rt.head.timeout)
    return [n.as_ray() for n in info.nodes]


def cluster_resources() -> dict[str, float]:
    return _sum_resources("Resources")


def available_resources() -> dict[str, float]:
    """What is free now, summed over live nodes; resources none is free of are left out
    (as in Ray)."""
    return {name: amount for name, amount in _sum_resources("Available").items() if amount}


def _sum_resources(field: str) -> dict[str, float]:
    total: dict[str, float] = {}
    for node in nodes():
        if node["Alive"]:
            for name, amount in node[field].items():
                total[name] = total.get(name, 0.0) + max(0.0, amount)
    return total


def get_runtime_context() -> RuntimeContext:
    return RuntimeContext(current.require_runtime())


def get_gpu_ids() -> list[int]:
    """The GPUs assigned to the running task or actor (its ``CUDA_VISIBLE_DEVICES``); []
    in a driver."""
    return gpu_ids()


def timeline(filename: str | None = None) -> list[dict[str, Any]]:
    """Chrome-trace events of this job's tasks and actor calls, with their phases, and the
    cluster's leases and object transfers (also written to ``filename``)."""
    rt = current.require_runtime()
    rt.owner.settle()
    rt.writer.flush()
    events = chrome_trace(rt.plane.list_tasks({"job_id": rt.job_id.hex()}),
                          rt.plane.read_events())
    if filename is not None:
        with open(filename, "w") as f:
            json.dump(events, f)
    return events


def _store_stats() -> dict[str, int]:
    """The local node's object-store counters (for tests and benchmarks)."""
    rt = current.require_runtime()
    reply: m.StoreStatsReply = rt.links.request(rt.nm, lambda req_id: m.StoreStats(req_id))
    return reply.stats



