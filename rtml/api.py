"""The public calls of rtml (re-exported by ``rtml/__init__.py``)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

from rtml import cluster
from rtml.config import JOB_RUNTIME_ENV, NodeConfig, default_object_store_memory
from rtml.control_plane import chrome_trace
from rtml.core import context
from rtml.core import runtime_env as envs
from rtml.core.actors import ActorClass, ActorHandle, handle_of
from rtml.core.generators import ObjectRefGenerator
from rtml.core.job_config import JobConfig
from rtml.core.object_ref import ObjectRef
from rtml.core.options import check_namespace, check_timeout
from rtml.core.remote_function import RemoteFunction
from rtml.core.runtime import ClientConfig, ClientRuntime
from rtml.core.runtime_context import RuntimeContext, gpu_ids
from rtml.ids import new_job_id
from rtml.rpc import messages as m
from rtml.scheduler.resources import bad_amount
from rtml.session import Session, default_session_dir, fresh_session_dir, new_token

log = logging.getLogger(__name__)

_embedded: cluster.StartedNode | None = None
_init_lock = threading.Lock()
_sigint_handler: Any = None  # ours, while init() has replaced the default Ctrl-C handler
_ID = attrgetter("id")  # an ObjectRef's id, at C speed over many refs


class InitContext(Mapping[str, str]):
    """What ``init`` returns: ``address_info`` names the cluster joined, and the context
    reads as that dict (``ctx["node_id"]``, ``ctx["address"]``), as Ray's."""

    def __init__(self, address_info: dict[str, str]) -> None:
        self.address_info = address_info

    def __getitem__(self, key: str) -> str:
        return self.address_info[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.address_info)

    def __len__(self) -> int:
        return len(self.address_info)

    def __enter__(self) -> InitContext:
        return self

    def __exit__(self, *exc: object) -> None:
        shutdown()


_context: InitContext | None = None

OUTPUT_FLUSH_TIMEOUT = 2.0
"""Seconds ``shutdown`` waits for what the job's workers printed to arrive."""


def init(address: str | None = None, *, num_cpus: float | None = None,
         num_gpus: float | None = None, resources: dict[str, float] | None = None,
         object_store_memory: int | None = None, namespace: str | None = None,
         log_to_driver: bool = True, token: str | None = None,
         ignore_reinit_error: bool = False, runtime_env: dict[str, Any] | None = None,
         job_config: JobConfig | None = None,
         _prestart_workers: int = -1, _node_id: str = "",
         _node_timeout_s: float | None = None) -> InitContext:
    """Connect to a cluster, starting an embedded one when no address is given.

    ``runtime_env``: the job's runtime environment (``rtml.core.runtime_env``), under
    every task's and actor's own; checked and packaged before anything starts (raises
    TypeError or ValueError), uploaded once connected.

    ``_node_timeout_s`` (embedded clusters): seconds without a heartbeat before the head
    declares a node dead, and that a head that restarted waits for what was connected.

    ``_node_id`` (for tests of several nodes on one machine): attach this driver to
    that node instead of the one recorded in this machine's session directory.
    """
    global _context, _embedded
    job = job_config if job_config is not None else JobConfig()
    if not isinstance(job, JobConfig):
        raise TypeError(f"init(job_config=...) takes an rtml.job_config.JobConfig, got "
                        f"{job_config!r}")
    namespace = namespace if namespace is not None else job.ray_namespace
    runtime_env = runtime_env if runtime_env is not None else job.runtime_env
    if namespace is not None:
        check_namespace(namespace)  # before anything is started
    if _node_timeout_s is not None:
        check_timeout("_node_timeout_s", _node_timeout_s)
    with _init_lock:
        if context.get_runtime() is not None:
            if ignore_reinit_error and _context is not None:
                return _context
            raise RuntimeError("rtml.init() was already called; call rtml.shutdown() first "
                               "or pass ignore_reinit_error=True")
        # (before anything is started)
        job_env = envs.prepare(envs.check(_under_submitted_env(runtime_env)))
        address = address or os.environ.get("RTML_ADDRESS") or None  # (set but empty: none)
        if address is None:
            _check_node_resources(num_cpus, num_gpus, resources)
            session = Session(Path(fresh_session_dir()))
            token = new_token()
            node = NodeConfig(str(session.root), token, "",
                              float(os.cpu_count() or 1) if num_cpus is None else num_cpus,
                              num_gpus or 0.0, resources or {},
                              object_store_memory or default_object_store_memory(),
                              prestart_workers=_prestart_workers)
            _embedded = cluster.start_head_node(session, token, node, die_with_parent=True,
                                                node_timeout=_node_timeout_s)
            head_address, nm_address = _embedded.head_address, _embedded.nm_address
        else:
            session, head_address, nm_address, token = _join_info(address, token, _node_id)
        # As Ray: a job given no namespace gets an anonymous one of its own, where its
        # named actors are found (and no other job's are).
        rt = _connect(session, head_address, nm_address, token,
                      namespace or f"anonymous-{uuid.uuid4()}", bool(log_to_driver), job)
        if job_env.env:
            _use_job_env(rt, job_env)
        context.set_runtime(rt)
        _defer_ctrl_c(rt)
        _context = InitContext({"address": head_address, "gcs_address": head_address,
                                "node_id": rt.node_id.hex(),
                                "node_ip_address": rt.node_ip,
                                "session_dir": str(session.root)})
        return _context


