"""Starting and stopping the processes of a node: Redis, the head service, a node manager.

Used by the embedded ``rtml.init()`` (children die with the driver) and by
``rtml start`` (daemons recorded in the session directory). Each child reports
readiness on a pipe; nobody polls.

The head service is kept running by a ``HeadSupervisor``: a thread of the driver for an
embedded cluster, the ``rtml.head.supervisor`` daemon for ``rtml start --head``. It holds
the head's listening socket, so a head started again listens where the last one did,
and connections made in between wait in the socket's backlog. Redis is kept running
by a ``RedisKeeper`` in the same place: started again on its port, from its
append-only file, while everyone's writes wait for it.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from rtml.config import (
    DIE_WITH_PARENT_ENV,
    REDIS_PASSWORD_ENV,
    TOKEN_ENV,
    DashboardConfig,
    HeadConfig,
    NodeConfig,
)
from rtml.control_plane import (
    ControlPlane,
    RedisAddress,
    RedisProcess,
    login_refused,
    own_password,
    start_redis,
    timed_out,
    tls_text,
)
from rtml.exceptions import ProtocolError, RtmlSystemError
from rtml.ids import new_client_id
from rtml.rpc import messages as m
from rtml.rpc.client import make_hello, request
from rtml.session import Session, process_start_time

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
RESTART_BURST = 5
RESTART_WINDOW = 60.0
"""A head that dies RESTART_BURST times within RESTART_WINDOW s is not started again."""


@dataclass
class StartedNode:
    """Processes started for one node (and the head, if this is the head node)."""

    session: Session
    head_address: str
    nm_address: str
    node_id: str
    redis: RedisProcess | None = None  # the Redis started here (none: the user's)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis_address: RedisAddress | None = None  # the head's control plane
    supervisor: HeadSupervisor | None = None  # an embedded head's (a thread of ours)
    keeper: RedisKeeper | None = None  # an embedded head's Redis keeper (a thread of ours)
    dashboard: DashboardKeeper | None = None  # an embedded head's (a thread of ours)
    dashboard_url: str = ""  # "": none runs
    metrics: dict[str, str] = field(default_factory=dict)  # process -> host:port of /metrics

    def pids(self) -> list[int]:
        pids = [p.pid for p in self.procs]
        for keeper in (self.supervisor, self.dashboard):
            if keeper is not None and keeper.proc is not None:
                pids.append(keeper.proc.pid)
        if self.keeper is not None:
            pids.append(self.keeper.pid)
        elif self.redis is not None:
            pids.append(self.redis.proc.pid)
        return pids

    def stop(self) -> None:
        """Stop the node manager first (it reaps workers), then the head, then Redis."""
        if self.keeper is not None:
            self.keeper.stopping.set()  # (Redis stopped below is not started again)
        if self.dashboard is not None:
            self.dashboard.stop()
        for proc in reversed(self.procs):
            _terminate(proc)
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.keeper is not None:
            self.keeper.stop()
        if self.redis is not None:
            self.redis.stop()


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Launched:
    """A daemon started but not yet known to be ready."""

    proc: subprocess.Popen[bytes]
    ready_fd: int
    name: str


def launch_daemon(module: str, config_json: str, session: Session, name: str,
                  die_with_parent: bool, token: str, pass_fds: tuple[int, ...] = (),
                  own_group: bool = False, redis_password: str = "") -> Launched:
    """Start ``python -m module``; :func:`await_ready` then waits for its readiness line.

    A daemon that does not die with its parent gets its own session (and process
    group); ``own_group`` gives one to a child that does, too.
    """
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env[DIE_WITH_PARENT_ENV] = str(os.getpid()) if die_with_parent else "0"
    env[TOKEN_ENV] = token
    if redis_password:
        env[REDIS_PASSWORD_ENV] = redis_password
    with open(session.log_file(f"{name}-out"), "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, config_json, str(write_fd)],
                                pass_fds=(write_fd, *pass_fds), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, env=env,
                                start_new_session=own_group or not die_with_parent)
    os.close(write_fd)
    return Launched(proc, read_fd, name)


def await_ready(launched: Launched, session: Session) -> str:
    """The daemon's readiness info. Raises RtmlSystemError if it failed to start."""
    try:
        line = _read_line(launched.ready_fd, START_TIMEOUT)
    finally:
        os.close(launched.ready_fd)
    if not line.startswith("ok"):
        _terminate(launched.proc)
        name = launched.name
        raise RtmlSystemError(f"{name} failed to start ({line or 'no answer'}); see "
                              f"{session.log_file(name)} and {session.log_file(name + '-out')}")
    return line.split(" ", 1)[1]


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return ""
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


