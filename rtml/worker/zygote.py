"""The worker template (zygote) process: imports the worker code once, then forks workers.

    node manager --"<config json>\\n"--> zygote stdin
                                          fork() -> child: stdio to its log, rtml.worker.main.main()
    node manager <--"<pid>\\n"---------- zygote stdout

A fresh Python process spends ~0.5 s importing the worker code before it
can serve; a fork of this already-imported, single-threaded template is ready
in milliseconds. The zygote dies with its node manager, and each worker with
its zygote; exited workers are reaped by the kernel (SIGCHLD ignored here,
restored in each child so user code can wait for its own subprocesses).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from collections.abc import Iterator

import rtml.api  # noqa: F401 - preloaded for the forks: tasks call rtml.get, rtml.remote...
from rtml.daemon import die_with_launcher, die_with_parent
from rtml.worker import main as worker_main


def main(argv: list[str]) -> int:
    die_with_launcher()  # its node manager, which always asks
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # What the imports made lives as long as any worker: out of the collector's sight, its
    # full passes in every worker skip it, and its pages stay shared with the forks (a
    # pass writes to every object it visits).
    gc.freeze()
    # Raw fds, no file objects: a child must not inherit wrappers that would close
    # its fds 0 and 1 (by then its stdin and log) when collected.
    zygote_pid = os.getpid()
    for line in _lines(0):
        pid = os.fork()
        if pid == 0:
            os._exit(_child(json.loads(line), zygote_pid))
        os.write(1, f"{pid}\n".encode())
    return 0


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
