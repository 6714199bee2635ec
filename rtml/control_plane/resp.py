"""A small synchronous Redis (RESP2) client: one socket, hiredis for packing and parsing.

::

    caller threads --execute / pipeline / Script--> lock --> one TCP socket --> Redis
                       hiredis.pack_command (C)          hiredis.Reader (C) <--+
                                                         (TLS over it, if given a context)

It replaces redis-py, whose eager imports cost ~280 ms in every rtml process.
Arguments are ``str``, ``bytes``, ``int`` or ``float``; replies are what
``hiredis.Reader`` returns (bytes, int, list, None). Error replies raise
:class:`RespError`; a refused password raises :class:`AuthError`; a lost,
refused or timed-out connection raises :class:`RespConnectionError`.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import threading
from collections.abc import Sequence
from typing import Any

import hiredis

_RECV_SIZE = 1 << 16


class RespBaseError(Exception):
    """Base of every error this client raises."""


class RespError(RespBaseError):
    """The server answered with an error reply (``-ERR ...``, ``-NOSCRIPT ...``)."""


class AuthError(RespBaseError):
    """The server refused the password (or a command was sent without one)."""


class RespConnectionError(RespBaseError):
    """The connection could not be made, broke, or timed out.

    ``maybe_applied`` is False only when nothing of the request reached the server;
    ``timed_out`` says the server did not answer in time (hung, or not Redis), which
    retrying at once does not mend.
    """

    def __init__(self, message: str, maybe_applied: bool = True,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied
        self.timed_out = timed_out


Arg = str | bytes | int | float


class RespClient:
    """One lazily opened, password-authenticated connection; thread-safe (one lock per exchange)."""

    def __init__(self, host: str, port: int, password: str | None, *,
                 timeout: float = 10.0, connect_timeout: float = 5.0,
                 username: str = "", tls: ssl.SSLContext | None = None) -> None:
        self.host, self.port = host, port
        self._tls = tls
        self._password = password
        self._username = username  # an ACL user (Redis 6+); "" is the default user
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader = hiredis.Reader(replyError=RespError)
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"RespClient({self.host}:{self.port})"

    def execute(self, *args: Arg, idempotent: bool = True) -> Any:
        """Send one command and return its reply; reconnects and resends once if the
        connection broke (pass ``idempotent=False`` to never resend)."""
        reply = self._exchange(_pack(args), 1, retry=idempotent)[0]
        if isinstance(reply, RespError):
            raise _auth_or(reply)
        return reply

    def pipeline(self, commands: Sequence[tuple[Arg, ...]], *,
                 raise_on_error: bool = True) -> list[Any]:
        """Send every command in one write and return every reply, in order.

        Error replies come back as :class:`RespError` items, or with ``raise_on_error``
        the first is raised once all replies are read. Never resent: a broken
        connection raises :class:`RespConnectionError` (some commands may have run).
        """
        if not commands:
            return []
        payload = b"".join([_pack(c) for c in commands])
        replies = self._exchange(payload, len(commands), retry=False)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, RespError):
                    raise _auth_or(reply)
        return replies

    def close(self) -> None:
        """Close the connection; a later call reconnects."""
        with self._lock:
            self._drop()

    # -- internals ------------------------------------------------------------------

    def _exchange(self, payload: bytes, count: int, retry: bool) -> list[Any]:
        with self._lock:
            for attempt in (1, 2):
                sock = self._connected()
                try:
                    sock.sendall(payload)
                    return [self._read_reply(sock) for _ in range(count)]
                except (OSError, hiredis.ProtocolError) as exc:
                    self._drop()  # the stream is out of step; start afresh
                    if retry and attempt == 1 and not isinstance(exc, TimeoutError):
                        continue
                    raise RespConnectionError(
                        f"connection to {self.host}:{self.port} lost: "
                        f"{exc or type(exc).__name__}",
                        timed_out=isinstance(exc, TimeoutError)) from exc
                except BaseException:  # e.g. KeyboardInterrupt mid-reply: out of step too
                    self._drop()
                    raise
        raise AssertionError("unreachable")

    def _read_reply(self, sock: socket.socket) -> Any:
        reply = self._reader.gets()
        while reply is False:
            data = sock.recv(_RECV_SIZE)
            if not data:
                raise ConnectionResetError("server closed the connection")
            self._reader.feed(data)
            reply = self._reader.gets()
        return reply

    def _connected(self) -> socket.socket:
        """The open socket, (re)connecting and authenticating if needed (lock held)."""
        if self._pid != os.getpid():  # forked: the parent owns that socket's stream
            self._sock, self._pid = None, os.getpid()
        sock = self._sock
        if sock is not None:
            if _idle(sock):
                return sock
            self._drop()
        try:
            sock = socket.create_connection((self.host, self.port), self._connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:  # the handshake runs under the connect timeout
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self._timeout)
        except OSError as exc:  # ssl.SSLError too: a certificate refused, no TLS there
            raise RespConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}",
                                      maybe_applied=False,
                                      timed_out=isinstance(exc, TimeoutError)) from exc
        self._sock, self._reader = sock, hiredis.Reader(replyError=RespError)
        if self._password:
            try:
                auth = ("AUTH", self._username, self._password) if self._username else \
                    ("AUTH", self._password)
                sock.sendall(_pack(auth))
                reply = self._read_reply(sock)
            except (OSError, hiredis.ProtocolError) as exc:
                self._drop()
                raise RespConnectionError(f"cannot authenticate to {self.host}:{self.port}: "
                                          f"{exc}", maybe_applied=False,
                                          timed_out=isinstance(exc, TimeoutError)) from exc
            if isinstance(reply, RespError):
                self._drop()
                raise AuthError(str(reply))
        return sock

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None


def _idle(sock: socket.socket) -> bool:
    """An idle connection should have nothing to read; readable means EOF, a reset, or
    stray bytes (e.g. the server closed it): reconnect before sending anything. Over TLS
    a readable socket may hold only the session tickets a server sends after the
    handshake, which a non-blocking read consumes (raising SSLWantReadError)."""
    poller = select.poll()  # not select.select: fds may exceed FD_SETSIZE
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return not (isinstance(sock, ssl.SSLSocket) and sock.pending())
    if not isinstance(sock, ssl.SSLSocket):
        return False
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        sock.recv(1)  # b"" (closed) or a stray byte: not idle
        return False
    except ssl.SSLWantReadError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


def _pack(args: tuple[Arg, ...]) -> bytes:
    """One command in RESP (hiredis's stub wrongly types the tuple as one item long)."""
    return hiredis.pack_command(args)  # type: ignore[arg-type]


def _auth_or(error: RespError) -> RespBaseError:
    """``error``, or an AuthError if the server wants a (right) password."""
    message = str(error)
    if message.startswith(("NOAUTH", "WRONGPASS")):
        return AuthError(message)
    return error


class Script:
    """A Lua script run with EVALSHA, falling back to EVAL when the server lacks it."""

    def __init__(self, client: RespClient, source: str) -> None:
        self.client = client
        self.source = source
        self._sha: str | None = None

    def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        if self._sha is None:
            import hashlib  # here, not at module import: ~3 ms nobody needs at startup

            self._sha = hashlib.sha1(self.source.encode()).hexdigest()
        try:
            return self.client.execute("EVALSHA", self._sha, len(keys), *keys, *args)
        except RespError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return self.client.execute("EVAL", self.source, len(keys), *keys, *args)
