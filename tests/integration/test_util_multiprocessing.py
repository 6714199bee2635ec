"""rtml.util.multiprocessing.Pool on an embedded 2-CPU node: Python's Pool on actors."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

import rtml
from rtml.exceptions import ActorDiedError, TaskError
from rtml.util.multiprocessing import Pool, TimeoutError

pytestmark = pytest.mark.usefixtures("cluster")

TAG: str | None = None
INIT_CALLS = 0


def remember(tag: str) -> None:  # a pool's initializer
    global TAG, INIT_CALLS
    TAG = tag
    INIT_CALLS += 1


def fail_to_start() -> None:
    raise RuntimeError("no licence server")


def tag_and_pid(_: object) -> tuple[str | None, int, int]:
    time.sleep(0.02)  # long enough that both processes take chunks
    return TAG, INIT_CALLS, os.getpid()


def square(x: int) -> int:
    return x * x


def add(a: int, b: int, c: int = 0) -> int:
    return a + b + c


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def pid_after_nap(_: object) -> int:
    time.sleep(0.05)
    return os.getpid()


def nap_then_index(index: int, seconds: float) -> int:
    time.sleep(seconds)
    return index


def slower_first(x: int) -> int:
    time.sleep(0.01 * (5 - x % 5))  # in each run of 5, the earlier items finish later
    return x * x


def fail_on_3(x: int) -> int:
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x


def fail_with(message: str) -> None:
    raise KeyError(message)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: set[int], within: float = 5.0) -> set[int]:
    """The pids still alive after ``within`` seconds (empty once all have exited)."""
    deadline = time.monotonic() + within
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {pid for pid in pids if alive(pid)}


@pytest.fixture
def pool(cluster: None) -> Iterator[Pool]:
    with Pool(processes=2) as pool:
        yield pool


def test_map_and_starmap_match_the_builtins(pool: Pool) -> None:
    assert pool.map(square, range(100)) == list(map(square, range(100)))
    assert pool.map(square, (x for x in range(23)), chunksize=7) == [x * x for x in range(23)]
    assert pool.map(square, []) == []
    pairs = [(b, e) for b in range(5) for e in range(4)]
    assert pool.starmap(pow, pairs) == list(itertools.starmap(pow, pairs))
    assert pool.starmap_async(add, pairs, chunksize=3).get(timeout=10) == [
        b + e for b, e in pairs]
    assert pool.apply(add, (1, 2), {"c": 3}) == 6
    assert pool.apply(add, (1, 2), kwargs={"c": 4}) == 7  # Ray's name for kwds
    with pytest.raises(ValueError, match="chunksize must be a positive int"):
        pool.map(square, range(3), chunksize=0)


def test_two_processes_run_at_once_and_default_to_the_cluster_cpus(cluster: None) -> None:
    with Pool() as pool:  # processes=None: the cluster's 2 CPUs
        pids = set(pool.map(pid_after_nap, range(8), chunksize=1))
        assert len(pids) == 2 and os.getpid() not in pids
        start = time.monotonic()
        assert pool.map(nap, [0.5, 0.5], chunksize=1) == [0.5, 0.5]
        assert time.monotonic() - start < 0.9  # side by side, not one after the other
    with pytest.raises(ValueError, match="at most 2"):
        Pool(processes=3)
    with pytest.raises(ValueError, match="at least 1"):
        Pool(processes=0)


def test_imap_is_ordered_and_lazy(pool: Pool) -> None:
    assert list(pool.imap(slower_first, range(20))) == [x * x for x in range(20)]
    assert list(pool.imap(square, range(10), chunksize=3)) == [x * x for x in range(10)]
    endless = pool.imap(square, itertools.count())
    assert [next(endless) for _ in range(10)] == [x * x for x in range(10)]
    pulled: list[int] = []

    def source() -> Iterator[int]:
        for i in range(200):
            pulled.append(i)
            yield i

    results = pool.imap(square, source())
    assert next(results) == 0
    assert len(pulled) < 20  # a window of chunks, not the whole input
    assert list(results) == [x * x for x in range(1, 200)]


def test_imap_unordered_yields_every_result_once_as_it_is_done(pool: Pool) -> None:
    assert sorted(pool.imap_unordered(square, range(50), chunksize=4)) == [
        x * x for x in range(50)]
    # starmap-like items through a one-argument wrapper: item 0 naps, the rest do not.
    jobs = [(0, 0.6)] + [(i, 0.0) for i in range(1, 10)]
    order = list(pool.imap_unordered(star_nap_then_index, jobs))
    assert sorted(order) == list(range(10))
    assert order[0] != 0  # the slow one did not hold the others back
    assert order.index(0) > 0


def star_nap_then_index(job: tuple[int, float]) -> int:
    return nap_then_index(*job)


def test_apply_async_callback_runs_in_the_driver(pool: Pool) -> None:
    seen: list[tuple[Any, int]] = []
    result = pool.apply_async(add, (2, 3), callback=lambda v: seen.append((v, os.getpid())))
    assert result.get(timeout=10) == 5
    assert seen == [(5, os.getpid())]  # called here, once, before get() returned
    assert result.ready() and result.successful()
    lists: list[list[int]] = []
    mapped = pool.map_async(square, range(10), chunksize=2, callback=lists.append)
    mapped.wait(timeout=10)
    assert mapped.ready() and lists == [[x * x for x in range(10)]]  # the whole list


def test_error_callback_gets_the_users_exception(pool: Pool) -> None:
    values: list[Any] = []
    errors: list[BaseException] = []
    result = pool.apply_async(fail_with, ("no such key",), callback=values.append,
                              error_callback=errors.append)
    with pytest.raises(KeyError) as raised:
        result.get(timeout=10)
    assert isinstance(raised.value, TaskError) and "fail_with" in str(raised.value)
    assert errors == [raised.value] and values == []
    assert result.ready() and not result.successful()
    failed: list[BaseException] = []
    mapped = pool.map_async(fail_on_3, range(10), callback=values.append,
                            error_callback=failed.append)
    mapped.wait(timeout=10)
    assert len(failed) == 1 and isinstance(failed[0], ValueError) and values == []


def test_map_raises_the_users_exception_and_imap_goes_on_after_it(pool: Pool) -> None:
    with pytest.raises(ValueError, match="bad item 3") as raised:
        pool.map(fail_on_3, range(10))
    assert isinstance(raised.value, TaskError)
    assert "fail_on_3" in str(raised.value)  # the remote traceback
    assert pool.map(square, range(3)) == [0, 1, 4]  # the pool still works
    results = pool.imap(fail_on_3, range(6))
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad item 3"):
        next(results)
    assert list(results) == [4, 5]  # as Python: the failure only at its own place


def test_get_with_a_timeout_raises_multiprocessing_timeout_error(pool: Pool) -> None:
    assert TimeoutError is multiprocessing.TimeoutError
    slow = pool.apply_async(nap, (3.0,))
    start = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError):
        slow.get(timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 1.5
    assert not slow.ready()
    with pytest.raises(ValueError, match="not ready"):
        slow.successful()
    results = pool.imap(nap, [3.0])  # the other process
    start = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError):
        results.next(timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 1.5
    # (the fixture terminates the pool: the naps do not hold the test up)


def test_initializer_runs_once_in_each_process(cluster: None) -> None:
    with Pool(2, initializer=remember, initargs=("tag-7",)) as pool:
        seen = pool.map(tag_and_pid, range(8), chunksize=1)
    assert {tag for tag, _, _ in seen} == {"tag-7"}
    assert {calls for _, calls, _ in seen} == {1}
    assert len({pid for _, _, pid in seen}) == 2
    assert TAG is None and INIT_CALLS == 0  # it ran in the processes, not here


def test_an_initializer_that_raises_fails_the_pool(cluster: None) -> None:
    with pytest.raises(ActorDiedError, match="initializer fail_to_start") as raised:
        Pool(1, initializer=fail_to_start)
    assert "no licence server" in str(raised.value)


def test_maxtasksperchild_replaces_the_process(cluster: None) -> None:
    with Pool(1, maxtasksperchild=2) as pool:
        pids = [pool.apply(os.getpid) for _ in range(4)]
        assert pids[0] == pids[1] != pids[2] == pids[3]
        assert wait_gone({pids[0]}) == set()  # the retired process ended


def test_close_then_join_finishes_the_work_then_releases_the_processes(pool: Pool) -> None:
    pids = set(pool.map(pid_after_nap, range(4), chunksize=1))
    pending = pool.map_async(nap, [0.3, 0.3])
    unconsumed = pool.imap(square, range(30))
    with pytest.raises(ValueError, match="Pool is still running"):
        pool.join()
    pool.close()
    for use in (lambda: pool.apply(square, (2,)), lambda: pool.map(square, [1]),
                lambda: pool.imap(square, [1]), lambda: pool.apply_async(square, (1,))):
        with pytest.raises(ValueError, match="Pool not running"):
            use()
    pool.join()
    assert pending.ready() and pending.get(timeout=0) == [0.3, 0.3]
    assert list(unconsumed) == [x * x for x in range(30)]  # ran though nobody iterated
    assert wait_gone(pids) == set()
    with pytest.raises(ValueError, match="Pool not running"), pool:
        pass


def test_terminate_kills_the_processes_and_fails_what_was_running(pool: Pool) -> None:
    pids = set(pool.map(pid_after_nap, range(4), chunksize=1))
    running = pool.apply_async(nap, (30.0,))
    pool.terminate()
    with pytest.raises(ActorDiedError):
        running.get(timeout=10)
    start = time.monotonic()
    pool.join()
    assert time.monotonic() - start < 2.0
    assert wait_gone(pids) == set()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, range(3))


def test_leaving_the_with_block_terminates_the_pool(cluster: None) -> None:
    with Pool(2) as pool:
        pids = set(pool.map(pid_after_nap, range(4), chunksize=1))
        running = pool.apply_async(nap, (30.0,))
        assert repr(pool).endswith("state=RUN pool_size=2>")
    with pytest.raises(ActorDiedError):
        running.get(timeout=10)
    assert wait_gone(pids) == set()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.apply(square, (3,))


def test_a_pool_does_not_pickle(pool: Pool) -> None:
    with pytest.raises(NotImplementedError, match="cannot be pickled"):
        pickle.dumps(pool)


def test_imap_hands_out_what_was_submitted_then_says_the_pool_is_gone(pool: Pool) -> None:
    results = pool.imap(square, range(100))
    assert next(results) == 0
    pool.close()
    pool.join()  # submits the rest: all 100 ran
    assert list(results) == [x * x for x in range(1, 100)]
    with Pool(2) as other:
        endless = other.imap(nap, itertools.repeat(0.01))
        assert next(endless) == 0.01
    outcomes: list[Any] = []  # leaving the block terminated the pool
    with pytest.raises(ValueError, match="Pool not running"):
        while len(outcomes) < 100:
            try:
                outcomes.append(next(endless))
            except ActorDiedError as exc:
                outcomes.append(exc)
    assert len(outcomes) <= 8  # just the chunks in flight (4 a process), not the input


def test_a_pool_starts_a_local_cluster_when_rtml_is_not_initialized(
        start_cluster: Any) -> None:
    rtml.shutdown()  # (start_cluster only to shut down what the Pool starts)
    with Pool(processes=1) as pool:  # rtml.init(num_cpus=processes), as Ray's
        assert rtml.cluster_resources()["CPU"] == 1.0
        assert pool.map(square, range(5)) == [0, 1, 4, 9, 16]
