"""The head service is SIGKILLed and comes back (issue 16, item 1): its supervisor starts
it again on the same socket, it rebuilds its state from Redis, and node managers, workers,
actors and drivers carry on through the gap.

Embedded clusters (the driver's supervisor thread) and multi-node ``rtml.testing.Cluster``s
here; the daemon supervisor of ``rtml start --head`` is in test_head_restart_daemon.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

import rtml
from rtml import driver
from rtml.exceptions import ActorDiedError, RtmlSystemError
from rtml.head.actors import OWNER_DIED
from rtml.testing import Cluster, ClusterNode


@rtml.remote
def square(x: int, seconds: float = 0.0) -> int:
    time.sleep(seconds)
    return x * x


@rtml.remote
def node_and_value(x: int) -> tuple[str, int]:
    time.sleep(0.02)
    return rtml.get_runtime_context().get_node_id(), x


@rtml.remote
class Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, n: int = 1) -> int:
        self.count += n
        return self.count

    def pid(self) -> int:
        return os.getpid()


KEPT: list = []  # a worker's handles, kept in the worker process


@rtml.remote
def make_counter() -> int:
    """A task that creates an actor (its owner is this worker) and keeps its handle."""
    counter = Counter.remote()
    KEPT.append(counter)
    assert rtml.get(counter.add.remote(5)) == 5
    return os.getpid()


def kill_head(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def embedded_head_pid() -> int:
    started = driver._embedded
    assert started is not None and started.supervisor is not None
    assert started.supervisor.proc is not None
    return started.supervisor.proc.pid


def wait_new_head(old_pid: int, current_pid) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid = current_pid()
        if pid != old_pid:
            return pid
        time.sleep(0.05)
    raise AssertionError("the head service was not started again")


def test_tasks_actors_and_names_carry_on_through_a_head_kill(start_cluster) -> None:
    start_cluster(num_cpus=2)
    counter = Counter.options(name="kept", lifetime="detached").remote()
    assert rtml.get(counter.add.remote()) == 1
    actor_pid = rtml.get(counter.pid.remote())
    old = embedded_head_pid()
    refs = [square.remote(i, 0.005) for i in range(200)]
    calls = [counter.add.remote() for _ in range(30)]
    kill_head(old)
    assert rtml.get(refs, timeout=60) == [i * i for i in range(200)]
    assert rtml.get(calls, timeout=60) == list(range(2, 32))
    new = wait_new_head(old, embedded_head_pid)
    assert new != old
    # The head that took over knows the node, the named actor (same process) and the job.
    nodes = rtml.nodes()
    assert len(nodes) == 1 and nodes[0]["Alive"]
    same = rtml.get_actor("kept")
    assert rtml.get(same.pid.remote()) == actor_pid
    assert rtml.get(same.add.remote()) == 32
    # New actors and new tasks work, and a name is still taken.
    fresh = Counter.remote()
    assert rtml.get(fresh.add.remote(7)) == 7
    with pytest.raises(ValueError, match="already exists"):
        Counter.options(name="kept").remote()
    rtml.kill(same)


def test_calls_that_need_the_head_wait_for_it(start_cluster) -> None:
    """An actor created, and one looked up by name, while the head is down: both wait
    for the head that takes over and then work."""
    start_cluster(num_cpus=2)
    before = Counter.options(name="before").remote()  # held: it lives while a handle does
    old = embedded_head_pid()
    kill_head(old)
    during = Counter.remote()  # sent while the head is away: queued, then delivered
    assert rtml.get(during.add.remote(3), timeout=60) == 3
    found = rtml.get_actor("before")
    assert rtml.get(found.add.remote(2), timeout=60) == 2
    assert rtml.get(before.add.remote(1)) == 3
    assert wait_new_head(old, embedded_head_pid) != old


def test_an_actor_whose_worker_died_while_the_head_was_down_restarts(start_cluster) -> None:
    start_cluster(num_cpus=2)
    counter = Counter.options(max_restarts=1).remote()
    victim = rtml.get(counter.pid.remote())
    old = embedded_head_pid()
    os.kill(old, signal.SIGSTOP)  # hold the head still: the worker dies while it is away
    try:
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.3)
    finally:
        os.kill(old, signal.SIGKILL)  # a stopped process dies of it too
    deadline = time.monotonic() + 60
    while True:  # calls made while it restarts may fail (max_task_retries=0)
        try:
            new_pid = rtml.get(counter.pid.remote(), timeout=60)
            break
        except ActorDiedError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert new_pid != victim
    assert rtml.get(counter.add.remote()) == 1  # a fresh instance


def actor_records() -> list[tuple[str, str]]:
    from rtml.core import current
    return [(a["state"], a["error"]) for a in current.require_runtime().plane.list_actors()]


def settle(probe, want, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while (got := probe()) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_an_actor_owned_by_a_worker_outlives_a_head_kill_then_dies_with_its_owner(
        start_cluster, monkeypatch) -> None:
    monkeypatch.setenv("RTML_NODE_TIMEOUT_S", "2")  # the head's reconnection window
    start_cluster(num_cpus=2)
    owner_pid = rtml.get(make_counter.remote())
    old = embedded_head_pid()
    kill_head(old)
    wait_new_head(old, embedded_head_pid)
    time.sleep(3)  # the window closed: an owner that had not reconnected would be gone
    assert settle(actor_records, [("ALIVE", "")]) == [("ALIVE", "")]
    os.kill(owner_pid, signal.SIGKILL)  # fate sharing holds with the head that took over
    (state, error), = settle(actor_records, [("DEAD", OWNER_DIED)])
    assert state == "DEAD" and "its owner" in error


@pytest.fixture
def two_nodes() -> Iterator[tuple[Cluster, ClusterNode, ClusterNode]]:
    if rtml.is_initialized():
        rtml.shutdown()
    cluster = Cluster(head_node_args={"num_cpus": 1})
    node2 = cluster.add_node(num_cpus=2, resources={"second": 10})
    cluster.connect()
    assert cluster.head_node is not None
    yield cluster, cluster.head_node, node2
    cluster.shutdown()


def test_a_head_kill_in_a_cluster_leaves_the_other_nodes_running(two_nodes) -> None:
    cluster, head, node2 = two_nodes
    on_node2 = {"resources": {"second": 1}}
    counter = Counter.options(**on_node2).remote()
    actor_pid = rtml.get(counter.pid.remote())
    old = head.head_pid
    refs = [node_and_value.options(**on_node2).remote(i) for i in range(60)]
    kill_head(old)
    results = rtml.get(refs, timeout=60)
    assert [x for _, x in results] == list(range(60))
    assert {node for node, _ in results} == {node2.node_id}
    assert rtml.get(counter.pid.remote()) == actor_pid  # the same process, never restarted
    assert rtml.get(counter.add.remote()) == 1
    wait_new_head(old, lambda: head.head_pid)
    # Placement across nodes works again: a new actor on node2, a spilled task.
    other = Counter.options(**on_node2).remote()
    assert rtml.get(other.add.remote(4), timeout=60) == 4
    assert rtml.get(node_and_value.options(**on_node2).remote(99))[0] == node2.node_id
    alive = {n["NodeID"] for n in rtml.nodes() if n["Alive"]}
    assert alive == {head.node_id, node2.node_id}


def test_a_node_that_dies_while_the_head_is_down_is_declared_dead(two_nodes) -> None:
    cluster, head, node2 = two_nodes
    counter = Counter.options(resources={"second": 1}, max_restarts=0).remote()
    assert rtml.get(counter.add.remote()) == 1
    old = head.head_pid
    os.kill(old, signal.SIGSTOP)
    try:
        os.killpg(node2.pgid, signal.SIGKILL)  # the machine dies
        time.sleep(0.3)
    finally:
        os.kill(old, signal.SIGKILL)  # a stopped process dies of it too
    # It never rejoins: within the node timeout (10 s) it is dead, and so is its actor.
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        alive = {n["NodeID"]: n["Alive"] for n in rtml.nodes()}
        if not alive.get(node2.node_id, True):
            break
        time.sleep(0.2)
    assert alive == {head.node_id: True, node2.node_id: False}
    with pytest.raises(ActorDiedError):
        rtml.get(counter.add.remote(), timeout=60)
    assert rtml.get(square.remote(6), timeout=60) == 36
    cluster.nodes.remove(node2)  # already dead


def test_a_kill_written_to_a_stopped_head_that_then_dies_still_happens(start_cluster) -> None:
    start_cluster(num_cpus=2)
    named = Counter.options(name="doomed", lifetime="detached").remote()
    pid = rtml.get(named.pid.remote())
    old = embedded_head_pid()
    os.kill(old, signal.SIGSTOP)  # it never reads what is written to it now
    try:
        rtml.kill(named)
        time.sleep(0.3)
    finally:
        os.kill(old, signal.SIGKILL)  # a stopped process dies of it too
    wait_new_head(old, embedded_head_pid)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed actor still runs"
        time.sleep(0.05)
    with pytest.raises(ValueError, match="no live actor"):
        rtml.get_actor("doomed")
    again = Counter.options(name="doomed", lifetime="detached").remote()  # the name is free
    assert rtml.get(again.add.remote()) == 1
    rtml.kill(again)


def test_a_head_that_was_stopped_longer_than_the_node_timeout_keeps_its_nodes(
        start_cluster) -> None:
    start_cluster(num_cpus=2, _node_timeout_s=1.5)
    counter = Counter.remote()
    assert rtml.get(counter.add.remote()) == 1
    head = embedded_head_pid()
    os.kill(head, signal.SIGSTOP)
    time.sleep(4)  # heartbeats pile up unread
    os.kill(head, signal.SIGCONT)
    time.sleep(1)  # its liveness check has run
    assert [n["Alive"] for n in rtml.nodes()] == [True]
    assert rtml.get(counter.add.remote()) == 2
    assert rtml.get(Counter.remote().add.remote(3)) == 3
    assert embedded_head_pid() == head  # it was never restarted


def test_a_hung_head_fails_the_calls_that_need_it_clearly_then_serves_again(
        start_cluster, monkeypatch) -> None:
    monkeypatch.setenv("RTML_HEAD_TIMEOUT_S", "2")
    start_cluster(num_cpus=2)
    counter = Counter.remote()
    assert rtml.get(counter.add.remote()) == 1
    head = embedded_head_pid()
    os.kill(head, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(RtmlSystemError, match="did not answer within 2 s"):
            rtml.nodes()
        assert time.monotonic() - start < 10
        assert rtml.get(counter.add.remote(), timeout=30) == 2  # no head needed
        assert rtml.get(square.remote(3), timeout=30) == 9
    finally:
        os.kill(head, signal.SIGCONT)
    assert [n["Alive"] for n in rtml.nodes()] == [True]
