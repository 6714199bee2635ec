"""Entry point of every worker process: ``main(argv)``, called in a child the worker
zygote (``rtml.worker.zygote``) forks. This module is compiled, so it is not run
with ``python -m``.

    node manager --spawns--> worker
    worker --Hello(role=worker)--> node manager; --WorkerListening(address)--> node manager
    owners --Hello--> worker's Unix socket --PushTask--> Executor (main thread)
                                           --PushFunction--> (a function it asked for)

The main thread runs the task server (a reactor) and executes tasks inline;
the client runtime (nested submissions, get, put) runs its own I/O thread. A worker
started for a runtime env sets it up first (``rtml.worker.runtime_env``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import ssl
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec

from rtml import driver
from rtml.config import WorkerConfig
from rtml.core import current, runtime_env
from rtml.core.runtime import ClientConfig, ClientRuntime
from rtml.exceptions import ProtocolError, RuntimeEnvSetupError
from rtml.rpc import messages as m
from rtml.rpc.admission import HELLO_TIMEOUT, Admissions, RefusalLog
from rtml.rpc.auth import HELLO_MAX_FRAME, challenge, check_hello, sign
from rtml.rpc.framing import FrameDecoder, frame
from rtml.rpc.reactor import Connection, Reactor, connection_for
from rtml.rpc.tls import ServerTls, listener_tls
from rtml.session import Session
from rtml.worker import runtime_env as worker_env
from rtml.worker.executor import Executor
from rtml.worker.output import OutputTee

log = logging.getLogger(__name__)

MAX_PENDING = 64
"""Connections this worker holds that have not proven the token (``rtml.rpc.admission``)."""


class TaskServer:
    """Accepts owners' connections and hands their tasks to the executor.

    The handshake runs on the runtime's I/O thread, so a caller is admitted
    even while the main thread runs a long task; the authenticated socket then
    moves to the main thread's reactor, which reads tasks and runs them inline.
    (A caller sends nothing after its Hello until it has the reply, so no task
    frame is in flight while the socket changes hands.)
    """

    def __init__(self, rt: ClientRuntime, executor: Executor, reactor: Reactor,
                 tls: ServerTls | None = None) -> None:
        self.rt = rt
        self.executor = executor
        self.reactor = reactor
        self.tls = tls
        self.pending: Admissions[Connection] = Admissions(MAX_PENDING, MAX_PENDING)
        self.tls_pending: Admissions[_TlsHandshake] = Admissions(MAX_PENDING, MAX_PENDING)
        self.refusals = RefusalLog(log, "this worker")

    def accept(self, sock: socket.socket) -> None:
        """A new connection (on the runtime's I/O thread): counted in, with its deadline."""
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                self._accept_tls(sock, self.tls)
                return
        sent = challenge()
        conn = Connection(self.rt.reactor, sock,
                          lambda conn, msg: self._on_first(conn, msg, sent), name="owner")
        conn._decoder.max_frame = HELLO_MAX_FRAME  # nothing big before the token is proven
        displaced = self.pending.arrive(conn, "")
        if displaced is not None:
            displaced.close()
            self.refusals.refused("closed the oldest connection still proving the token")
        self.rt.reactor.add(conn)
        self.rt.reactor.call_later(HELLO_TIMEOUT, lambda: self._too_slow(conn))
        conn.send(sent)

    def _too_slow(self, conn: Connection) -> None:
        self.pending.leave(conn)
        if not conn.closed:  # (detached once its Hello came: closed for this reactor)
            self.refusals.refused(f"no Hello within {HELLO_TIMEOUT:g} s")
            conn.close()

    def _accept_tls(self, sock: socket.socket, tls: ServerTls) -> None:
        """A TCP connection to a worker of a TLS cluster: its handshake (Challenge, TLS,
        Hello) runs blocking on a thread of its own, cut off at HELLO_TIMEOUT; at most
        MAX_PENDING at a time: a new one cuts the oldest off (``rtml.rpc.admission``:
        idle connections cannot keep an owner out). The proven socket comes back to the
        I/O thread."""
        pending = _TlsHandshake(sock)
        displaced = self.tls_pending.arrive(pending, "")
        if displaced is not None:
            displaced.cut()
            self.refusals.refused("closed the oldest connection still proving the token")
        self.rt.reactor.call_later(HELLO_TIMEOUT, pending.cut)
        threading.Thread(target=self._tls_handshake, args=(pending, tls), daemon=True,
                         name="rtml-tls-accept").start()

    def _tls_handshake(self, pending: _TlsHandshake, tls: ServerTls) -> None:
        sent = challenge(tls=True)
        try:
            pending.sock.settimeout(HELLO_TIMEOUT)
            pending.sock.sendall(frame(m.encode(sent)))
            sock = pending.wrap(tls.context)
            sock.do_handshake()
            msg = _first_frame(sock, FrameDecoder(max_frame=HELLO_MAX_FRAME))
        except (OSError, ProtocolError, msgspec.DecodeError, ValueError) as exc:
            self.refusals.refused(f"TLS handshake failed: {exc}")
            pending.sock.close()
            return
        finally:
            pending.done = True
            self.tls_pending.leave(pending)
        self.rt.reactor.call_soon(self._admit, sock, msg, sent, tls.binding, b"")

    def _on_first(self, conn: Connection, msg: Any, sent: m.Challenge) -> None:
        self.pending.leave(conn)
        sock, unread = conn.detach()
        self._admit(sock, msg, sent, b"", unread)

    def _admit(self, sock: socket.socket, msg: Any, sent: m.Challenge, binding: bytes,
               unread: bytes) -> None:
        """(On the runtime's I/O thread.) Admit an owner whose first frame is ``msg``, or
        refuse it saying why."""
        try:
            hello = check_hello(msg, self.rt.token, sent, binding)
            if unread:
                raise ProtocolError("frames after Hello before its reply")
        except ProtocolError as exc:
            self.refusals.refused(str(exc))
            with contextlib.suppress(OSError):
                sock.settimeout(1.0)
                sock.sendall(frame(m.encode(m.HelloReply(ok=False, error=str(exc)))))
            sock.close()
            return
        for path in hello.sys_paths:  # where the owner's code is found, here and for the
            if path not in sys.path:  # tasks this worker submits (their workers need it too)
                sys.path.insert(self.executor.front, path)  # (behind its runtime env's)
            if path not in self.rt.sys_paths:
                self.rt.sys_paths.append(path)
        owner = connection_for(self.reactor, sock, self._on_message, name="owner")
        owner.send(sign(m.HelloReply(ok=True, node_id=self.rt.node_id), self.rt.token, hello,
                        sent, binding))
        self.reactor.add(owner)

    def _on_message(self, conn: Connection, msg: Any) -> None:
        if type(msg) is m.PushTask:
            self.executor.push(conn, msg.spec)
        elif type(msg) is m.CancelCall:
            self.executor.cancel_call(msg.task_id)
        elif type(msg) is m.PushFunction:
            self.executor.define(msg.function_id, msg.blob)
        else:
            log.warning("unexpected %s from an owner", type(msg).__name__)


def _first_frame(sock: socket.socket, decoder: FrameDecoder) -> Any:
    """The first frame a blocking socket brings, decoded (before the peer is known)."""
    while True:
        data = sock.recv(HELLO_MAX_FRAME)
        if not data:
            raise ProtocolError("the peer closed the connection before its Hello")
        frames = decoder.feed(data)
        if frames:
            return m.decode(frames[0])


class _TlsHandshake:
    """A TLS handshake on a thread of its own, and the socket it blocks on: another
    thread cuts it off (its deadline, or a newer connection displacing it) by shutting
    that socket down, which wakes the blocked call at once."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.done = False
        self._lock = threading.Lock()  # the socket changes (TLS wraps it) under it

    def wrap(self, context: ssl.SSLContext) -> ssl.SSLSocket:
        """The socket in TLS, its handshake not started (so a cut reaches it)."""
        with self._lock:
            wrapped = context.wrap_socket(self.sock, server_side=True,
                                          do_handshake_on_connect=False)
            self.sock = wrapped
            return wrapped

    def cut(self) -> None:
        with self._lock:
            if not self.done:  # (the socket-level shutdown: SSLSocket's own drops its
                with contextlib.suppress(OSError):  # SSL object under the blocked call)
                    socket.socket.shutdown(self.sock, socket.SHUT_RDWR)


class NodeOrders:
    """What the node manager asks of this worker: cancel a running task, become an actor,
    count its tasks (answered here, on the I/O thread, while a task runs).

    The runtime hands these over as they arrive; the executor is set once the worker is
    built, before the node manager can send either (it sends them only once it has our
    WorkerListening, the last step of start-up).
    """

    def __init__(self) -> None:
        self.executor: Executor | None = None
        self.server: Reactor | None = None

    def receive(self, msg: Any) -> None:
        executor, server = self.executor, self.server
        if executor is None or server is None:
            log.warning("%s before the worker was ready; ignored", type(msg).__name__)
        elif isinstance(msg, m.CancelRunning):
            executor.cancel(msg.task_id)
            if msg.recursive:
                executor.rt.owner.cancel_children(msg.task_id)
        elif isinstance(msg, m.BecomeActor):
            server.call_soon(_become_actor, executor, msg)
        elif isinstance(msg, m.CountTasks):
            executor.rt.nm.send(m.TaskCounts(executor.started, executor.finished,
                                             executor.failed))


def main(argv: list[str]) -> int:
    # (A pip env's worker comes back here under its venv's python, its config in CONFIG_ENV.)
    config_json = argv[1] if len(argv) > 1 else os.environ.pop(worker_env.CONFIG_ENV)
    cfg = WorkerConfig.from_json(config_json)
    session = Session(Path(cfg.session_dir))
    name = cfg.worker_id.hex()
    logging.basicConfig(filename=session.log_file(f"worker-{name[:12]}"),
                        level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = runtime_env.loads(cfg.runtime_env)
    setup_error = (_use_venv(cfg, config_json, env["pip"], execed=len(argv) < 2)
                   if env.get("pip") else "")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    atexit.unregister(driver.shutdown)  # a driver's; the atexit handlers that an actor's
    orders = NodeOrders()                # exit_actor() runs are its code's
    rt = ClientRuntime(ClientConfig(role="worker", token=cfg.token, nm_address=cfg.nm_address,
                                    head_address=cfg.head_address,
                                    session_dir=cfg.session_dir, client_id=cfg.worker_id),
                       on_worker_message=orders.receive)
    server_reactor = Reactor("rtml-task-server")
    executor = Executor(rt)
    if env:
        _set_up(env, cfg, rt, executor, setup_error)
    orders.executor, orders.server = executor, server_reactor
    current.set_runtime(rt)
    job = lambda: executor.current_job  # noqa: E731 - read at write time
    sys.stdout = OutputTee(sys.stdout, rt.nm.send, job)
    sys.stderr = OutputTee(sys.stderr, rt.nm.send, job)
    path = str(session.sockets / f"w-{name[:16]}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(128)
    tcp_listener = socket.create_server((cfg.node_ip, 0), backlog=128)
    host, port = tcp_listener.getsockname()[:2]
    server = TaskServer(rt, executor, server_reactor, listener_tls(cfg.tls_cert, cfg.tls_key))
    rt.reactor.listen(listener, server.accept)
    rt.reactor.listen(tcp_listener, server.accept)
    rt.nm.send(m.WorkerListening(f"unix:{path}", f"{host}:{port}"))
    try:
        server_reactor.run()
    finally:
        os.unlink(path)
    return 0


def _use_venv(cfg: WorkerConfig, config_json: str, requirements: list[str],
              execed: bool) -> str:
    """Run from the pip env's virtualenv: made on this node if needed, then this process
    becomes the worker again under its python (this does not return). Returns why it
    could not be ("" when running there already)."""
    try:
        venv = worker_env.ensure_venv(cfg.session_dir, requirements)
    except RuntimeEnvSetupError as exc:
        return str(exc)
    if worker_env.in_venv(venv):
        return ""
    if execed:  # (never twice: a venv that is not where its python says it is)
        return f"the virtualenv {venv} runs from {sys.prefix}, not from itself"
    worker_env.exec_in(venv, config_json)


def _set_up(env: dict[str, Any], cfg: WorkerConfig, rt: ClientRuntime, executor: Executor,
            error: str) -> None:
    """Set the worker's runtime env up before it serves anything; one that fails (now,
    or its pip part before) makes it refuse every call with the reason."""
    if not error:
        try:
            executor.front = worker_env.apply(env, cfg.session_dir, rt.plane)
        except RuntimeEnvSetupError as exc:
            error = str(exc)
    rt.runtime_env = cfg.runtime_env  # what the calls its tasks make inherit
    if error:
        log.error("runtime_env could not be set up: %s", error)
        executor.refuse(f"its runtime_env could not be set up on node "
                        f"{rt.node_id.hex()[:12]} (worker pid {os.getpid()}): {error}")


def _become_actor(executor: Executor, msg: m.BecomeActor) -> None:
    error = executor.become_actor(msg.spec, msg.gpu_ids, msg.restarts)
    executor.rt.nm.send(m.ActorReady(msg.spec.actor_id, error))