def _under_submitted_env(runtime_env: Any) -> Any:
    """``runtime_env`` over a submitted job's (``JOB_RUNTIME_ENV``, which the head sets for
    the entrypoint of ``rtml job submit``): init's wins per key, env_vars merged. Raises
    ValueError if that variable does not hold a JSON object."""
    text = os.environ.get(JOB_RUNTIME_ENV)
    if not text:
        return runtime_env
    try:
        submitted = json.loads(text)
    except json.JSONDecodeError:
        submitted = None
    if not isinstance(submitted, dict):
        raise ValueError(f"{JOB_RUNTIME_ENV} must hold a runtime_env as a JSON object, got "
                         f"{text[:80]!r}")
    if runtime_env is None:
        return submitted
    return envs.merge(submitted, runtime_env) if isinstance(runtime_env, dict) else runtime_env


def _use_job_env(rt: ClientRuntime, job_env: envs.Prepared) -> None:
    """Upload the job's runtime env's packages; its tasks and actors inherit it. Raises
    RtmlSystemError (what init started is stopped)."""
    try:
        envs.upload(rt.plane, job_env)
    except BaseException:
        rt.close()
        _stop_embedded()
        raise
    rt.runtime_env = envs.dumps(job_env.env)


def _defer_ctrl_c(rt: ClientRuntime) -> None:
    """Ctrl-C while the main thread leads the I/O loop (blocked in get/wait) is raised
    once it hands the loop back, not inside a message handler (which would lose
    messages). Only Python's default handler is replaced, and only from the main thread.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if rt.reactor.leads_here():
            rt.reactor.interrupt_leader(KeyboardInterrupt())
            return
        signal.default_int_handler(signum, frame)

    global _sigint_handler
    signal.signal(signal.SIGINT, on_sigint)
    _sigint_handler = on_sigint


def _restore_ctrl_c() -> None:
    global _sigint_handler
    if (_sigint_handler is not None and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is _sigint_handler):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _sigint_handler = None


def _check_node_resources(num_cpus: Any, num_gpus: Any, resources: Any) -> None:
    """``init``'s node amounts: finite numbers >= 0. Raises ValueError or TypeError."""
    if resources is not None and not isinstance(resources, dict):
        raise TypeError(f"resources must be a dict of name -> amount, got {resources!r}")
    given = {"num_cpus": num_cpus, "num_gpus": num_gpus, **(resources or {})}
    bad = bad_amount({name: amount for name, amount in given.items() if amount is not None})
    if bad:
        raise ValueError(f"init(): {bad}")


