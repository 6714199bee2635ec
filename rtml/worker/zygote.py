"""The worker template (zygote) process: imports the worker code once, then forks workers.

    node manager --"<config json>\\n"--> zygote stdin
                                          fork() -> child: stdio to its log, rtml.worker.main.main()
    node manager <--"<pid>\\n"---------- zygote stdout
    node manager --'{"reap": true}\\n'--> (a worker exited) kill the processes it left

A fresh Python process spends ~0.5 s importing the worker code before it
can serve; a fork of this already-imported, single-threaded template is ready
in milliseconds. The zygote dies with its node manager, and each worker with
its zygote; exited workers are reaped by the kernel (SIGCHLD ignored here,
restored in each child so user code can wait for its own subprocesses). What a
worker's tasks started and left running when it died is reparented here (the zygote
is their subreaper) and killed on the node manager's next reap request, sent when a
worker exits. Orphans are not told apart: a daemon that a live worker's task detached
(double fork) is ended then too, as Ray's subreaper does.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from collections.abc import Iterator

import rtml.api  # noqa: F401 - preloaded for the forks: tasks call rtml.get, rtml.remote...
from rtml.config import ZYGOTE_REAP
from rtml.daemon import adopt_orphans, die_with_launcher, die_with_parent
from rtml.worker import main as worker_main


def main(argv: list[str]) -> int:
    die_with_launcher()  # its node manager, which always asks
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    adopt_orphans()  # what a dead worker started comes here, to be ended (see ZYGOTE_REAP)
    # What the imports made lives as long as any worker: out of the collector's sight, its
    # full passes in every worker skip it, and its pages stay shared with the forks (a
    # pass writes to every object it visits).
    gc.freeze()
    # Raw fds, no file objects: a child must not inherit wrappers that would close
    # its fds 0 and 1 (by then its stdin and log) when collected.
    zygote_pid = os.getpid()
    workers: set[int] = set()
    for line in _lines(0):
        request = json.loads(line)
        if request.get(ZYGOTE_REAP):
            workers = _end_orphans(zygote_pid, workers)
            continue
        pid = os.fork()
        if pid == 0:
            os._exit(_child(request, zygote_pid))
        workers.add(pid)
        os.write(1, f"{pid}\n".encode())
    return 0


def _end_orphans(zygote_pid: int, workers: set[int]) -> set[int]:
    """Kill our children that we did not fork: processes a worker started that outlived
    it (adopted here, see ``adopt_orphans``), as Ray ends them. Returns the workers still
    alive."""
    children = _children(zygote_pid)
    for pid in children - workers:
        try:
            pidfd = os.pidfd_open(pid)  # the process itself from here on, whatever ends
        except ProcessLookupError:
            continue
        try:
            if pid in _children(zygote_pid):  # still ours: not a new process with its pid
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
    return workers & children


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(child) for child in f.read().split()}


def _lines(fd: int) -> Iterator[bytes]:
    buffered = b""
    while chunk := os.read(fd, 65536):
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        yield from lines


def _child(request: dict[str, str], zygote_pid: int) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    die_with_parent(zygote_pid)
    log_fd = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.close(null_fd)
    sys.stdin = open(0)  # noqa: SIM115 - the worker's stdio for its whole life
    sys.stdout = open(1, "w", buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1)  # noqa: SIM115
    try:
        return worker_main.main(["worker_main", request["config"]])
    except BaseException:
        import traceback
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
