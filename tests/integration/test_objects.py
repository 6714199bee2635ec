"""Objects: put/get/wait semantics, zero-copy shared memory, Arrow, freeing, spilling.

Tests that need their own ``rtml.init`` arguments use ``start_cluster`` (function
scoped) and sit at the end of the module; the module's 2-CPU ``cluster`` is
started again for any test that asks for it afterwards.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

import rtml
from rtml.exceptions import GetTimeoutError

MB = 1024 * 1024


def shm_mapping_of(address: int) -> str | None:
    """The /dev/shm/rtml-* file whose mapping in this process contains ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or not parts[5].startswith("/dev/shm/rtml-"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= address < end:
                return parts[5]
    return None


@rtml.remote
def check_zero_copy(arr: np.ndarray, expected_len: int) -> bool:
    assert isinstance(arr, np.ndarray)
    assert arr.shape == (expected_len,)
    assert not arr.flags.writeable, "array in a task is writeable: not the shared copy"
    assert shm_mapping_of(arr.ctypes.data) is not None, "array data is not in /dev/shm/rtml-*"
    assert arr[0] == 0 and arr[-1] == expected_len - 1
    return True


@rtml.remote
def table_info(table: pa.Table) -> tuple[int, list[str], int]:
    return table.num_rows, table.column_names, sum(table.column("x").to_pylist())


@rtml.remote
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@rtml.remote
def first_and_last(arr: np.ndarray) -> tuple[int, int, bool]:
    return int(arr[0]), int(arr[-1]), bool((arr == arr[0]).all())


@rtml.remote
def uses_custom() -> str:
    return "ran"


# -- put / get ----------------------------------------------------------------------------------

def test_put_get_round_trip(cluster: None) -> None:
    values = [1, "text", b"bytes", None, {"a": [1, 2]}, (1, 2.5), list(range(1000))]
    refs = [rtml.put(v) for v in values]
    assert all(isinstance(r, rtml.ObjectRef) for r in refs)
    assert rtml.get(refs) == values
    assert rtml.get(refs[1]) == "text"
    assert rtml.get(tuple(refs[:2])) == values[:2]


def test_get_of_same_ref_twice(cluster: None) -> None:
    ref = rtml.put({"k": "v"})
    assert rtml.get([ref, ref]) == [{"k": "v"}, {"k": "v"}]


def test_get_timeout_raises_get_timeout_error_which_is_timeout_error(cluster: None) -> None:
    ref = slow.remote(1.5)
    with pytest.raises(GetTimeoutError):
        rtml.get(ref, timeout=0.1)
    with pytest.raises(TimeoutError):
        rtml.get([ref], timeout=0.1)
    assert rtml.get(ref, timeout=30) == 1.5


def test_get_of_non_ref_is_type_error(cluster: None) -> None:
    with pytest.raises(TypeError):
        rtml.get(123)
    with pytest.raises(TypeError):
        rtml.get([rtml.put(1), "not a ref"])


# -- wait ---------------------------------------------------------------------------------------

def test_wait_returns_ready_in_input_order(cluster: None) -> None:
    refs = [rtml.put(i) for i in range(4)]
    ready, not_ready = rtml.wait(refs, num_returns=4, timeout=10)
    assert ready == refs and not_ready == []
    ready, not_ready = rtml.wait(refs, num_returns=2, timeout=10)
    assert ready == refs[:2] and not_ready == refs[2:]
    ready, not_ready = rtml.wait(refs, timeout=10)  # num_returns defaults to 1
    assert ready == refs[:1] and not_ready == refs[1:]


def test_wait_keeps_input_order_with_puts_between_task_results(cluster: None) -> None:
    # (Not ``slow``: its measured run time decides how many of its calls are pipelined
    # to one worker, which the next test relies on.)
    refs = [uses_custom.remote(), rtml.put(1), uses_custom.remote(), rtml.put(2),
            uses_custom.remote()]
    rtml.get([refs[0], refs[2], refs[4]])
    ready, not_ready = rtml.wait(refs, num_returns=len(refs), timeout=5)
    assert ready == refs and not_ready == []
    late = [slow.remote(3.0), rtml.put(3), *refs]
    ready, not_ready = rtml.wait(late, num_returns=len(late), timeout=0.3)
    assert ready == late[1:] and not_ready == late[:1]
    rtml.cancel(late[0])


def test_wait_skips_slow_refs(cluster: None) -> None:
    slow_ref = slow.remote(3.0)
    fast = [rtml.put("a"), rtml.put("b")]
    refs = [slow_ref, *fast]
    ready, not_ready = rtml.wait(refs, num_returns=2, timeout=10)
    assert ready == fast and not_ready == [slow_ref]
    ready, not_ready = rtml.wait([slow_ref], timeout=0.2)
    assert ready == [] and not_ready == [slow_ref]
    rtml.cancel(slow_ref)


def test_wait_on_results_still_being_made(cluster: None) -> None:
    # Ready values, results of our tasks still running, and one that ends meanwhile.
    put = rtml.put("here")
    long, short = slow.remote(5.0), slow.remote(0.2)
    refs = [long, put, short]
    start = time.monotonic()
    ready, not_ready = rtml.wait(refs, num_returns=3, timeout=0)  # a poll: never blocks
    assert ready == [put] and not_ready == [long, short]
    assert time.monotonic() - start < 1.0
    ready, not_ready = rtml.wait(refs, num_returns=2, timeout=10)  # waits for `short`
    assert ready == [put, short] and not_ready == [long]
    assert time.monotonic() - start < 4.0
    ready, not_ready = rtml.wait(refs, num_returns=3, timeout=0.1)
    assert ready == [put, short] and not_ready == [long]
    rtml.cancel(long)


def test_wait_rejects_duplicates(cluster: None) -> None:
    ref = rtml.put(1)
    with pytest.raises(ValueError):
        rtml.wait([ref, ref])
    with pytest.raises(ValueError):
        rtml.wait([ref, rtml.put(2), ref], num_returns=1)


def test_wait_num_returns_out_of_range(cluster: None) -> None:
    refs = [rtml.put(1), rtml.put(2)]
    with pytest.raises(ValueError):
        rtml.wait(refs, num_returns=3)
    with pytest.raises(ValueError):
        rtml.wait(refs, num_returns=0)
    with pytest.raises(ValueError):
        rtml.wait(refs, num_returns=-1)


def test_wait_empty_list(cluster: None) -> None:
    assert rtml.wait([]) == ([], [])


def test_wait_non_refs_is_type_error(cluster: None) -> None:
    with pytest.raises(TypeError):
        rtml.wait([1, 2])
    with pytest.raises(TypeError):
        rtml.wait([rtml.put(1), "x"])
    with pytest.raises(TypeError):
        rtml.wait(rtml.put(1))  # a bare ref, not a list


# -- shared memory ------------------------------------------------------------------------------

def test_100mb_numpy_array_is_zero_copy_in_driver_and_task(cluster: None) -> None:
    n = 100 * MB // 8
    arr = np.arange(n, dtype=np.int64)
    ref = rtml.put(arr)
    del arr
    got = rtml.get(ref)
    assert got.shape == (n,) and got.dtype == np.int64
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0] = 5
    path = shm_mapping_of(got.ctypes.data)
    assert path is not None, "driver's array is not backed by a /dev/shm/rtml-* mapping"
    assert got[0] == 0 and got[-1] == n - 1
    assert rtml.get(check_zero_copy.remote(ref, n), timeout=60) is True


