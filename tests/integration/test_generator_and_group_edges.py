"""Edges of generators, placement groups and max_calls that a review found broken (each
failed before its fix): repeated and cancelled items leave nothing behind, a retiring
worker is not leased again, what waits on a removed group fails, a group outlives a head
restart."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import rtml
from rtml.api import _store_stats

pytestmark = pytest.mark.usefixtures("cluster")


def _store_empties(timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while _store_stats()["num_objects"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return _store_stats()["num_objects"]


@rtml.remote(max_retries=1)
def large_dies_once(marker: str, n: int):  # noqa: ANN201 - a generator task
    for i in range(n):
        yield np.full(100_000, i, dtype=np.int64)
        if i == 2 and not os.path.exists(marker):
            Path(marker).write_text("died")
            os._exit(1)


def test_a_retried_generators_repeated_large_items_are_freed(tmp_path: Path) -> None:
    """The retry yields items 0-2 again; the owner skips them (Stream.accept) but the
    worker sealed them in shared memory held for the owner, who never releases them."""
    assert _store_empties() == 0
    marker = tmp_path / "died"
    got = [int(rtml.get(ref)[0]) for ref in large_dies_once.remote(str(marker), 5)]
    assert marker.exists() and got == [0, 1, 2, 3, 4]
    assert _store_empties() == 0, "the repeated items of the retry stay in the store"


@rtml.remote(num_cpus=1, max_retries=0)
def _sleeps(seconds: float) -> None:
    time.sleep(seconds)


@rtml.remote(num_cpus=1)
def _quick() -> int:
    return 1


def test_a_lease_request_queued_on_a_removed_groups_bundle_fails() -> None:
    """A task waiting (its lease request queued at the node) for a bundle that another
    task of the group holds: removing the group drops the bundle's names from the node,
    but the queued request stays in LocalScheduler.pending for ever, so the task hangs
    instead of failing with 'was removed'."""
    from rtml.util import placement_group, remove_placement_group
    from rtml.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    strategy = PlacementGroupSchedulingStrategy(pg, 0)
    running = _sleeps.options(scheduling_strategy=strategy).remote(60)
    time.sleep(1.0)  # it runs: the bundle's CPU is taken
    waiting = _quick.options(scheduling_strategy=strategy).remote()
    time.sleep(0.5)  # its lease request waits at the node
    remove_placement_group(pg)
    with pytest.raises(rtml.exceptions.RtmlError):
        rtml.get(running, timeout=30)
    with pytest.raises(rtml.exceptions.RtmlError, match="removed"):
        rtml.get(waiting, timeout=20)  # GetTimeoutError: it waits for ever


def test_a_task_waiting_for_a_pending_group_fails_when_it_is_removed() -> None:
    """The same at the head: a task of a group not created yet is spilled and kept
    Pending by the global scheduler; removing the group leaves it Pending for ever."""
    from rtml.util import placement_group, remove_placement_group
    from rtml.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 64}])  # more than the cluster has: it stays PENDING
    assert not pg.wait(0.5)
    waiting = _quick.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg)).remote()
    time.sleep(0.5)
    remove_placement_group(pg)
    with pytest.raises(rtml.exceptions.RtmlError, match="removed"):
        rtml.get(waiting, timeout=20)  # GetTimeoutError: it waits for ever


def test_a_group_can_be_removed_after_the_head_restarted(start_cluster) -> None:  # noqa: ANN001
    """The head keeps placement groups only in memory (HeadService.recover rebuilds
    none) while the nodes keep their bundles: after a head restart the group is
    MISSING, removing it does nothing, and its CPU stays reserved for the cluster's life."""
    import signal

    from rtml import driver
    from rtml.util import placement_group, placement_group_table, remove_placement_group

    start_cluster(num_cpus=2)
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    supervisor = driver._embedded.supervisor
    old = supervisor.proc.pid
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while supervisor.proc.pid == old and time.monotonic() < deadline:
        time.sleep(0.05)
    assert supervisor.proc.pid != old
    rtml.nodes()  # the new head answers
    state = placement_group_table(pg)["state"]
    remove_placement_group(pg)

    @rtml.remote(num_cpus=2)
    def both_cpus() -> int:
        return 2

    # GetTimeoutError: the bundle's CPU is never given back
    assert rtml.get(both_cpus.remote(), timeout=20) == 2, state



@rtml.remote(max_retries=0)
def _fast_large(n: int):  # noqa: ANN201 - a generator task
    for i in range(n):
        yield np.full(20_000, i, dtype=np.int64)  # 160 KB: each item goes to the store


def test_cancelling_a_generator_leaves_no_unsealed_object_behind() -> None:
    """The cancel signal (SIGUSR1 -> TaskCancelledError at the next bytecode) is armed
    while Executor._stream runs, which includes the executor's own _send_item: the
    error lands inside write_shared after the room was reserved and the file written,
    before SealObject. The room is never given back and the file stays in /dev/shm."""
    assert _store_empties() == 0
    used = _store_stats()["used_bytes"]
    for trial in range(10):
        gen = _fast_large.remote(100_000)
        first = next(gen)
        time.sleep(0.05 + 0.01 * (trial % 5))
        rtml.cancel(gen)
        with pytest.raises(rtml.exceptions.TaskCancelledError):
            for ref in gen:
                rtml.get(ref, timeout=30)
        del first, gen, ref
        assert _store_empties() == 0
    time.sleep(0.5)
    assert _store_stats()["used_bytes"] == used, "room reserved for items never sealed"


@rtml.remote(max_calls=1, max_retries=0, scheduling_strategy="SPREAD")
def _spread_once() -> int:
    return os.getpid()


def test_a_retiring_worker_is_not_leased_again_under_spread() -> None:
    """Under SPREAD the owner returns the lease right after the result (submitter
    _on_results -> _retire), before the worker's WorkerRetiring reaches the node manager:
    the node puts the exiting worker back in its idle pool and grants it again, and the
    task pushed to it is charged for the worker's exit (WorkerCrashedError here)."""
    for _ in range(5):
        pids = rtml.get([_spread_once.remote() for _ in range(10)], timeout=60)
        assert len(set(pids)) == 10  # each worker ran the function once


@rtml.remote(num_cpus=1)
class _InGroup:
    def ping(self) -> int:
        return 1


def test_an_actor_created_in_a_removed_group_fails() -> None:
    """Leases for a removed group are refused (HeadService._spill_lease), but an actor's
    creation is not: it waits PENDING for ever for resources that no node will offer."""
    from rtml.util import placement_group, remove_placement_group
    from rtml.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    remove_placement_group(pg)
    time.sleep(0.5)
    actor = _InGroup.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg)).remote()
    with pytest.raises(rtml.exceptions.ActorDiedError, match="removed"):
        rtml.get(actor.ping.remote(), timeout=20)  # GetTimeoutError: PENDING for ever


def test_a_group_removed_while_the_head_restarts_is_freed(start_cluster) -> None:  # noqa: ANN001
    """The removal is sent in the moment the head dies (unread by it): the head that
    takes over hears it again, and the node that rejoins lets the bundle go."""
    import signal

    from rtml import driver
    from rtml.util import placement_group, remove_placement_group

    start_cluster(num_cpus=2)
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    os.kill(driver._embedded.supervisor.proc.pid, signal.SIGKILL)
    remove_placement_group(pg)  # at once: written to a head that is gone

    @rtml.remote(num_cpus=2)
    def both_cpus() -> int:
        return 2

    assert rtml.get(both_cpus.remote(), timeout=40) == 2
