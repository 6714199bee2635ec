"""Ray's per-method and per-task options (issue 19): ``@rtml.method(...)`` defaults
(num_returns, max_task_retries, retry_exceptions, concurrency_group), actor concurrency
groups, and ``max_calls``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter

import pytest

import rtml

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote(concurrency_groups={"io": 2, "compute": 1})
class Grouped:
    @rtml.method(concurrency_group="io")
    def io(self, seconds: float) -> str:
        time.sleep(seconds)
        return threading.current_thread().name

    @rtml.method(concurrency_group="compute")
    def compute(self) -> str:
        return threading.current_thread().name

    def default(self) -> str:
        return threading.current_thread().name


@rtml.remote(concurrency_groups={"slow": 1})
class AsyncGrouped:
    @rtml.method(concurrency_group="slow")
    async def slow(self) -> str:
        await asyncio.sleep(0.4)
        return "slow"

    async def fast(self) -> str:
        return "fast"


@rtml.remote(max_task_retries=0)
class Flaky:
    def __init__(self) -> None:
        self.calls = 0

    @rtml.method(retry_exceptions=[RuntimeError], max_task_retries=3)
    def flaky(self) -> int:
        self.calls += 1
        if self.calls < 3:
            raise RuntimeError("not yet")
        return self.calls

    @rtml.method(retry_exceptions=True, max_task_retries=1)
    def always(self) -> None:
        raise ValueError("never")

    @rtml.method(num_returns=2)
    def pair(self) -> tuple[int, int]:
        return 1, 2


@rtml.remote(max_calls=2, max_retries=0)
def pid() -> int:
    return os.getpid()


def test_concurrency_groups_run_apart() -> None:
    actor = Grouped.remote()
    started = time.monotonic()
    names = rtml.get([actor.io.remote(0.5), actor.io.remote(0.5)])
    assert time.monotonic() - started < 0.95  # the io group runs two at once
    assert all(n.startswith("rtml-actor-io") for n in names) and len(set(names)) == 2
    assert rtml.get(actor.compute.remote()).startswith("rtml-actor-compute")
    assert rtml.get(actor.default.remote()).startswith("rtml-actor_")
    moved = actor.io.options(concurrency_group="compute").remote(0)  # a call's own wins
    assert rtml.get(moved).startswith("rtml-actor-compute")
    with pytest.raises(ValueError, match="concurrency group 'nope'.*'compute', 'io'"):
        rtml.get(actor.default.options(concurrency_group="nope").remote())


def test_an_async_actors_groups_have_their_own_limits() -> None:
    actor = AsyncGrouped.remote()
    assert rtml.get(actor.fast.remote()) == "fast"
    started = time.monotonic()
    slow = [actor.slow.remote() for _ in range(2)]
    assert rtml.get(actor.fast.remote()) == "fast"
    assert time.monotonic() - started < 0.3  # not behind the slow group
    assert rtml.get(slow) == ["slow", "slow"]
    assert time.monotonic() - started >= 0.75  # one slow at a time


def test_method_defaults_retry_its_exceptions_and_return_pairs() -> None:
    actor = Flaky.remote()
    assert rtml.get(actor.flaky.remote()) == 3  # two failures retried
    with pytest.raises(ValueError, match="never"):
        rtml.get(actor.always.remote())
    assert rtml.get(actor.pair.remote()) == [1, 2]
    with pytest.raises(ValueError, match="concurrency_groups"):
        Grouped.options(concurrency_groups={"io": 0})
    with pytest.raises(TypeError, match="keyword"):
        rtml.method(lambda self: None)


def test_a_worker_exits_after_max_calls() -> None:
    pids = rtml.get([pid.remote() for _ in range(12)])
    assert sorted(Counter(pids).values()) == [2] * 6  # and none failed (max_retries=0)
    with pytest.raises(ValueError, match="max_calls"):
        pid.options(max_calls=-1)
