"""rtml.util's ActorPool and Queue on an embedded 2-CPU node, with Ray's semantics:
pool order, completeness, errors, timeouts and membership; queue order across
processes, blocking, bounds, batches and shutdown."""

from __future__ import annotations

import asyncio
import os
import queue as stdlib_queue
import time
from typing import Any

import cloudpickle
import pytest

import rtml
from rtml.exceptions import ActorDiedError, TaskError
from rtml.util import ActorPool
from rtml.util.queue import Empty, Full, Queue

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote
class Worker:
    def double(self, value: int) -> int:
        return 2 * value

    def slow_double(self, pair: tuple[float, int]) -> int:
        seconds, value = pair
        time.sleep(seconds)
        return 2 * value

    def fail_on(self, value: int) -> int:
        if value == 3:
            raise ValueError(f"refusing value {value}")
        return value

    def pid(self, _: object = None) -> int:
        return os.getpid()


def two_workers() -> list[Any]:
    workers = [Worker.remote(), Worker.remote()]
    assert len(set(rtml.get([w.pid.remote() for w in workers], timeout=60))) == 2
    return workers


def double(actor: Any, value: int) -> rtml.ObjectRef:
    return actor.double.remote(value)


def slow_double(actor: Any, pair: tuple[float, int]) -> rtml.ObjectRef:
    return actor.slow_double.remote(pair)


# -- ActorPool -------------------------------------------------------------------------


def test_map_yields_results_in_input_order_even_when_later_ones_finish_first() -> None:
    pool = ActorPool(two_workers())
    # The first value takes longest: an unordered pool would yield it last.
    values = [(0.6, 1), (0.0, 2), (0.1, 3), (0.0, 4), (0.0, 5)]
    assert list(pool.map(slow_double, values)) == [2, 4, 6, 8, 10]
    assert list(pool.map(double, range(7))) == [0, 2, 4, 6, 8, 10, 12]  # the pool is reusable
    assert not pool.has_next() and pool.has_free()


def test_map_unordered_yields_every_result_the_fast_ones_first() -> None:
    pool = ActorPool(two_workers())
    values = [(1.0, 1), (0.0, 2), (0.0, 3), (0.0, 4)]
    results = list(pool.map_unordered(slow_double, values))
    assert sorted(results) == [2, 4, 6, 8]
    assert results[-1] == 2, results  # the one-second task, on its own actor, ends last


def test_submit_spreads_over_the_actors_and_get_next_keeps_submission_order() -> None:
    workers = two_workers()
    pool = ActorPool(workers)
    for value in range(4):
        pool.submit(lambda actor, v: actor.pid.remote(v), value)
    assert not pool.has_free()  # both busy, two submits pending
    pids = [pool.get_next() for _ in range(4)]
    assert set(pids) == set(rtml.get([w.pid.remote() for w in workers]))
    assert not pool.has_next()
    with pytest.raises(StopIteration, match="No more results to get"):
        pool.get_next()
    with pytest.raises(StopIteration, match="No more results to get"):
        pool.get_next_unordered()


def test_a_failing_task_raises_from_get_next_and_its_actor_returns_to_the_pool() -> None:
    pool = ActorPool(two_workers())
    for value in range(1, 6):
        pool.submit(lambda actor, v: actor.fail_on.remote(v), value)
    assert [pool.get_next(), pool.get_next()] == [1, 2]
    with pytest.raises(ValueError, match="refusing value 3") as info:
        pool.get_next()
    assert isinstance(info.value, TaskError)
    assert [pool.get_next(), pool.get_next()] == [4, 5]
    assert pool.has_free() and pool.pop_idle() is not None and pool.pop_idle() is not None
    assert pool.pop_idle() is None  # both actors came back, the failed one's too


def test_the_pool_keeps_working_after_a_failed_map() -> None:
    pool = ActorPool(two_workers())
    results = pool.map(lambda actor, v: actor.fail_on.remote(v), [1, 2, 3, 4])
    assert [next(results), next(results)] == [1, 2]
    with pytest.raises(ValueError, match="refusing value 3"):
        next(results)
    assert list(pool.map(double, [10, 20, 30])) == [20, 40, 60]


