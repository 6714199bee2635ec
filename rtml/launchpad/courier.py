"""Courier: every public method of an object served over TCP, called through a client.

    caller thread                      CourierClient                  CourierServer (the node)
    -------------                      -------------                  ------------------------
    client.method(x)         --> future = call("method", x)
    client.futures.method(x) --> future  --(req_id, method, args, kwargs)-->  pool thread runs
                                         <--(req_id, ok, value or error)---  instance.method(x)
    reader thread sets the future's result or exception

Handlers run concurrently on a thread pool, as in Launchpad (they must be
thread-safe). Arguments and results are pickled, in every launch type. A
client resolves its node's address through the program's controller when it
first calls, waiting while the node is not up yet, and again after the node
restarts at a new address.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import socket
import threading
import traceback
from collections.abc import Callable
from typing import Any

from rtml.launchpad import wire

log = logging.getLogger(__name__)

HANDLER_THREADS = 32


def public_methods(instance: Any) -> dict[str, Callable[..., Any]]:
    """The methods a CourierNode serves: public callables of the instance."""
    methods = {}
    for name in dir(instance):
        if name.startswith("_"):
            continue
        with contextlib.suppress(AttributeError):
            value = getattr(instance, name)
            if callable(value):
                methods[name] = value
    return methods


class CourierServer:
    """Serves ``instance``'s public methods on ``host`` (a free port), with ``token``."""

    def __init__(self, instance: Any, description: str, host: str, token: str,
                 wrap: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda f: f,
                 threads: int = HANDLER_THREADS) -> None:
        self.methods = public_methods(instance)
        self.description = description
        self.token = token
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, f"lp-{description[:20]}")
        self.wrap = wrap
        self.acceptor = wire.Acceptor(host, token, self._serve, description)
        self.address = self.acceptor.address

    def _serve(self, sock: socket.socket) -> None:
        lock = threading.Lock()
        try:
            while True:
                req_id, name, args, kwargs = wire.recv_obj(sock)
                self.pool.submit(self._handle, sock, lock, req_id, name, args, kwargs)
        except (wire.WireError, OSError, RuntimeError):  # RuntimeError: pool shut down
            sock.close()

    def _handle(self, sock: socket.socket, lock: threading.Lock, req_id: int, name: str,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        method = self.methods.get(name)
        try:
            if method is None:
                raise AttributeError(f"{self.description} has no method {name!r}; it serves "
                                     f"{sorted(self.methods)}")
            reply: tuple[Any, ...] = (req_id, True, self.wrap(method)(*args, **kwargs))
        except Exception as exc:
            reply = (req_id, False, _transportable(exc, self.description, name))
        try:
            wire.send_obj(sock, reply, lock)
        except (OSError, TypeError) as exc:  # closed, or the result does not pickle
            if isinstance(exc, TypeError):
                error = TypeError(f"the result of {self.description}.{name}() cannot be "
                                  f"pickled: {exc}")
                with contextlib.suppress(OSError):
                    wire.send_obj(sock, (req_id, False, error), lock)

    def close(self) -> None:
        self.acceptor.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def _transportable(exc: BaseException, description: str, method: str) -> BaseException:
    """The handler's exception with the node and remote traceback noted on it."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    exc.add_note(f"raised by {description}.{method}():\n{text}")
    try:
        wire.cloudpickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{description}.{method}() raised {exc!r} (which cannot be "
                            f"pickled):\n{text}")
    return exc


class CourierClient:
    """Calls the methods of one CourierNode: ``client.m(x)`` blocks, ``client.futures.m(x)``
    returns a ``concurrent.futures.Future``."""

    def __init__(self, uid: str, description: str, controller: Any, token: str) -> None:
        self._uid = uid
        self._description = description
        self._controller = controller
        self._token = token
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        # req_id -> (its future, the connection it was sent on)
        self._pending: dict[int, tuple[concurrent.futures.Future[Any], socket.socket]] = {}
        self._ids = itertools.count(1)
        self.futures = _Futures(self)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs).result()

    def __repr__(self) -> str:
        return f"CourierClient({self._description})"

    def _call(self, name: str, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        req_id = next(self._ids)
        for attempt in range(2):  # a second time after a restarted node moved
            sock = self._connection()
            self._pending[req_id] = (future, sock)
            try:
                wire.send_obj(sock, (req_id, name, args, kwargs), self._send_lock)
                return future
            except OSError:
                self._pending.pop(req_id, None)
                self._drop(sock)
                if attempt:
                    raise
        return future

    def _connection(self) -> socket.socket:
        with self._lock:
            if self._sock is None:
                address = self._controller.lookup(self._uid)
                try:
                    self._sock = wire.connect(address, self._token)
                except OSError as exc:
                    raise ConnectionError(f"cannot reach {self._description} at {address}: "
                                          f"{exc}") from None
                threading.Thread(target=self._read, args=(self._sock,), daemon=True,
                                 name="lp-courier-client").start()
            return self._sock

    def _read(self, sock: socket.socket) -> None:
        try:
            while True:
                req_id, ok, value = wire.recv_obj(sock)
                entry = self._pending.pop(req_id, None)
                if entry is None:
                    continue
                # The caller may have cancelled it: that must not end this reader.
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    if ok:
                        entry[0].set_result(value)
                    else:
                        entry[0].set_exception(value)
        except (wire.WireError, OSError):
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        """The connection broke (the node stopped or crashed): fail its calls (only its
        own: calls already re-sent to a restarted node wait on the new connection)."""
        with self._lock:
            if self._sock is sock:
                self._sock = None
        with contextlib.suppress(OSError):
            sock.close()
        error = ConnectionError(f"the connection to {self._description} was lost (the node "
                                f"stopped or crashed) before it answered")
        for req_id, (future, sent_on) in list(self._pending.items()):
            if sent_on is sock:
                self._pending.pop(req_id, None)
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(error)

    def __reduce__(self) -> Any:
        raise TypeError(f"a client of {self._description} cannot be pickled; pass the "
                        f"node's handle (from program.add_node) instead")


class _Futures:
    def __init__(self, client: CourierClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., concurrent.futures.Future[Any]]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._client._call(name, args, kwargs)