def _join_info(address: str, token: str | None,
               node_id: str = "") -> tuple[Session, str, str, str]:
    """Find this machine's node for ``address`` ("auto" or "host:port").

    The node recorded in the session directory if it belongs to that cluster;
    otherwise the head is asked for a node that runs on this machine.
    """
    session = Session(Path(default_session_dir())).check()
    record = session.read_record()
    if address == "auto" and record is None:
        raise ConnectionError(
            f"no rtml node runs on this machine (no {session.record_file}); start one with "
            f"`rtml start --head` or `rtml start --address HOST:PORT`")
    head_address = record["head_address"] if address == "auto" and record else address
    ours = record is not None and record["head_address"] == head_address
    token = token or os.environ.get("RTML_TOKEN") or (session.read_token() if ours else None)
    if not token:
        raise ConnectionError("no cluster token: pass token=... or set RTML_TOKEN")
    if ours and record is not None and (not node_id or record.get("node_id") == node_id):
        return session, head_address, record["nm_address"], token
    nm_address, session_dir = cluster.find_local_node(head_address, token, node_id)
    return Session(Path(session_dir)).check(), head_address, nm_address, token


def _connect(session: Session, head_address: str, nm_address: str, token: str,
             namespace: str, log_to_driver: bool, job: JobConfig) -> ClientRuntime:
    job_id = new_job_id()
    paths = [os.getcwd(), *_project_paths(), *map(os.path.abspath, job.code_search_path)]
    try:
        rt = ClientRuntime(ClientConfig("driver", token, nm_address, head_address,
                                        str(session.root), job_id, namespace=namespace,
                                        sys_paths=tuple(dict.fromkeys(paths)),
                                        log_to_driver=log_to_driver))
    except BaseException:
        _stop_embedded()
        raise
    lifetime = "detached" if job.default_actor_lifetime == "detached" else ""
    rt.job_lifetimes[job_id] = lifetime
    rt.head.send(m.RegisterJob(job_id, os.getpid(), namespace, os.getcwd(), lifetime,
                               job.metadata))
    return rt


def _project_paths() -> list[str]:
    """The driver's import paths that are not the interpreter's own (stdlib, site-packages).

    A superset of Ray's rule (the script directory, ``sys.path[0]``): workers can
    import every module of the driver's project, wherever a test runner put it.
    """
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = []
    for path in sys.path:
        real = os.path.realpath(path or os.getcwd())
        if os.path.isdir(real) and not any(real.startswith(p + os.sep) or real == p
                                           for p in own) and "site-packages" not in real:
            paths.append(real)
    return paths


def _stop_embedded() -> None:
    global _embedded
    if _embedded is not None:
        _embedded.stop()
        _embedded = None


def shutdown() -> None:
    """Disconnect; stop the embedded cluster if ``init`` started one."""
    global _context
    with _init_lock:
        rt = context.get_runtime()
        if rt is not None:
            if rt.config.log_to_driver:
                rt.flush_output(OUTPUT_FLUSH_TIMEOUT)  # the last prints of its tasks
            context.set_runtime(None)
            rt.close()
        _restore_ctrl_c()
        _context = None
        _stop_embedded()


atexit.register(shutdown)


def _auto_init() -> None:
    """A driver used rtml before ``init`` (its first ``.remote()``, ``put``, ``get``...):
    start or join a cluster as ``init()`` would (``RTML_ADDRESS`` says which), as Ray
    does."""
    log.info("rtml.init() was not called: starting it with its defaults")
    init(ignore_reinit_error=True)


context.set_auto_init(_auto_init)


def is_initialized() -> bool:
    return context.get_runtime() is not None


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