def test_get_next_times_out_and_can_wait_again_or_drop_the_task() -> None:
    pool = ActorPool(two_workers())
    pool.submit(slow_double, (1.5, 21))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="Timed out waiting for result"):
        pool.get_next(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 1.2
    assert pool.has_next()  # not dropped: the next get_next waits for it
    assert pool.get_next(timeout=10) == 42

    pool.submit(slow_double, (1.5, 1))
    with pytest.raises(TimeoutError, match="has been ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next() and pool.has_free()
    with pytest.raises(StopIteration):
        pool.get_next()


def test_get_next_unordered_times_out_and_can_drop_the_oldest_task() -> None:
    pool = ActorPool(two_workers())
    pool.submit(slow_double, (1.5, 1))
    pool.submit(slow_double, (1.5, 2))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="Timed out waiting for result"):
        pool.get_next_unordered(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 1.2
    with pytest.raises(TimeoutError, match="has been ignored"):
        pool.get_next_unordered(timeout=0.0, ignore_if_timedout=True)
    assert pool.get_next_unordered(timeout=10) == 4  # the second one is left
    assert not pool.has_next()


def test_pop_idle_and_push_change_the_pool_and_push_refuses_a_member() -> None:
    first, second = two_workers()
    pool = ActorPool([first, second])
    taken = pool.pop_idle()
    assert taken in (first, second)
    left = second if taken == first else first
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(left)  # idle in the pool
    pool.submit(lambda actor, v: actor.pid.remote(v), 0)
    pool.submit(lambda actor, v: actor.pid.remote(v), 1)  # pending: one actor only
    assert not pool.has_free() and pool.pop_idle() is None
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(left)  # busy in the pool
    pool.push(taken)  # takes the pending submit at once
    pids = {pool.get_next(timeout=30), pool.get_next(timeout=30)}
    assert pids == set(rtml.get([first.pid.remote(), second.pid.remote()]))


# -- Queue -----------------------------------------------------------------------------


@rtml.remote
def produce(queue: Queue, items: list[int]) -> float:
    for item in items:
        queue.put(item)
    return time.monotonic()


@rtml.remote
def put_later(queue: Queue, seconds: float, item: str) -> None:
    time.sleep(seconds)
    queue.put(item)


@rtml.remote
class Consumer:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def take(self, count: int) -> list[int]:
        return [self.queue.get(timeout=10) for _ in range(count)]


def test_items_come_out_in_fifo_order_from_a_producer_task_to_the_driver() -> None:
    q = Queue()
    rtml.get(produce.remote(q, list(range(20))), timeout=60)
    assert q.qsize() == len(q) == 20
    assert [q.get(timeout=10) for _ in range(20)] == list(range(20))
    assert q.empty() and not q.full()


def test_an_actor_holding_the_queue_gets_what_the_driver_puts() -> None:
    q = Queue()
    consumer = Consumer.remote(q)
    taken = consumer.take.remote(3)
    for item in (7, 8, 9):
        q.put(item)
    assert rtml.get(taken, timeout=30) == [7, 8, 9]
    copy = cloudpickle.loads(cloudpickle.dumps(q))  # the same queue, not a new one
    copy.put("via copy")
    assert q.get(timeout=10) == "via copy"


def test_a_blocking_get_is_woken_by_a_put_from_another_task() -> None:
    q = Queue()
    q.put("warm")  # the actor is up: the wait below is the put's, not start-up
    assert q.get() == "warm"
    put_later.remote(q, 0.5, "hello")
    started = time.monotonic()
    assert q.get(timeout=20) == "hello"
    assert 0.4 < time.monotonic() - started < 5.0


def test_nowait_and_timeouts_raise_full_and_empty() -> None:
    q = Queue(maxsize=1)
    with pytest.raises(Empty, match="empty"):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(block=False)
    started = time.monotonic()
    with pytest.raises(Empty, match="within 0.3 s"):
        q.get(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2.0
    q.put_nowait("a")
    assert q.full() and q.qsize() == 1
    with pytest.raises(Full, match="maxsize 1"):
        q.put_nowait("b")
    started = time.monotonic()
    with pytest.raises(Full) as info:
        q.put("b", timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2.0
    assert isinstance(info.value, stdlib_queue.Full) and not isinstance(info.value, TaskError)
    with pytest.raises(ValueError, match="non-negative"):
        q.put("b", timeout=-1)
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-0.5)
    assert q.get(timeout=0) == "a"  # an item already there is served even at timeout 0
    q.put("c", timeout=0)
    assert q.get_nowait() == "c"


def test_batches_put_all_or_none_and_get_all_or_none() -> None:
    q = Queue(maxsize=3)
    with pytest.raises(Full, match="Cannot add 4 items"):
        q.put_nowait_batch([1, 2, 3, 4])
    assert q.qsize() == 0  # none went in
    q.put_nowait_batch(iter([1, 2]))
    with pytest.raises(Empty, match="Cannot get 3 items"):
        q.get_nowait_batch(3)
    assert q.qsize() == 2  # none came out
    assert q.get_nowait_batch(2) == [1, 2]
    assert q.get_nowait_batch(0) == []
    with pytest.raises(ValueError, match="nonnegative"):
        q.get_nowait_batch(-1)
    with pytest.raises(TypeError, match="int"):
        q.get_nowait_batch(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable"):
        q.put_nowait_batch(5)  # type: ignore[arg-type]


def test_a_bounded_queue_holds_the_producer_until_the_consumer_takes() -> None:
    q = Queue(maxsize=2)
    done = produce.remote(q, [1, 2, 3, 4, 5])
    ready, _ = rtml.wait([done], timeout=1.5)
    assert not ready and q.qsize() == 2  # blocked on the third put
    took_at = time.monotonic()
    assert [q.get(timeout=10) for _ in range(5)] == [1, 2, 3, 4, 5]
    assert rtml.get(done, timeout=10) >= took_at  # it finished only once items were taken


def test_put_async_and_get_async_await_the_queue() -> None:
    q = Queue(maxsize=1)

    async def roundtrip() -> list[object]:
        waiting = asyncio.ensure_future(q.get_async(timeout=10))
        await q.put_async("x")
        first = await waiting
        await q.put_async("y")
        with pytest.raises(Full):
            await q.put_async("z", block=False)
        return [first, await q.get_async()]

    assert asyncio.run(roundtrip()) == ["x", "y"]


def test_shutdown_kills_the_actor_for_every_copy_of_the_queue() -> None:
    q = Queue()
    q.put(1)
    copy = cloudpickle.loads(cloudpickle.dumps(q))  # as a task or an actor holds it
    q.shutdown()
    with pytest.raises(ActorDiedError):
        copy.get(timeout=30)
    with pytest.raises(ActorDiedError, match="shut down"):
        q.put(2)
    q.shutdown()  # a second one is a no-op

    forced = Queue()
    forced.put(1)
    held = forced.actor
    forced.shutdown(force=True)
    with pytest.raises(ActorDiedError):
        rtml.get(held.qsize.remote(), timeout=30)
