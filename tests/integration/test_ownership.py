"""Ownership: refs that leave the process that made them stay readable, and are freed.

A ref leaves its owner nested in a return value, an argument, a ``put`` value or an
actor's state; the process that unpickles it borrows it, and may pass it on. Every
ref here is made inside a task or actor and read by the driver (or by a borrower of
a borrower); the store is checked to be back where it started once nobody holds
them. The first half runs on the module's one-node cluster, the second on three
nodes (refs made on one node, returned through a task on another, read on a third),
with owners killed for real.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import rtml
from rtml.exceptions import OwnerDiedError
from rtml.testing import Cluster, ClusterNode

BIG = 300_000
"""Elements of an int64 array big enough (2.4 MB) to live in shared memory."""
STORE_KEYS = ("num_objects", "num_placeholders", "remote_holds", "num_waiters")


class Holder:
    """A user object with a ref in an attribute."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref


@rtml.remote
def make(size: int, value: int = 7, delay: float = 0.0) -> np.ndarray:
    time.sleep(delay)
    return np.full(size, value, dtype=np.int64)


@rtml.remote
def nested_results(size: int, delay: float = 0.0) -> dict:
    return {"list": [make.remote(size, 1, delay)], "dict": {"k": make.remote(size, 2, delay)},
            "object": Holder(make.remote(size, 3, delay))}


@rtml.remote
def nested_puts(size: int) -> list:
    return [rtml.put(np.full(size, 4, dtype=np.int64)), {"again": rtml.put(5)}]


@rtml.remote
def grandchild(size: int, delay: float) -> list:
    return [nested_results.remote(size, delay)]


@rtml.remote
def total_of(box: list) -> int:
    return int(rtml.get(box[0], timeout=60).sum())


@rtml.remote
def pass_on(box: list) -> int:
    """A borrower handing its borrowed ref to another task (a borrower of a borrower)."""
    return rtml.get(total_of.remote([box[0]]), timeout=60)


@rtml.remote
def echo(box: list) -> list:
    return [box[0]]


@rtml.remote
class Keeper:
    """Owns a ref in its state and hands it out later."""

    def __init__(self) -> None:
        self.ref: Any = None

    def make(self, size: int, delay: float = 0.0, where: Any = None) -> int:
        self.ref = make.options(scheduling_strategy=where).remote(size, 9, delay)
        return 1

    def give(self) -> list:
        return [self.ref]


@rtml.remote
def store_stats() -> dict[str, int]:
    return rtml.api._store_stats()


def values(box: dict) -> list[int]:
    refs = [box["list"][0], box["dict"]["k"], box["object"].ref]
    return [int(array.sum()) for array in rtml.get(refs, timeout=60)]