class DaemonKeeper:
    """Starts one of the head's daemons on a socket it holds, and starts it again each
    time it exits unasked, on the same socket."""

    module = ""
    name = ""  # of its log files
    title = ""  # in messages
    fd_field = ""  # the HeadConfig field that gives the daemon the socket

    def __init__(self, session: Session, cfg: HeadConfig, listener: socket.socket,
                 die_with_parent: bool, own_group: bool = False) -> None:
        self.session = session
        self.cfg = HeadConfig(**{**cfg.__dict__, "listen_fd": -1, "dashboard_fd": -1,
                                 self.fd_field: listener.fileno()})
        self.listener = listener
        self.die_with_parent = die_with_parent
        self.own_group = own_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self._deaths: deque[float] = deque(maxlen=RESTART_BURST)

    def launch(self) -> Launched:
        launched = launch_daemon(self.module, self.cfg.to_json(), self.session, self.name,
                                 self.die_with_parent, self.cfg.token,
                                 pass_fds=(self.listener.fileno(),), own_group=self.own_group,
                                 redis_password=self.cfg.redis_password)
        self.proc = launched.proc
        return launched

    def watch_in_thread(self, first: Launched | None = None) -> None:
        """Watch from a thread of its own; ``first``: a launch whose readiness that thread
        waits for first (so that its launcher need not)."""
        threading.Thread(target=self.watch, args=(first,), name=f"rtml-{self.name}-keeper",
                         daemon=True).start()

    def watch(self, first: Launched | None = None) -> None:
        """Block until stop(), starting the daemon again whenever it exits. Gives up (and
        returns) when it keeps dying: RESTART_BURST deaths within RESTART_WINDOW s."""
        if first is not None:
            self._await(first)
        while self.proc is not None:
            code = self.proc.wait()
            if self.stopping.is_set():
                return
            now = time.monotonic()
            self._deaths.append(now)
            if len(self._deaths) == RESTART_BURST and now - self._deaths[0] < RESTART_WINDOW:
                log.error("the %s died %d times within %g s; not starting it again (see %s)",
                          self.title, RESTART_BURST, RESTART_WINDOW,
                          self.session.log_file(self.name))
                return
            log.warning("the %s exited (code %s); starting it again", self.title, code)
            self._await(self.launch())

    def _await(self, launched: Launched) -> None:
        try:
            await_ready(launched, self.session)
        except RtmlSystemError as exc:
            if not self.stopping.is_set():  # (else it was stopped while starting)
                log.error("the %s did not start: %s", self.title, exc)

    def stop(self) -> None:
        self.stopping.set()
        if self.proc is not None:
            _terminate(self.proc)
        self.listener.close()


class HeadSupervisor(DaemonKeeper):
    """Keeps the head service running on the head's listening socket."""

    module, name, title, fd_field = "rtml.head.main", "head", "head service", "listen_fd"


class DashboardKeeper(DaemonKeeper):
    """Keeps the dashboard (``rtml.dashboard.main``) running on its listening socket."""

    module, name, title, fd_field = ("rtml.dashboard.main", "dashboard", "dashboard",
                                     "dashboard_fd")


