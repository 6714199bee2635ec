"""What every daemon entry point shares: logging, readiness pipes, dying with a parent,
and running its background loops until it is told to stop."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from rtml.config import DIE_WITH_PARENT_ENV
from rtml.exceptions import RtmlSystemError

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: a child only makes the call


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent ``parent_pid`` exits (Linux).

    If the parent is already gone (it exited before the request took effect, so this
    process was adopted and no signal would ever come), die now. Safe in a
    ``preexec_fn``: it only makes system calls.
    """
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def adopt_orphans() -> None:
    """Make this process the one its descendants' orphans are reparented to (Linux's
    child subreaper), instead of init: they can be found, and ended, here."""
    if _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("cannot adopt orphaned processes (prctl: %s)",
                    os.strerror(ctypes.get_errno()))


def die_with_launcher() -> None:
    """At a daemon's entry: die with the process that launched it, if it asked to
    (``DIE_WITH_PARENT_ENV`` holds its pid)."""
    parent_pid = int(os.environ.get(DIE_WITH_PARENT_ENV, "0"))
    if parent_pid:
        die_with_parent(parent_pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0; a process we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def setup_logging(path: str) -> None:
    logging.basicConfig(filename=path, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class ReadyPipe:
    """The pipe on which a daemon tells its launcher that it serves, or why it could not:
    one line, once. Later reports are dropped: the fd is closed by then, and its number
    may already name another file."""

    def __init__(self, fd: int) -> None:
        self._fd = fd  # -1: nobody listens

    def report(self, text: str) -> None:
        """Write ``text`` as the one line (``ok ...`` or ``error ...``). Raises OSError if
        the launcher is gone."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.write(fd, (text + "\n").encode())
            finally:
                os.close(fd)


def run_daemon(name: str, log_name: str, ready: ReadyPipe,
               serve: Coroutine[Any, Any, None]) -> int:
    """Run a daemon's ``serve`` to its end: 0, or 1 when it failed, with the failure in
    its log (``log_name``) and on the ready pipe if it had not reported yet. A
    ``RtmlSystemError`` (one the user can fix: an address, a token) is also printed."""
    try:
        asyncio.run(serve)
    except RtmlSystemError as exc:
        log.error("%s failed: %s", name, exc)
        print(f"rtml {name}: {exc}", file=sys.stderr)
        _report_failure(ready, f"error {exc}")
        return 1
    except Exception:
        log.exception("%s failed", name)
        _report_failure(ready, f"error see {log_name}.log")
        return 1
    return 0


def _report_failure(ready: ReadyPipe, text: str) -> None:
    try:
        ready.report(text)
    except OSError:  # the launcher is gone: nobody to tell
        pass


class _Stopped(Exception):
    """Raised inside the task group to end it once the daemon is told to stop."""


async def _raise_when(stopped: asyncio.Event) -> None:
    await stopped.wait()
    raise _Stopped


async def run_until_stopped(stopped: asyncio.Event,
                            *tasks: Coroutine[Any, Any, None]) -> None:
    """Run a daemon's background tasks in one task group until ``stopped`` is set.

    The group owns them: one that raises cancels the others and its error is raised here
    (the daemon's entry logs it and exits non-zero), instead of a loop ending unseen while
    the daemon goes on half-working. A task may also just return.
    """
    try:
        async with asyncio.TaskGroup() as group:
            for task in tasks:
                group.create_task(task)
            group.create_task(_raise_when(stopped))
    except BaseExceptionGroup as raised:
        errors = [exc for exc in raised.exceptions if not isinstance(exc, _Stopped)]
        if errors:
            raise errors[0] from None  # the first: it cancelled the others
