"""A driver's life: ``init`` starts or joins a cluster and connects this process's
runtime, ``shutdown`` disconnects it (and stops the cluster ``init`` started).

    init(address) --None-----> cluster.start_embedded_cluster (Redis, head, node manager,
                                dashboard: children of this process) --+
                  --"auto"---> the node recorded in the session directory  |
                  --host:port> a node of that cluster on this machine ---+-> ClientRuntime
                                                                             (connected),
                                                                             RegisterJob
    first .remote() / put / get without init --> init() (auto-init, as Ray's)
    shutdown / exit --> the job's last prints, runtime closed, embedded cluster stopped

``rtml.api`` is the face of the calls that use the runtime once it is connected.
"""


from __future__ import annotations

import atexit
import html
import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from operator import attrgetter
from pathlib import Path
from typing import Any

from rtml import cluster
from rtml.config import (
    DEFAULT_DASHBOARD_PORT,
    JOB_RUNTIME_ENV,
    DashboardConfig,
    NodeConfig,
    default_object_store_memory,
)
from rtml.control_plane import ControlPlane
from rtml.core import current
from rtml.core import runtime_env as envs
from rtml.core.job_config import JobConfig
from rtml.core.options import check_namespace, check_timeout
from rtml.core.runtime import ClientConfig, ClientRuntime
from rtml.exceptions import RtmlSystemError
from rtml.ids import new_job_id
from rtml.rpc import messages as m
from rtml.scheduler.resources import bad_amount
from rtml.session import Session, default_session_dir, fresh_session_dir, new_token

log = logging.getLogger(__name__)

_embedded: cluster.StartedNode | None = None
_init_lock = threading.Lock()
_sigint_handler: Any = None  # ours, while init() has replaced the default Ctrl-C handler
_ID = attrgetter("id")  # an ObjectRef's id, at C speed over many refs


class InitContext(Mapping[str, Any]):
    """What ``init`` returns: ``address_info`` names the cluster joined, and the context
    reads as that dict (``ctx["node_id"]``, ``ctx["address"]``), as Ray's;
    ``dashboard_url`` ("" if the cluster runs none) also shows in a notebook."""

    def __init__(self, address_info: dict[str, Any]) -> None:
        self.address_info = address_info
        self.dashboard_url = address_info.get("dashboard_url", "")

    def __repr__(self) -> str:
        return f"InitContext({self.address_info!r})"

    def _repr_html_(self) -> str:
        url = html.escape(self.dashboard_url)
        link = f'<a href="{url}" target="_blank">{url}</a>' if url else "none"
        return (f"<b>rtml</b> cluster at {html.escape(self.address_info['address'])}; "
                f"dashboard: {link}")

    def __getitem__(self, key: str) -> Any:
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
         include_dashboard: bool | None = None, dashboard_host: str = "127.0.0.1",
         dashboard_port: int | None = None, _metrics_export_port: int | None = None,
         _prestart_workers: int = -1, _node_id: str = "",
         _node_timeout_s: float | None = None) -> InitContext:
    """Connect to a cluster, starting an embedded one when no address is given.

    An embedded cluster runs the dashboard (unless ``include_dashboard=False``) on
    ``dashboard_host``:``dashboard_port``; given no port, on 8265 or, when that is
    taken, a free one (a warning names it). The result's ``dashboard_url`` says where.

    ``_metrics_export_port`` (Ray's name; embedded clusters): serve Prometheus metrics
    at ``http://127.0.0.1:PORT/metrics`` from the node manager (0: a port the kernel
    picks), and the head service's at the next port, as ``rtml start --metrics-port``
    does; the result's ``metrics_export_port`` says which (None: not served).

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
    metrics_port = _check_metrics_port(_metrics_export_port)
    with _init_lock:
        if current.get_runtime() is not None:
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
                              prestart_workers=_prestart_workers, metrics_port=metrics_port)
            dashboard = None if include_dashboard is False else DashboardConfig(
                dashboard_host, DEFAULT_DASHBOARD_PORT if dashboard_port is None
                else dashboard_port, any_port=dashboard_port is None)
            _embedded = cluster.start_head_node(session, token, node, die_with_parent=True,
                                                node_timeout=_node_timeout_s,
                                                dashboard=dashboard)
            head_address, nm_address = _embedded.head_address, _embedded.nm_address
        else:
            if _metrics_export_port is not None:
                raise ValueError(f"init(_metrics_export_port=...) serves the metrics of a "
                                 f"cluster it starts; the cluster at {address} serves them "
                                 f"if started with `rtml start --metrics-port PORT`")
            session, head_address, nm_address, token = _join_info(address, token, _node_id)
        # As Ray: a job given no namespace gets an anonymous one of its own, where its
        # named actors are found (and no other job's are).
        rt = _connect(session, head_address, nm_address, token,
                      namespace or f"anonymous-{uuid.uuid4()}", bool(log_to_driver), job)
        if job_env.env:
            _use_job_env(rt, job_env)
        current.set_runtime(rt)
        _defer_ctrl_c(rt)
        url = _embedded.dashboard_url if address is None and _embedded is not None \
            else _dashboard_of(rt.plane)
        served = _embedded.metrics.get("node_manager", "") \
            if address is None and _embedded is not None else ""
        _context = InitContext({"address": head_address, "gcs_address": head_address,
                                "node_id": rt.node_id.hex(),
                                "node_ip_address": rt.node_ip,
                                "session_dir": str(session.root),
                                "dashboard_url": url, "webui_url": url,
                                "metrics_export_port":
                                    int(served.rpartition(":")[2]) if served else None})
        return _context


def _check_metrics_port(port: Any) -> int:
    """``init(_metrics_export_port=...)`` as NodeConfig's ``metrics_port`` (-1: none).
    Raises ValueError naming what a port is."""
    if port is None:
        return -1
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65534:
        raise ValueError(f"init(_metrics_export_port=...) takes a port number (0 for any "
                         f"free one; the head serves at the next), got {port!r}")
    return port


def _dashboard_of(plane: ControlPlane) -> str:
    """The URL of the joined cluster's dashboard; "" if it runs none, or Redis does not
    answer now (joining needs no Redis)."""
    try:
        return plane.dashboard_url()
    except RtmlSystemError:
        return ""


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
        rt = current.get_runtime()
        if rt is not None:
            if rt.config.log_to_driver:
                rt.flush_output(OUTPUT_FLUSH_TIMEOUT)  # the last prints of its tasks
            current.set_runtime(None)
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


current.set_auto_init(_auto_init)


def is_initialized() -> bool:
    return current.get_runtime() is not None


