"""The controller of one launched program: node directory, stop signal, node outcomes.

    node (thread or process)                  Controller (in the launching process)
    ------------------------                  -------------------------------------
    courier server up  --register(uid, addr)--> directory[uid] = addr; lookups waiting wake
    handle dereferenced, first call
                       --lookup(uid, timeout)-> addr (waits until registered, or raises)
    lp.stop()          --request_stop()-------> stopped; every node's stop listener fires
    node returned      --finished(uid)--------> the launcher's on_outcome(uid, None)
    node raised        --failed(uid, error)---> the launcher's on_outcome(uid, error)

Threads of the launching process call a :class:`Controller` directly; node
processes reach it through :class:`ControllerServer` with a
:class:`RemoteController`, which offers the same methods. The controller is
scoped to one program: stopping it never touches another program.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from rtml.launchpad import wire

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 60.0
"""Seconds a call to a node that is not up yet waits for it before raising."""


class NodeNotUp(TimeoutError):
    """A node did not come up (register its address) within the deadline."""


class Controller:
    """Directory, stop flag and outcome sink of one program (thread-safe)."""

    def __init__(self, program_name: str, descriptions: dict[str, str],
                 on_outcome: Callable[[str, BaseException | None], None],
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.program_name = program_name
        self.connect_timeout = connect_timeout
        self.descriptions = descriptions  # uid -> "CourierNode(Learner) 'learner/0'"
        self.on_outcome = on_outcome
        self.stopped = threading.Event()
        self._cond = threading.Condition()
        self._addresses: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []

    def register(self, uid: str, address: str) -> None:
        with self._cond:
            self._addresses[uid] = address
            self._cond.notify_all()

    def unregister(self, uid: str) -> None:
        """The node went down (it may come back at a new address after a restart)."""
        with self._cond:
            self._addresses.pop(uid, None)

    def lookup(self, uid: str, timeout: float | None = None) -> str:
        """The node's address, waiting for it to come up (at most ``timeout`` s, default
        the program's connect timeout). Raises NodeNotUp or KeyError."""
        timeout = self.connect_timeout if timeout is None else timeout
        if uid not in self.descriptions:
            raise KeyError(f"no node {uid} in program {self.program_name!r}; a handle "
                           f"works only in the program its node was added to")
        deadline = time.monotonic() + timeout
        with self._cond:
            while uid not in self._addresses:
                left = deadline - time.monotonic()
                if left <= 0 or self.stopped.is_set():
                    why = "the program is stopping" if self.stopped.is_set() else \
                        f"it did not come up within {timeout:g} s"
                    raise NodeNotUp(f"cannot call {self.descriptions[uid]} of program "
                                    f"{self.program_name!r}: {why}")
                self._cond.wait(min(left, 0.5))
            return self._addresses[uid]

    def request_stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        with self._cond:
            listeners = list(self._listeners)
            self._cond.notify_all()
        for listener in listeners:
            try:
                listener()
            except Exception:
                log.exception("a stop listener failed")

    def add_stop_listener(self, listener: Callable[[], None]) -> None:
        with self._cond:
            self._listeners.append(listener)
        if self.stopped.is_set():
            listener()

    def finished(self, uid: str) -> None:
        self.on_outcome(uid, None)

    def failed(self, uid: str, error: BaseException) -> None:
        self.unregister(uid)
        self.on_outcome(uid, error)


class ControllerServer:
    """Serves a :class:`Controller` to node processes over TCP (one thread per connection)."""

    def __init__(self, controller: Controller, host: str, token: str) -> None:
        self.controller = controller
        self.acceptor = wire.Acceptor(host, token, self._serve, "the program's controller")
        self.address = self.acceptor.address

    def _serve(self, sock: socket.socket) -> None:
        lock = threading.Lock()
        try:
            while True:
                req_id, op, args = wire.recv_obj(sock)
                threading.Thread(target=self._answer, args=(sock, lock, req_id, op, args),
                                 daemon=True).start()
        except (wire.WireError, OSError):
            sock.close()

    def _answer(self, sock: socket.socket, lock: threading.Lock, req_id: int, op: str,
                args: tuple[Any, ...]) -> None:
        try:
            if op == "watch_stop":
                self.controller.stopped.wait()
                reply: Any = (True, None)
            elif op not in _OPS:
                reply = (False, ValueError(f"unknown controller operation {op!r}"))
            else:
                reply = (True, getattr(self.controller, op)(*args))
        except Exception as exc:
            reply = (False, exc)
        with contextlib.suppress(OSError):
            wire.send_obj(sock, (req_id, *reply), lock)

    def close(self) -> None:
        self.acceptor.close()


_OPS = {"register", "unregister", "lookup", "request_stop", "finished", "failed"}


class RemoteController:
    """A node process's proxy to the program's controller (same methods as Controller)."""

    def __init__(self, address: str, token: str, program_name: str,
                 descriptions: dict[str, str]) -> None:
        self.address = address
        self.token = token
        self.program_name = program_name
        self.descriptions = descriptions
        self.stopped = threading.Event()
        self._sock = wire.connect(address, token)
        self._lost = False  # the launcher is gone: every call fails at once
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._ids = 0
        self._listeners: list[Callable[[], None]] = []
        threading.Thread(target=self._read, name="lp-controller-client", daemon=True).start()
        threading.Thread(target=self._watch, name="lp-stop-watch", daemon=True).start()

    def _call(self, op: str, *args: Any) -> Any:
        done, box = threading.Event(), cast(list[Any], [])
        with self._send_lock:
            if self._lost:
                raise ConnectionError("the program's controller is gone")
            self._ids += 1
            req_id = self._ids
            self._pending[req_id] = (done, box)
        wire.send_obj(self._sock, (req_id, op, args), self._send_lock)
        done.wait()
        ok, value = box
        if not ok:
            raise value
        return value

    def _read(self) -> None:
        try:
            while True:
                req_id, ok, value = wire.recv_obj(self._sock)
                done, box = self._pending.pop(req_id)
                box.extend((ok, value))
                done.set()
        except (wire.WireError, OSError):
            # The launcher is gone: the program is over for this node.
            with self._send_lock:
                self._lost = True
                pending, self._pending = self._pending, {}
            for done, box in pending.values():
                box.extend((False, ConnectionError("the program's controller is gone")))
                done.set()
            self._stopped()

    def _watch(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            self._call("watch_stop")
        self._stopped()

    def _stopped(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("a stop listener failed")

    def register(self, uid: str, address: str) -> None:
        self._call("register", uid, address)

    def unregister(self, uid: str) -> None:
        self._call("unregister", uid)

    def lookup(self, uid: str, timeout: float | None = None) -> str:
        result: str = self._call("lookup", uid, timeout)
        return result

    def request_stop(self) -> None:
        self._call("request_stop")

    def add_stop_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)
        if self.stopped.is_set():
            listener()

    def finished(self, uid: str) -> None:
        self._call("finished", uid)

    def failed(self, uid: str, error: BaseException) -> None:
        self._call("failed", uid, error)
