"""A worker that dies charges a retry only to the task it was running (issue 16, item 4):
the tasks pipelined behind it had not started and are resubmitted free."""

from __future__ import annotations

import os
from pathlib import Path

import rtml
from rtml.exceptions import WorkerCrashedError


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