def settled(read: Any, start: list[tuple[int, ...]], timeout: float = 10.0
            ) -> list[tuple[int, ...]]:
    """``read()`` once it equals ``start`` (or after ``timeout`` s: frees travel async)."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        now = read()
        if now == start or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def local_store() -> list[tuple[int, ...]]:
    stats = rtml.api._store_stats()
    return [tuple(stats[key] for key in STORE_KEYS)]


# -- one node -----------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [10, BIG])
@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_task_results_returned_nested_in_a_list_a_dict_and_an_object(
        cluster: None, size: int, delay: float) -> None:
    # delay: the task returns its refs before their values exist.
    box = rtml.get(nested_results.remote(size, delay), timeout=60)
    assert values(box) == [size, 2 * size, 3 * size]


@rtml.remote
def fails(message: str) -> None:
    raise KeyError(message)


@rtml.remote
def slow_and_failing() -> list:
    return [make.remote(10, 1, 5.0), fails.remote("failed first")]


def test_get_of_borrowed_refs_raises_a_failure_without_waiting_for_earlier_ones(
        cluster: None) -> None:
    # As for owned refs (and in Ray): the first failure, not the first ref, decides.
    slow, failing = rtml.get(slow_and_failing.remote(), timeout=60)
    started = time.monotonic()
    with pytest.raises(KeyError, match="failed first"):
        rtml.get([slow, failing], timeout=30)
    assert time.monotonic() - started < 3.0
    assert int(rtml.get([slow, make.remote(10, 2)], timeout=30)[0].sum()) == 10


@pytest.mark.parametrize("size", [10, BIG])
def test_puts_returned_nested(cluster: None, size: int) -> None:
    box = rtml.get(nested_puts.remote(size), timeout=60)
    assert int(rtml.get(box[0], timeout=60).sum()) == 4 * size
    assert rtml.get(box[1]["again"], timeout=60) == 5


def test_a_grandchild_tasks_results_reach_the_driver(cluster: None) -> None:
    # The driver borrows from a task's worker, which borrowed from its own child's.
    outer = rtml.get(grandchild.remote(10, 0.3), timeout=60)
    inner = rtml.get(outer[0], timeout=60)
    assert values(inner) == [10, 20, 30]


def test_a_ref_kept_in_an_actors_state_is_handed_out_later(cluster: None) -> None:
    keeper = Keeper.remote()
    assert rtml.get(keeper.make.remote(BIG, 0.3)) == 1
    box = rtml.get(keeper.give.remote(), timeout=60)
    assert int(rtml.get(box[0], timeout=60).sum()) == 9 * BIG
    assert rtml.get(total_of.remote(rtml.get(keeper.give.remote())), timeout=60) == 9 * BIG
    rtml.kill(keeper)


def test_borrowers_of_borrowers_read_a_ref_made_in_a_task(cluster: None) -> None:
    box = rtml.get(nested_results.remote(10, 0.3), timeout=60)
    # The driver borrows it; a task borrows it from the driver and lends it to another.
    assert rtml.get(pass_on.remote(box["list"]), timeout=60) == 10
    # Returned by a borrower (its value nested again), then read here.
    assert int(rtml.get(rtml.get(echo.remote(box["list"]))[0]).sum()) == 10


def test_a_ref_whose_owner_died_before_making_it_raises_owner_died(cluster: None) -> None:
    keeper = Keeper.remote()
    assert rtml.get(keeper.make.remote(10, 5.0)) == 1
    box = rtml.get(keeper.give.remote(), timeout=60)
    rtml.kill(keeper)
    started = time.monotonic()
    with pytest.raises(OwnerDiedError, match="its owner .* died before the value existed"):
        rtml.get(box[0], timeout=30)
    assert time.monotonic() - started < 4.0  # at once, not when the task would have ended
    assert isinstance(OwnerDiedError("x"), rtml.exceptions.ObjectLostError)


def test_a_value_made_before_its_owner_died_stays_readable(cluster: None) -> None:
    # Unlike Ray, a value already in shared memory outlives its owner while it is held.
    keeper = Keeper.remote()
    assert rtml.get(keeper.make.remote(BIG)) == 1
    box = rtml.get(keeper.give.remote(), timeout=60)
    rtml.wait(box, timeout=60)
    rtml.kill(keeper)
    time.sleep(0.5)
    assert int(rtml.get(box[0], timeout=30).sum()) == 9 * BIG


def test_nested_refs_are_freed_once_nobody_holds_them(start_cluster) -> None:
    start_cluster(num_cpus=2)  # its own: nothing of other tests still being freed
    start = [(0, 0, 0, 0)]
    assert local_store() == start
    for delay in (0.0, 0.2):
        box = rtml.get(nested_results.remote(BIG, delay), timeout=60)
        puts = rtml.get(nested_puts.remote(BIG), timeout=60)
        outer = rtml.get(grandchild.remote(BIG, delay), timeout=60)
        inner = rtml.get(outer[0], timeout=60)
        assert values(box) == values(inner) == [BIG, 2 * BIG, 3 * BIG]
        assert rtml.get(pass_on.remote(puts), timeout=60) == 4 * BIG
        del box, puts, outer, inner
    # Refs returned and never read are freed too.
    dropped = [nested_results.remote(BIG) for _ in range(5)]
    rtml.wait(dropped, num_returns=len(dropped), timeout=60)
    del dropped
    assert settled(local_store, start) == start


# -- three nodes ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[Cluster, ClusterNode, ClusterNode, ClusterNode]]:
    """Head (the driver's node), node2 and node3: 1 CPU each."""
    if rtml.is_initialized():
        rtml.shutdown()
    cluster = Cluster(head_node_args={"num_cpus": 1})
    node2 = cluster.add_node(num_cpus=1)
    node3 = cluster.add_node(num_cpus=1)
    cluster.connect()
    assert cluster.head_node is not None
    yield cluster, cluster.head_node, node2, node3
    cluster.shutdown()


def on(node: ClusterNode) -> rtml.NodeAffinitySchedulingStrategy:
    return rtml.NodeAffinitySchedulingStrategy(node.node_id, soft=False)


@rtml.remote
def made_on(size: int, delay: float, where: Any) -> list:
    return [make.options(scheduling_strategy=where).remote(size, 6, delay)]


def stores(*nodes: ClusterNode) -> list[tuple[int, ...]]:
    """Each node's store counters, read by a task there."""
    reads = [store_stats.options(scheduling_strategy=on(node)).remote() for node in nodes]
    return [tuple(stats[key] for key in STORE_KEYS) for stats in rtml.get(reads, timeout=60)]


@pytest.mark.parametrize("size", [10, BIG])
@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_a_ref_made_on_one_node_returned_through_another_read_on_a_third(
        nodes, size: int, delay: float) -> None:
    # The owner is a worker on node2; the value is made on node3 (in its shared memory
    # when BIG, else inline at the owner, which shares it on node2); the driver reads it
    # on the head, where the ref names node2.
    _, head, node2, node3 = nodes
    start = settled(lambda: stores(head, node2, node3), [(0, 0, 0, 0)] * 3)
    assert start == [(0, 0, 0, 0)] * 3  # (what earlier tests made is gone)
    box = rtml.get(made_on.options(scheduling_strategy=on(node2)).remote(size, delay, on(node3)),
                   timeout=60)
    assert int(rtml.get(box[0], timeout=60).sum()) == 6 * size
    # A borrower on node3 of the driver's borrowed ref.
    assert rtml.get(total_of.options(scheduling_strategy=on(node3)).remote(box),
                    timeout=60) == 6 * size
    del box
    assert settled(lambda: stores(head, node2, node3), start) == start


def test_a_grandchild_across_three_nodes(nodes) -> None:
    _, head, node2, node3 = nodes
    outer = rtml.get(grandchild.options(scheduling_strategy=on(node2)).remote(BIG, 0.3),
                     timeout=60)
    inner = rtml.get(outer[0], timeout=60)
    assert values(inner) == [BIG, 2 * BIG, 3 * BIG]


def test_an_owner_killed_on_another_node_raises_owner_died(nodes) -> None:
    _, head, node2, node3 = nodes
    start = settled(lambda: stores(head, node2, node3), [(0, 0, 0, 0)] * 3)
    assert start == [(0, 0, 0, 0)] * 3
    keeper = Keeper.options(scheduling_strategy=on(node2)).remote()
    assert rtml.get(keeper.make.remote(10, 5.0)) == 1
    box = rtml.get(keeper.give.remote(), timeout=60)
    rtml.kill(keeper)
    started = time.monotonic()
    with pytest.raises(OwnerDiedError):
        rtml.get(box[0], timeout=30)
    # And a borrower on the third node learns it too (its task fails with it, as in Ray).
    with pytest.raises(rtml.exceptions.TaskError) as failed:
        rtml.get(total_of.options(scheduling_strategy=on(node3)).remote(box), timeout=30)
    assert isinstance(failed.value.cause, OwnerDiedError)
    assert time.monotonic() - started < 4.0
    del box, failed
    # Nothing is left held: also not by the failed borrower, whose frames (the ref in
    # their locals) outlive its task in the exception's traceback unless cleared.
    assert settled(lambda: stores(head, node2, node3), start) == start


def test_a_borrowed_ref_passed_on_before_its_value_exists(nodes) -> None:
    # The driver borrows a ref its owner (an actor on node2) is still making on node3,
    # and passes it to a task on node3 as a plain argument: the worker waits for it.
    _, head, node2, node3 = nodes
    keeper = Keeper.options(scheduling_strategy=on(node2)).remote()
    assert rtml.get(keeper.make.remote(BIG, 1.0)) == 1
    ref = rtml.get(keeper.give.remote(), timeout=60)[0]

    @rtml.remote
    def total(array: np.ndarray) -> int:
        return int(array.sum())

    assert rtml.get(total.options(scheduling_strategy=on(head)).remote(ref),
                    timeout=60) == 9 * BIG
    rtml.kill(keeper)


def test_a_borrower_failed_by_a_node_death_lets_go_of_its_refs(nodes) -> None:
    # (Last: it kills node3.) The value's node dies while a borrower on node2 waits for
    # it; the borrower's task fails, and what it held is released: its frames, with the
    # ref in their locals, would otherwise outlive the task in the error's traceback.
    cluster, head, node2, node3 = nodes
    start = settled(lambda: stores(head, node2), [(0, 0, 0, 0)] * 2)
    assert start == [(0, 0, 0, 0)] * 2
    keeper = Keeper.options(scheduling_strategy=on(node2)).remote()
    assert rtml.get(keeper.make.remote(BIG, 3.0, on(node3)), timeout=60) == 1
    box = rtml.get(keeper.give.remote(), timeout=60)
    waiting = total_of.options(scheduling_strategy=on(node2)).remote(box)
    time.sleep(0.3)
    cluster.remove_node(node3, allow_graceful=False)
    with pytest.raises(rtml.exceptions.TaskError):
        rtml.get(waiting, timeout=60)
    del box, waiting
    rtml.kill(keeper)
    assert settled(lambda: stores(head, node2), start) == start