def dashboard_url(sock: socket.socket) -> str:
    """The address a browser opens for a dashboard listening on ``sock``."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind_dashboard(options: DashboardConfig) -> socket.socket:
    """The dashboard's listening socket. A taken port is an RtmlSystemError naming the
    flag, unless ``options.any_port``: then a free port, with a warning naming it."""
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    try:
        return socket.create_server((options.host, options.port), family=family, backlog=128)
    except OSError as exc:
        if not options.any_port:
            raise RtmlSystemError(f"the dashboard cannot listen on {options.host}:"
                                  f"{options.port} ({exc.strerror}); pass another "
                                  f"--dashboard-port, or 0 to run none") from None
        sock = socket.create_server((options.host, 0), family=family, backlog=128)
        log.warning("port %d is taken (%s); the dashboard listens on port %d instead",
                    options.port, exc.strerror, sock.getsockname()[1])
        return sock


class RedisKeeper:
    """Starts Redis again each time it exits unasked: on the same address and port, from
    its append-only file (what it had acknowledged is there). Meanwhile everyone's writes
    wait for it (the head's, the node managers', the owners' lineage). Gives up when it
    keeps dying (RESTART_BURST deaths within RESTART_WINDOW s)."""

    def __init__(self, session: Session, host: str, port: int, password: str, pid: int,
                 proc: subprocess.Popen[bytes] | None = None) -> None:
        self.session = session
        self.host, self.port, self.password = host, port, password
        self.pid = pid  # the Redis watched now
        self.proc = proc  # ... when it is our child (reaped once it exits)
        self.started: RedisProcess | None = None  # the last one started here
        self.stopping = threading.Event()
        self._deaths: deque[float] = deque(maxlen=RESTART_BURST)

    def watch_in_thread(self) -> None:
        threading.Thread(target=self.watch, name="rtml-redis-keeper", daemon=True).start()

    def watch(self) -> None:
        """Block until stop(), starting Redis again whenever it exits (started from this
        thread: a Redis dies with the thread that started it)."""
        while self._exited():
            now = time.monotonic()
            self._deaths.append(now)
            if len(self._deaths) == RESTART_BURST and now - self._deaths[0] < RESTART_WINDOW:
                log.error("Redis died %d times within %g s; not starting it again (see %s)",
                          RESTART_BURST, RESTART_WINDOW, self.session.redis / "redis.log")
                return
            log.warning("Redis (pid %d) exited; starting it again on %s:%d", self.pid,
                        self.host, self.port)
            try:
                self.started = start_redis(port=self.port, password=self.password,
                                           data_dir=str(self.session.redis), bind=self.host)
            except RtmlSystemError as exc:
                log.error("Redis did not start again: %s", exc)
                self.stopping.wait(1.0)  # and try again (its port may be held a moment)
                continue
            self.pid, self.proc = self.started.proc.pid, self.started.proc
            self._record()

    def _exited(self) -> bool:
        """Block until the watched Redis exits (True) or stop() is called (False)."""
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return not self.stopping.is_set()
        try:
            while not self.stopping.is_set():
                if select.select([fd], [], [], 0.5)[0]:
                    if self.proc is not None:
                        self.proc.wait()
                    return not self.stopping.is_set()
            return False
        finally:
            os.close(fd)

    def _record(self) -> None:
        """A daemon head's session record names the Redis running now (for rtml stop)."""
        record = self.session.read_record()
        if record is None:
            return
        for process in record.get("processes", []):
            if process.get("name") == "redis":
                process.update(pid=self.pid, start_time=process_start_time(self.pid))
        record["pids"] = [p["pid"] for p in record.get("processes", [])]
        self.session.write_record(record)

    def stop(self) -> None:
        self.stopping.set()
        if self.started is not None:
            self.started.stop()


def start_head_node(session: Session, token: str, node: NodeConfig, *, port: int = 0,
                    die_with_parent: bool, own_group: bool = False,
                    node_timeout: float | None = None,
                    redis_address: RedisAddress | None = None,
                    dashboard: DashboardConfig | None = None) -> StartedNode:
    """Start Redis, the head service and a node manager, all on ``node.node_ip``, and the
    dashboard (``dashboard``: where; None: none).
    ``node_timeout``: seconds without a heartbeat before the head declares a node dead
    (default: ``RTML_NODE_TIMEOUT_S``, else 10). ``redis_address``: a Redis of the user's
    to use instead (none is started then; it is checked first).

    The head's listening socket is bound here and handed to its supervisor, so its
    address is known at once and the node manager starts alongside it (its connection
    waits in the listen backlog until the head accepts). Embedded (``die_with_parent``),
    the supervisor is a thread of this process; else the ``rtml.head.supervisor``
    daemon. Redis listens on the node's address too (other nodes write to it), fenced
    (``start_redis``): rtml's user, its password derived from the token, and nobody else.
    """
    if redis_address is not None:
        _check_redis(redis_address, token)
    session.create()
    session.write_token(token)
    host = node.node_ip
    web = bind_dashboard(dashboard) if dashboard is not None else None
    try:
        listener = _bind(host, port)
    except BaseException:
        if web is not None:
            web.close()
        raise
    redis = None
    if redis_address is None:
        redis = start_redis(port=0, password=own_password(token), data_dir=str(session.redis),
                            bind=host, die_with_parent=die_with_parent)
        redis_address = RedisAddress(redis.host, redis.port)
    started = StartedNode(session, f"{host}:{listener.getsockname()[1]}", "", "", redis,
                          redis_address=redis_address,
                          dashboard_url=dashboard_url(web) if web is not None else "")
    try:
        head_cfg = HeadConfig(str(session.root), token, redis_address.host, redis_address.port,
                              host, listener.getsockname()[1], listen_fd=listener.fileno(),
                              redis_pid=0 if die_with_parent or redis is None
                              else redis.proc.pid,
                              redis_user=redis_address.user,
                              redis_password=redis_address.password,
                              redis_tls=tls_text(redis_address.tls),
                              tls_cert=node.tls_cert, tls_key=node.tls_key,
                              metrics_port=head_metrics_port(node.metrics_port),
                              metrics_host=node.metrics_host)
        if node_timeout is not None:
            head_cfg = HeadConfig(**{**head_cfg.__dict__, "node_timeout": node_timeout})
        if die_with_parent:
            started.supervisor = HeadSupervisor(session, head_cfg, listener, True, own_group)
            head = started.supervisor.launch()
            if web is not None:
                started.dashboard = DashboardKeeper(session, head_cfg, web, True, own_group)
        else:
            head_cfg = HeadConfig(**{**head_cfg.__dict__,
                                     "dashboard_fd": -1 if web is None else web.fileno()})
            head = _launch_supervisor(session, head_cfg, listener, web)
            started.procs.append(head.proc)
        node_manager = _launch_node_manager(started, node, die_with_parent, own_group)
        _, _, metrics = await_ready(head, session).partition(" ")
        if metrics:
            started.metrics["head"] = metrics
        try:
            _node_ready(started, node_manager)
        except RtmlSystemError as exc:
            code = head.proc.poll()
            state = "is running" if code is None else f"exited with code {code}"
            raise RtmlSystemError(f"{exc} (the head service {state})") from None
    except BaseException:
        listener.close()
        if web is not None:
            web.close()
        started.stop()
        raise
    if started.dashboard is not None:  # (not waited for: it only reads)
        started.dashboard.watch_in_thread(started.dashboard.launch())
    if started.supervisor is not None:
        started.supervisor.watch_in_thread()
        if redis is not None:
            started.keeper = RedisKeeper(session, redis.host, redis.port, redis.password,
                                         redis.proc.pid, redis.proc)
            started.keeper.watch_in_thread()
    return started


def head_metrics_port(node_port: int) -> int:
    """The head service's metrics port on a head node whose node manager serves metrics
    on ``node_port``: the next one (0: a port the kernel picks; -1: none)."""
    return node_port + 1 if node_port > 0 else node_port


def _check_redis(address: RedisAddress, token: str) -> None:
    """A Redis of the user's answers and takes our login, or RtmlSystemError says not."""
    plane = ControlPlane.at(address, token)
    try:
        plane.check()
    except RtmlSystemError as exc:
        cause = exc.__cause__
        if login_refused(exc):
            user = f"user {address.user!r}" if address.user else "the default user"
            raise RtmlSystemError(f"Redis at {address} rejected the login of {user}: check "
                                  f"the user and password in --redis-address ({cause})"
                                  ) from None
        tls = " (is it one that speaks TLS, for rediss://?)" if address.tls else ""
        if timed_out(exc):
            raise RtmlSystemError(f"Redis at {address} did not answer in time ({cause}): "
                                  f"check that --redis-address names a Redis this host can "
                                  f"reach{tls}, and that it is not hung") from None
        raise RtmlSystemError(f"cannot reach Redis at {address} ({cause}): check the "
                              f"address of --redis-address{tls} and that it runs") from None
    finally:
        plane.close()


def _launch_supervisor(session: Session, cfg: HeadConfig, listener: socket.socket,
                       dashboard: socket.socket | None = None) -> Launched:
    """The ``rtml.head.supervisor`` daemon, handed ``listener`` and the dashboard's
    socket (closed here)."""
    sockets = [listener] if dashboard is None else [listener, dashboard]
    try:
        return launch_daemon("rtml.head.supervisor", cfg.to_json(), session, "supervisor",
                             False, cfg.token, pass_fds=tuple(s.fileno() for s in sockets),
                             redis_password=cfg.redis_password)
    finally:
        for sock in sockets:
            sock.close()


def take_over_head(session: Session, token: str, head_address: str,
                   redis_address: RedisAddress, redis_pid: int,
                   tls: tuple[str, str] = ("", ""), metrics_address: str = ""
                   ) -> subprocess.Popen[bytes]:
    """Start a head supervisor (and head) for a head node whose supervisor died while its
    Redis (``redis_pid``, which the new supervisor keeps running) lives on: on the
    recorded address, taking over from what Redis recorded (the node managers rejoin
    it), serving metrics where the old head did (``metrics_address``, if it did).
    Returns the supervisor's process."""
    metrics_host, _, metrics_port = metrics_address.rpartition(":")
    host, _, port = head_address.rpartition(":")
    listener = _bind(host, int(port))
    cfg = HeadConfig(str(session.root), token, redis_address.host, redis_address.port, host,
                     int(port), listen_fd=listener.fileno(), redis_pid=redis_pid,
                     redis_user=redis_address.user, redis_password=redis_address.password,
                     redis_tls=tls_text(redis_address.tls), tls_cert=tls[0], tls_key=tls[1],
                     metrics_port=int(metrics_port) if metrics_port else -1,
                     metrics_host=metrics_host)
    launched = _launch_supervisor(session, cfg, listener)
    await_ready(launched, session)
    return launched.proc


def _bind(host: str, port: int) -> socket.socket:
    try:
        return socket.create_server((host, port), backlog=128)
    except OSError as exc:
        raise RtmlSystemError(f"cannot listen on {host}:{port} ({exc}); pick another "
                              f"--port or stop what uses it") from exc


def join_node(session: Session, token: str, node: NodeConfig, head_address: str, *,
              die_with_parent: bool, own_group: bool = False) -> StartedNode:
    """Start a node manager that joins the head at ``head_address``."""
    session.create()
    session.write_token(token)
    started = StartedNode(session, head_address, "", "")
    _node_ready(started, _launch_node_manager(started, node, die_with_parent, own_group))
    return started


def _launch_node_manager(started: StartedNode, node: NodeConfig, die_with_parent: bool,
                         own_group: bool) -> Launched:
    cfg = NodeConfig(**{**node.__dict__, "head_address": started.head_address,
                        "session_dir": str(started.session.root)})
    launched = launch_daemon("rtml.node.main", cfg.to_json(), started.session,
                             "node_manager", die_with_parent, node.token,
                             own_group=own_group)
    started.procs.append(launched.proc)
    return launched


def _node_ready(started: StartedNode, launched: Launched) -> None:
    started.node_id, started.nm_address, metrics = await_ready(
        launched, started.session).split(" ", 2)
    if metrics != "-":
        started.metrics["node_manager"] = metrics


def find_local_node(head_address: str, token: str, node_id: str = "") -> tuple[str, str]:
    """(node manager address, session dir) of an alive node of the cluster at
    ``head_address`` that runs on this machine (``node_id``: that one).

    Raises ConnectionError saying what to do when there is none.
    """
    for node in cluster_nodes(head_address, token):
        host = node.address.rpartition(":")[0]
        if node.alive and (node.node_id.hex() == node_id if node_id else is_local_ip(host)):
            return node.address, node.session_dir
    which = f"node {node_id}" if node_id else "a node on this machine"
    raise ConnectionError(f"the cluster at {head_address} has no alive {which}; start one "
                          f"here with `rtml start --address {head_address}`")


def cluster_nodes(head_address: str, token: str, timeout: float = 10.0) -> list[m.NodeInfo]:
    """The head's node table. Raises ConnectionError naming the address."""
    try:
        reply = request(head_address, token, make_hello("cli", new_client_id()),
                        m.GetClusterInfo(1), m.ClusterInfo, timeout)
    except ProtocolError as exc:
        raise ConnectionError(f"the head at {head_address} refused us: {exc}") from None
    except OSError as exc:
        raise ConnectionError(f"cannot reach the head at {head_address}: {exc}") from None
    return reply.nodes


def is_local_ip(host: str) -> bool:
    """Whether ``host`` is an address of this machine (it can be bound here)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
        return True
    except OSError:
        return False


def detect_node_ip() -> str:
    """This machine's address on its default route (no packet is sent), or 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.254.254.254", 1))
            return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"