def test_two_gets_of_one_large_array_share_its_memory(cluster: None) -> None:
    ref = rtml.put(np.arange(MB, dtype=np.int64))
    first, second = rtml.get(ref), rtml.get(ref)
    assert first is not second and np.shares_memory(first, second)  # one mapping, as Ray
    assert rtml.get(first_and_last.remote(ref)) == (0, MB - 1, False)
    del first, second
    assert int(rtml.get(ref)[-1]) == MB - 1  # mapped again once the others are gone


def test_pyarrow_table_round_trips(cluster: None) -> None:
    table = pa.table({"x": list(range(1000)), "name": [f"row{i}" for i in range(1000)]})
    ref = rtml.put(table)
    back = rtml.get(ref)
    assert isinstance(back, pa.Table)
    assert back.equals(table)
    assert rtml.get(table_info.remote(ref)) == (1000, ["x", "name"], sum(range(1000)))


def test_dropped_refs_do_not_grow_the_store(cluster: None) -> None:
    before = rtml.api._store_stats()  # other tests' objects may still be held
    chunk = np.ones(MB, dtype=np.uint8)
    for _ in range(10_000):
        rtml.put(chunk)  # the ref is dropped at once
    deadline = time.monotonic() + 5.0
    while True:
        stats = rtml.api._store_stats()
        grown = stats["used_bytes"] - before["used_bytes"]
        if grown < 4 * MB or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {"num_objects", "used_bytes", "num_spilled", "spilled_bytes"} <= set(stats)
    assert grown < 4 * MB, (before, stats)
    assert stats["num_objects"] <= before["num_objects"] + 4, (before, stats)


# -- special inits (each replaces the module cluster for one test) -------------------------------

def test_init_returns_context_with_address_info(start_cluster) -> None:
    ctx = start_cluster(num_cpus=1, resources={"custom": 2.0})
    assert isinstance(ctx.address_info, dict) and ctx.address_info
    total = rtml.cluster_resources()
    assert total["CPU"] == 1.0 and total["custom"] == 2.0
    assert rtml.get(uses_custom.options(resources={"custom": 2.0}).remote(), timeout=30) == "ran"


def test_spilling_keeps_every_array_readable(start_cluster) -> None:
    start_cluster(num_cpus=2, object_store_memory=200 * MB)
    n = 80 * MB // 8
    refs = [rtml.put(np.full(n, i, dtype=np.int64)) for i in range(5)]
    stats = rtml.api._store_stats()
    assert stats["num_spilled"] > 0, stats
    assert stats["spilled_bytes"] > 0, stats
    for i, ref in enumerate(refs):
        arr = rtml.get(ref, timeout=60)
        assert arr.shape == (n,)
        assert arr[0] == i and arr[-1] == i and bool((arr == i).all()), f"array {i} corrupt"
        del arr
    assert rtml.get(first_and_last.remote(refs[0]), timeout=60) == (0, 0, True)


@rtml.remote
def writeable_flags(array: np.ndarray, box: dict) -> list[bool]:
    return [array.flags.writeable, box["in"].flags.writeable, box["list"][0].flags.writeable]


def test_small_arrays_arrive_read_only_as_large_ones_do(cluster: None) -> None:
    # As in Ray: a task's (or get's) arrays are read-only whatever their size.
    small, large = np.zeros(8), np.zeros(MB)
    box = {"in": np.ones(3), "list": [np.ones(2)]}
    assert rtml.get(writeable_flags.remote(small, box)) == [False, False, False]
    assert rtml.get(writeable_flags.remote(large, box)) == [False, False, False]
    got = rtml.get(rtml.put(small))
    with pytest.raises(ValueError, match="read-only"):
        got[0] = 1.0
    assert small.flags.writeable  # the caller's own array is untouched
