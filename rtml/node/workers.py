"""Starting, watching and killing the node's worker processes (the I/O of the pool).

    WorkerLauncher.spawn(worker_id, config) --request--> zygote --fork--> worker
                                            <--pid------
    pidfd readable (the worker exited) --> on_exit(worker); the zygote kills what it left

The zygote is started by the process's entry (``rtml.node.main``) before the node
manager's imports, and adopted here.

Exits are seen through a pidfd the moment they happen, whoever reaps the
process; nothing polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rtml.config import ZYGOTE_REAP, WorkerConfig
from rtml.exceptions import RtmlSystemError
from rtml.ids import NO_ACTOR, ActorID, WorkerID

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerProc:
    worker_id: WorkerID
    actor_id: ActorID = NO_ACTOR
    pid: int = 0
    peer: Any = None
    address: str = ""  # unix socket (owners on this node)
    tcp_address: str = ""  # owners on other nodes
    actor_ready: bool = False  # its actor's constructor ran
    gone: bool = False
    pidfd: int = -1  # open while the process is known to be alive
    doomed: bool = False  # killed before its fork was reported: killed once it is
    runtime_env: str = ""  # the env it was started for (a pool worker's: "")

    def kill(self) -> None:
        """SIGKILL the worker through its pidfd: never a process that reused its pid."""
        self.doomed = True
        if self.pidfd >= 0 and not self.gone:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)


REAP_REQUEST = (json.dumps({ZYGOTE_REAP: True}) + "\n").encode()


class WorkerLauncher:
    """Forks workers from a zygote and reports each one's exit exactly once."""

    def __init__(self, zygote: subprocess.Popen[bytes],
                 on_exit: Callable[[WorkerProc, str], None]) -> None:
        self.on_exit = on_exit
        self._zygote = zygote
        self._requests: asyncio.WriteTransport | None = None
        self._waiting: deque[WorkerProc] = deque()
        self._pids = asyncio.StreamReader()

    async def start(self) -> None:
        """Adopt the zygote's pipes (it may still be importing: requests wait in its pipe)."""
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self._pids),
                                     self._zygote.stdout)
        self._requests, _ = await loop.connect_write_pipe(asyncio.Protocol, self._zygote.stdin)

    def spawn(self, worker: WorkerProc, config: WorkerConfig, log_path: str) -> None:
        """Ask the zygote for a worker; its pid arrives asynchronously."""
        requests = self._requests
        if requests is None or requests.is_closing() or self._zygote.poll() is not None:
            raise RtmlSystemError("the worker zygote is not running; see node_manager.log")
        self._waiting.append(worker)
        request = {"config": config.to_json(), "log_path": log_path}
        requests.write((json.dumps(request) + "\n").encode())

    async def read_pids(self) -> None:
        """Watch each forked worker from the pid the zygote reports (a background task of
        the node manager's, from :meth:`start` on); returns when the zygote exits."""
        while line := await self._pids.readline():
            self._watch(self._waiting.popleft(), int(line))
        code = await asyncio.to_thread(self._zygote.wait)
        log.error("the worker zygote exited (code %s)", code)
        while self._waiting:
            self._report(self._waiting.popleft(), "the worker zygote exited")

    def _watch(self, worker: WorkerProc, pid: int) -> None:
        worker.pid = pid
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._report(worker, "exited at once")
            return
        worker.pidfd = pidfd
        loop = asyncio.get_running_loop()
        loop.add_reader(pidfd, self._exited, worker, pidfd)
        if worker.doomed:  # e.g. its actor was killed while the zygote forked it
            worker.kill()

    def _exited(self, worker: WorkerProc, pidfd: int) -> None:
        asyncio.get_running_loop().remove_reader(pidfd)
        worker.pidfd = -1
        os.close(pidfd)
        requests = self._requests
        if requests is not None and not requests.is_closing():
            requests.write(REAP_REQUEST)  # what it started dies with it, as in Ray
        self._report(worker, "process exited")

    def _report(self, worker: WorkerProc, reason: str) -> None:
        if not worker.gone:
            self.on_exit(worker, reason)

    async def stop(self, workers: list[WorkerProc]) -> None:
        """Kill every worker and the zygote."""
        for worker in workers:
            worker.kill()
            worker.gone = True
        zygote = self._zygote
        if zygote.poll() is None:
            zygote.kill()
            await asyncio.to_thread(zygote.wait)
        if self._requests is not None:
            self._requests.close()
