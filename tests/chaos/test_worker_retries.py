"""A worker that dies charges a retry only to the task it was running (issue 16, item 4):
the tasks pipelined behind it had not started and are resubmitted free. Workers that
die together are all replaced (item 8)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

import rtml
from rtml import driver
from rtml.core import current
from rtml.exceptions import WorkerCrashedError
from rtml.rpc import messages as m


@rtml.remote(max_retries=0)
def crash_at(flag: str, i: int, crash_on: int) -> int:
    if i == crash_on and not os.path.exists(flag):
        Path(flag).touch()
        os._exit(1)
    return i


def test_only_the_running_task_is_charged_when_its_worker_dies(start_cluster,
                                                               tmp_path) -> None:
    start_cluster(num_cpus=1)  # one worker: every task is pipelined to it
    done = tmp_path / "warm"
    done.touch()
    assert rtml.get([crash_at.remote(str(done), i, -1) for i in range(200)]) == \
        list(range(200))  # short: the owner pipelines up to 16 at a time now
    flag = str(tmp_path / "crashed")
    refs = [crash_at.remote(flag, i, 3) for i in range(40)]
    outcomes = []
    for ref in refs:
        try:
            outcomes.append(rtml.get(ref, timeout=60))
        except WorkerCrashedError:
            outcomes.append("crashed")
    assert outcomes == [*range(3), "crashed", *range(4, 40)]
    assert os.path.exists(flag)



def test_the_pool_refills_to_its_size_after_its_workers_die_at_once(start_cluster) -> None:
    start_cluster(num_cpus=2)
    runtime = current.require_runtime()
    assert rtml.get([crash_at.remote("", i, -1) for i in range(20)]) == list(range(20))
    started = driver._embedded
    assert started is not None
    (zygote,) = psutil.Process(started.procs[-1].pid).children()

    def pool() -> tuple[int, int]:
        """(workers the node manager counts, worker processes)"""
        stats = runtime.links.request(runtime.nm, lambda req_id: m.StoreStats(req_id)).stats
        return int(stats["num_workers"]), len(zygote.children())

    _until(lambda: pool() == (2, 2), "the pool to fill")
    for worker in zygote.children():
        os.kill(worker.pid, signal.SIGKILL)  # all at once
    time.sleep(1.0)  # both deaths seen, their replacements starting
    _until(lambda: pool() == (2, 2), "the pool to refill to its size")


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