def get(refs: Any, *, timeout: float | None = None) -> Any:
    """Block for the value(s) of ``refs``; raises the task's error or GetTimeoutError."""
    rt = context.require_runtime()
    ref_list, single = _as_refs(refs, "get()")
    values = rt.get(ref_list, None if timeout is None else _seconds(timeout, "get()"))
    return values[0] if single else values


def put(value: Any) -> ObjectRef:
    """Store ``value`` in the cluster; returns its ref."""
    return context.require_runtime().put(value)


def wait(refs: list[ObjectRef], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """Return ``(ready, not_ready)``: the first ``num_returns`` ready refs, in input order.

    With ``fetch_local`` (the default, as in Ray) a ref counts as ready once its value
    is on this node: objects held by other nodes are pulled here meanwhile.
    """
    rt = context.require_runtime()
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
    ready = rt.wait(ref_list, ids, num_returns, timeout, bool(fetch_local))
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
    context.require_runtime().owner.cancel(ref.task_id(), bool(force), bool(recursive))


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill an actor; its pending and later calls raise ActorDiedError."""
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() takes an ActorHandle, got {type(actor).__name__}")
    rt = context.require_runtime()
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
    rt = context.require_runtime()
    ns = rt.config.namespace if namespace is None else namespace  # a worker's: its job's
    job_id = rt.job_id or context.current_job()
    info: m.ActorInfo = rt.request(rt.head, lambda req_id: m.GetActorInfo(
        req_id, b"", name=name, namespace=ns, wait_ready=False, job_id=job_id),
        rt.head.timeout)
    if info.state in ("MISSING", "DEAD") or info.spec is None:
        where = f"namespace {ns!r}" if ns else "this job's namespace"
        raise ValueError(f"no live actor named {name!r} in {where}")
    return _handle_from_spec(rt, info.spec)


def list_named_actors(all_namespaces: bool = False) -> list[Any]:
    """The names of the live named actors in this job's namespace; with
    ``all_namespaces``, ``{"name": ..., "namespace": ...}`` for every namespace's (as
    Ray's ``ray.util.list_named_actors``)."""
    rt = context.require_runtime()
    job_id = rt.job_id or context.current_job()  # a worker's namespace: its job's
    reply: m.NamedActors = rt.request(rt.head, lambda req_id: m.ListNamedActors(
        req_id, rt.config.namespace, bool(all_namespaces), job_id), rt.head.timeout)
    if all_namespaces:
        return [{"name": name, "namespace": ns} for ns, name in reply.names]
    return [name for _, name in reply.names]


def get_node_ip_address() -> str:
    """The address of this process's node (where it listens for other nodes); the
    machine's address on its default route before ``init``."""
    rt = context.get_runtime()
    return rt.node_ip if rt is not None else cluster.detect_node_ip()


def _handle_from_spec(rt: ClientRuntime, spec: m.ActorSpec) -> ActorHandle:
    cls = rt.functions.get(spec.class_id)
    if cls is None:
        import cloudpickle
        cls = rt.functions[spec.class_id] = cloudpickle.loads(rt.fetch_function(spec.class_id))
    return handle_of(spec, cls)


def nodes() -> list[dict[str, Any]]:
    """Every node: NodeID, Alive, NodeManagerAddress, Resources."""
    rt = context.require_runtime()
    info: m.ClusterInfo = rt.request(rt.head, lambda req_id: m.GetClusterInfo(req_id),
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
    return RuntimeContext(context.require_runtime())


def get_gpu_ids() -> list[int]:
    """The GPUs assigned to the running task or actor (its ``CUDA_VISIBLE_DEVICES``); []
    in a driver."""
    return gpu_ids()


def timeline(filename: str | None = None) -> list[dict[str, Any]]:
    """Chrome-trace events of this job's tasks and actor calls, with their phases, and the
    cluster's leases and object transfers (also written to ``filename``)."""
    rt = context.require_runtime()
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
    rt = context.require_runtime()
    reply: m.StoreStatsReply = rt.request(rt.nm, lambda req_id: m.StoreStats(req_id))
    return reply.stats



