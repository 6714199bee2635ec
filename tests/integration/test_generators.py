"""Generator tasks and methods (Ray's streaming generators): each item's ref reaches the
caller as it is yielded; a failure is met at its item; cancel stops the producer; a
retried generator does not repeat items."""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

import rtml
from rtml.api import _store_stats
from rtml.core.generators import DynamicObjectRefGenerator
from rtml.exceptions import GetTimeoutError, TaskCancelledError, TaskError

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote
class Gate:
    """Lets a producer go on only when the test says so."""

    def __init__(self) -> None:
        self.opened = 0
        self.taken = 0

    def open(self) -> None:
        self.opened += 1

    def take(self) -> bool:
        if self.taken < self.opened:
            self.taken += 1
            return True
        return False


@rtml.remote
def gated(gate: rtml.ActorHandle, n: int):  # noqa: ANN201 - a generator task
    for i in range(n):
        while not rtml.get(gate.take.remote()):
            time.sleep(0.01)
        yield i


@rtml.remote
def failing(n: int, at: int):  # noqa: ANN201
    for i in range(n):
        if i == at:
            raise KeyError(f"item {i}")
        yield i


@rtml.remote
def counted(path: str, n: int):  # noqa: ANN201
    for i in range(n):
        Path(path).write_text(str(i))
        time.sleep(0.05)
        yield i


@rtml.remote(max_retries=2)
def dies_once(marker: str, n: int):  # noqa: ANN201
    for i in range(n):
        yield i * i
        if i == 2 and not os.path.exists(marker):
            Path(marker).write_text("died")
            os._exit(1)


@rtml.remote
def arrays(n: int):  # noqa: ANN201
    for i in range(n):
        yield np.full(100_000, i, dtype=np.int64)


@rtml.remote
class Producer:
    def numbers(self, n: int):  # noqa: ANN201
        yield from range(n)


@rtml.remote
class AsyncProducer:
    async def numbers(self, n: int):  # noqa: ANN201
        for i in range(n):
            await asyncio.sleep(0.01)
            yield -i


def test_each_item_arrives_while_the_task_still_runs() -> None:
    gate = Gate.remote()
    gen = gated.remote(gate, 3)
    assert isinstance(gen, rtml.ObjectRefGenerator)
    for expected in range(3):
        gate.open.remote()
        assert rtml.get(next(gen), timeout=30) == expected  # the next one waits on the gate
    with pytest.raises(StopIteration):
        next(gen)
    assert rtml.get(gen.completed()) is None and gen.is_finished()


def test_next_with_a_timeout_raises_while_nothing_is_yielded() -> None:
    gate = Gate.remote()
    gen = gated.remote(gate, 1)
    started = time.monotonic()
    with pytest.raises(GetTimeoutError):
        gen.next(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 5
    gate.open.remote()
    assert rtml.get(gen.next(timeout=30)) == 0


def test_a_failure_is_met_at_its_item() -> None:
    seen: list[object] = []
    for ref in failing.remote(5, 2):
        try:
            seen.append(rtml.get(ref))
        except KeyError as exc:
            assert isinstance(exc, TaskError) and "item 2" in str(exc)
            seen.append("error")
    assert seen == [0, 1, "error"]
    gen = failing.remote(3, 0)
    with pytest.raises(KeyError):
        rtml.get(next(gen))
    with pytest.raises(KeyError):
        rtml.get(gen.completed())


def test_large_items_and_generator_methods() -> None:
    assert [int(rtml.get(ref)[0]) for ref in arrays.remote(3)] == [0, 1, 2]
    assert [rtml.get(r) for r in Producer.remote().numbers.remote(4)] == [0, 1, 2, 3]
    assert [rtml.get(r) for r in AsyncProducer.remote().numbers.remote(3)] == [0, -1, -2]


def test_async_iteration() -> None:
    async def consume() -> list[int]:
        return [await ref async for ref in Producer.remote().numbers.remote(3)]

    assert asyncio.run(consume()) == [0, 1, 2]


def test_a_task_consumes_another_tasks_generator() -> None:
    @rtml.remote
    def total(n: int) -> int:
        return sum(rtml.get(ref) for ref in Producer.remote().numbers.remote(n))

    assert rtml.get(total.remote(5)) == 10


def test_cancel_stops_the_producer(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    gen = counted.remote(str(progress), 1000)
    assert rtml.get(next(gen)) == 0
    rtml.cancel(gen)
    with pytest.raises(TaskCancelledError):
        for ref in gen:
            rtml.get(ref)
    time.sleep(0.3)
    stopped_at = int(progress.read_text())
    time.sleep(0.5)
    assert int(progress.read_text()) == stopped_at < 100


def test_a_retried_generator_does_not_repeat_its_items(tmp_path: Path) -> None:
    marker = tmp_path / "died"
    got = [rtml.get(ref) for ref in dies_once.remote(str(marker), 6)]
    assert marker.read_text() == "died"  # its first worker died after three items
    assert got == [0, 1, 4, 9, 16, 25]


def test_an_abandoned_generator_frees_its_items() -> None:
    gen = arrays.remote(4)
    first = next(gen)
    del gen
    assert int(rtml.get(first)[0]) == 0
    del first
    deadline = time.monotonic() + 10
    while _store_stats()["num_objects"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _store_stats()["num_objects"] == 0


def test_what_cannot_be_a_generator() -> None:
    gen = Producer.remote().numbers.remote(1)
    with pytest.raises(TypeError, match="cannot be passed"):
        pickle.dumps(gen)
    with pytest.raises(ValueError, match="async def"):
        @rtml.remote
        async def agen():  # noqa: ANN202
            yield 1

    @rtml.remote(num_returns="streaming")
    def not_a_generator() -> int:
        return 1

    with pytest.raises(TypeError, match="not a generator"):
        rtml.get(next(not_a_generator.remote()))


def test_dynamic_returns_give_every_items_ref_at_the_end() -> None:
    ref = arrays.options(num_returns="dynamic").remote(3)
    assert isinstance(ref, rtml.ObjectRef)
    refs = rtml.get(ref)
    assert isinstance(refs, DynamicObjectRefGenerator) and len(refs) == 3
    assert [int(rtml.get(r)[0]) for r in refs] == [0, 1, 2]
    with pytest.raises(KeyError, match="item 1"):
        rtml.get(failing.options(num_returns="dynamic").remote(3, 1))

    @rtml.remote
    def total(generator_ref: list[rtml.ObjectRef]) -> int:  # its value, passed on
        return sum(int(rtml.get(r)[0]) for r in generator_ref)

    assert rtml.get(total.remote(ref)) == 3
    method = Producer.remote().numbers.options(num_returns="dynamic")
    assert [rtml.get(r) for r in rtml.get(method.remote(2))] == [0, 1]
