"""Several nodes on this machine (rtml.testing.Cluster): placement, spillback, objects
that move between nodes, remote actors, late joiners.

Each node is its own process group with its own ports, session directory and
shared-memory namespace; objects cross between them only over the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

import rtml
from rtml.config import LEASE_IDLE_TIMEOUT
from rtml.exceptions import RtmlSystemError, TaskError
from rtml.testing import Cluster, ClusterNode

HUNDRED_MB = 100 * 1024 * 1024


@rtml.remote
def node_of() -> str:
    return rtml.get_runtime_context().get_node_id()


@rtml.remote
def sleepy_node(seconds: float) -> str:
    time.sleep(seconds)
    return rtml.get_runtime_context().get_node_id()


@rtml.remote
def visible_gpus(seconds: float = 0.0) -> str:
    time.sleep(seconds)
    return os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")


@rtml.remote
def pid_and_gpus(seconds: float = 0.0) -> tuple[int, str]:
    time.sleep(seconds)
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")


@rtml.remote
class GpuHolder:
    def visible(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")


@rtml.remote
def big_array(n_bytes: int) -> np.ndarray:
    return np.arange(n_bytes // 8, dtype=np.int64)


@rtml.remote
def checksum(array: np.ndarray) -> tuple[int, int, str]:
    return int(array.sum()), int(array.nbytes), rtml.get_runtime_context().get_node_id()


@rtml.remote
class Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, n: int) -> int:
        self.count += n
        return self.count

    def node(self) -> str:
        return rtml.get_runtime_context().get_node_id()


def pinned(node: ClusterNode, soft: bool = False) -> rtml.NodeAffinitySchedulingStrategy:
    return rtml.NodeAffinitySchedulingStrategy(node.node_id, soft=soft)


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[tuple[Cluster, ClusterNode, ClusterNode, ClusterNode]]:
    """Head: 1 CPU. node2: 2 CPUs, 2 (fake) GPUs, {"foo": 1}. node3: 1 CPU, {"bar": 2}."""
    if rtml.is_initialized():
        rtml.shutdown()
    cluster = Cluster(head_node_args={"num_cpus": 1})
    node2 = cluster.add_node(num_cpus=2, num_gpus=2, resources={"foo": 1})
    node3 = cluster.add_node(num_cpus=1, resources={"bar": 2})
    cluster.connect()
    assert cluster.head_node is not None
    yield cluster, cluster.head_node, node2, node3
    cluster.shutdown()


def test_nodes_lists_every_node_with_its_resources(three_nodes) -> None:
    cluster, head, node2, node3 = three_nodes
    nodes = {n["NodeID"]: n for n in rtml.nodes()}
    assert set(nodes) == {head.node_id, node2.node_id, node3.node_id}
    assert all(n["Alive"] for n in nodes.values())
    assert nodes[node2.node_id]["Resources"]["GPU"] == 2.0
    assert nodes[node2.node_id]["Resources"]["foo"] == 1.0
    assert nodes[node3.node_id]["Resources"]["bar"] == 2.0
    assert nodes[head.node_id]["Resources"]["CPU"] == 1.0
    total = rtml.cluster_resources()
    assert total["CPU"] == 4.0 and total["GPU"] == 2.0 and total["foo"] == 1.0
    assert rtml.get_runtime_context().get_node_id() == head.node_id


def test_custom_resources_place_tasks_on_the_nodes_that_have_them(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    assert rtml.get(node_of.options(resources={"foo": 1}).remote()) == node2.node_id
    on_bar = rtml.get([node_of.options(resources={"bar": 1}).remote() for _ in range(4)])
    assert set(on_bar) == {node3.node_id}
    assert rtml.get(node_of.options(num_cpus=0).remote()) in {head.node_id, node2.node_id,
                                                               node3.node_id}


def test_gpu_tasks_see_their_own_gpu_ids(three_nodes) -> None:
    _, _, node2, _ = three_nodes
    both = rtml.get(visible_gpus.options(num_gpus=2).remote())
    assert both == "0,1"
    # Two one-GPU tasks at once get different GPUs.
    seen = rtml.get([visible_gpus.options(num_gpus=1).remote(0.5) for _ in range(2)])
    assert sorted(seen) == ["0", "1"]
    assert rtml.get(visible_gpus.options(num_gpus=0).remote()) == "<unset>"
    # An actor's methods keep seeing the actor's GPU, call after call.
    holder = GpuHolder.options(num_gpus=1).remote()
    first = rtml.get(holder.visible.remote())
    assert first in {"0", "1"}
    assert rtml.get([holder.visible.remote() for _ in range(3)]) == [first] * 3


def test_gpu_tasks_get_workers_of_their_own(three_nodes) -> None:
    """A worker that ran a CPU task never runs a GPU one, nor the reverse (as Ray): the
    GPU task's imports must come after CUDA_VISIBLE_DEVICES is set."""
    _, _, node2, _ = three_nodes
    on_node2 = pid_and_gpus.options(scheduling_strategy=pinned(node2))
    gpu_on_node2 = pid_and_gpus.options(scheduling_strategy=pinned(node2), num_gpus=1,
                                        num_cpus=0)
    cpu_runs = rtml.get([on_node2.remote(0.2) for _ in range(2)])  # both node2 CPUs busy
    time.sleep(LEASE_IDLE_TIMEOUT + 0.2)  # their workers are back in node2's idle pool
    gpu_runs = rtml.get([gpu_on_node2.remote(0.2) for _ in range(2)])
    cpu_again = rtml.get([on_node2.remote() for _ in range(4)])
    cpu_pids = {pid for pid, _ in cpu_runs + cpu_again}
    gpu_pids = {pid for pid, _ in gpu_runs}
    assert not cpu_pids & gpu_pids
    assert sorted(gpus for _, gpus in gpu_runs) == ["0", "1"]
    assert {gpus for _, gpus in cpu_runs + cpu_again} == {"<unset>"}


def test_node_affinity_pins_and_fails_clearly(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    for node in (head, node2, node3):
        assert rtml.get(node_of.options(scheduling_strategy=pinned(node)).remote()) \
            == node.node_id
    ghost = rtml.NodeAffinitySchedulingStrategy("ab" * 16, soft=False)
    with pytest.raises(RtmlSystemError, match="not in the cluster"):
        rtml.get(node_of.options(scheduling_strategy=ghost).remote(), timeout=30)
    soft = rtml.NodeAffinitySchedulingStrategy("ab" * 16, soft=True)
    assert rtml.get(node_of.options(scheduling_strategy=soft).remote(), timeout=30)
    # Pinned to a node without the resource: hard fails, soft runs where it fits.
    no_foo = node_of.options(resources={"foo": 1}, scheduling_strategy=pinned(node3))
    with pytest.raises(RtmlSystemError, match="does not have"):
        rtml.get(no_foo.remote(), timeout=30)
    soft_foo = node_of.options(resources={"foo": 1}, scheduling_strategy=pinned(node3, True))
    assert rtml.get(soft_foo.remote(), timeout=30) == node2.node_id


def test_spread_spreads_over_the_nodes(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    time.sleep(1.0)  # heartbeats refresh the head's view after the previous tests' work
    refs = [sleepy_node.options(scheduling_strategy="SPREAD").remote(0.5) for _ in range(4)]
    where = rtml.get(refs)
    # Best effort (API.md): the head round-robins over the nodes its heartbeat view shows
    # with room (a view up to one heartbeat old), so more than one node takes part.
    assert len(set(where)) >= 2, where
    assert set(where) <= {head.node_id, node2.node_id, node3.node_id}


def test_spillback_when_the_local_node_is_full(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    # node_of is short and shares sleepy_node's lease shape: its deep pipeline must not
    # queue the long tasks on the one worker the head grants (they would all run there).
    rtml.get([node_of.remote() for _ in range(50)])
    time.sleep(1.0)  # its idle leases go back
    started = time.monotonic()
    where = rtml.get([sleepy_node.remote(1.0) for _ in range(4)])
    elapsed = time.monotonic() - started
    # The head has one CPU: three of the four tasks had to go elsewhere.
    assert len(set(where)) >= 2 and where.count(head.node_id) <= 2, where
    assert elapsed < 3.5, f"4 one-second tasks on 4 CPUs took {elapsed:.1f} s"


def test_a_100mb_object_made_on_one_node_is_read_on_another(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    ref = big_array.options(scheduling_strategy=pinned(node2)).remote(HUNDRED_MB)
    array = rtml.get(ref, timeout=60)  # the driver is on the head: pulled over gRPC
    expected = np.arange(HUNDRED_MB // 8, dtype=np.int64)
    assert array.nbytes == HUNDRED_MB and np.array_equal(array, expected)
    total, nbytes, where = rtml.get(
        checksum.options(scheduling_strategy=pinned(node3)).remote(ref), timeout=60)
    assert (total, nbytes, where) == (int(expected.sum()), HUNDRED_MB, node3.node_id)
    del array, ref


def test_a_put_on_the_driver_is_read_by_a_task_on_another_node(three_nodes) -> None:
    _, head, node2, _ = three_nodes
    data = np.random.default_rng(7).integers(0, 1 << 30, size=2_000_000, dtype=np.int64)
    ref = rtml.put(data)
    total, nbytes, where = rtml.get(
        checksum.options(scheduling_strategy=pinned(node2)).remote(ref), timeout=60)
    assert (total, nbytes, where) == (int(data.sum()), data.nbytes, node2.node_id)


def test_nested_refs_carry_their_location(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    inner = big_array.options(scheduling_strategy=pinned(node2)).remote(8 << 20)
    rtml.wait([inner])

    @rtml.remote
    def sum_nested(holder: list) -> int:
        return int(rtml.get(holder[0]).sum())

    got = rtml.get(sum_nested.options(scheduling_strategy=pinned(node3)).remote([inner]),
                   timeout=60)
    assert got == int(np.arange((8 << 20) // 8, dtype=np.int64).sum())


def test_remote_actor_called_from_two_drivers(three_nodes) -> None:
    cluster, _, node2, node3 = three_nodes
    counter = Counter.options(name="shared", namespace="both", resources={"foo": 1}).remote()
    assert rtml.get(counter.node.remote()) == node2.node_id
    assert rtml.get(counter.add.remote(1)) == 1
    script = (
        "import rtml\n"
        f"rtml.init(address={cluster.address!r}, token={cluster.token!r}, "
        f"_node_id={node3.node_id!r})\n"
        "assert rtml.get_runtime_context().get_node_id() == " + repr(node3.node_id) + "\n"
        "c = rtml.get_actor('shared', namespace='both')\n"
        "print(rtml.get([c.add.remote(10) for _ in range(3)])[-1])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "31"
    assert rtml.get(counter.add.remote(1)) == 32
    rtml.kill(counter)


@rtml.remote
class Keeper:
    """Keeps a handle to another actor and calls it."""

    def __init__(self, target) -> None:
        self.target = target

    def add(self, n: int) -> int:
        return rtml.get(self.target.add.remote(n))


def _actor_state(actor_id: str) -> str:
    plane = rtml.core.current.require_runtime().plane
    return next(a["state"] for a in plane.list_actors() if a["actor_id"] == actor_id)


def test_a_handle_borrowed_on_another_node_keeps_its_actor_until_it_is_dropped(
        three_nodes) -> None:
    _, _, node2, node3 = three_nodes
    counter = Counter.options(num_cpus=0, scheduling_strategy=pinned(node2)).remote()
    actor_id = counter._actor_id.hex()
    keeper = Keeper.options(num_cpus=0, scheduling_strategy=pinned(node3)).remote(counter)
    assert rtml.get(keeper.add.remote(2), timeout=60) == 2
    del counter  # the keeper's handle, on node3, is the last one
    time.sleep(1.0)
    assert rtml.get(keeper.add.remote(3), timeout=60) == 5
    assert _actor_state(actor_id) == "ALIVE"
    del keeper
    deadline = time.monotonic() + 30
    while _actor_state(actor_id) != "DEAD" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _actor_state(actor_id) == "DEAD"


def test_task_errors_from_another_node_name_the_node(three_nodes) -> None:
    _, _, node2, _ = three_nodes

    @rtml.remote
    def fail() -> None:
        raise ValueError("bad input on a remote node")

    with pytest.raises(ValueError, match="bad input") as info:
        rtml.get(fail.options(scheduling_strategy=pinned(node2)).remote())
    assert isinstance(info.value, TaskError)
    assert f"node={node2.node_id[:12]}" in str(info.value)


def test_a_late_node_picks_up_pending_work(three_nodes) -> None:
    cluster = three_nodes[0]
    ref = node_of.options(resources={"late": 1}).remote()
    ready, _ = rtml.wait([ref], timeout=1.0)
    assert ready == []
    late = cluster.add_node(num_cpus=1, resources={"late": 1})
    try:
        assert rtml.get(ref, timeout=30) == late.node_id
    finally:
        cluster.remove_node(late)


@rtml.remote
def slow_array(seconds: float, n_bytes: int) -> np.ndarray:
    time.sleep(seconds)
    return np.ones(n_bytes, dtype=np.uint8)


@rtml.remote
class Holder:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def size(self) -> tuple[int, str]:
        return int(self.array.sum()), rtml.get_runtime_context().get_node_id()


def test_an_actor_created_with_a_pending_argument_from_another_node(three_nodes) -> None:
    _, _, node2, node3 = three_nodes
    ref = slow_array.options(scheduling_strategy=pinned(node2)).remote(0.5, 1 << 20)
    holder = Holder.options(num_cpus=0, scheduling_strategy=pinned(node3)).remote(ref)
    assert rtml.get(holder.size.remote(), timeout=30) == (1 << 20, node3.node_id)
    rtml.kill(holder)


@rtml.remote
def first_byte(array: np.ndarray) -> int:
    return int(array[0])


def test_concurrent_reads_on_one_node_share_one_transfer(three_nodes) -> None:
    _, head, node2, _ = three_nodes
    ref = slow_array.options(scheduling_strategy=pinned(node2)).remote(0.0, 32 << 20)
    rtml.wait([ref], fetch_local=False)
    before = rtml.api._store_stats()["pulls_started"]
    readers = [first_byte.options(scheduling_strategy=pinned(head), num_cpus=0).remote(ref)
               for _ in range(3)]
    assert int(rtml.get(ref)[0]) == 1 and rtml.get(readers) == [1, 1, 1]
    assert rtml.api._store_stats()["pulls_started"] == before + 1


def test_a_pulled_copy_is_recorded_as_a_second_location(three_nodes) -> None:
    _, head, node2, _ = three_nodes
    ref = slow_array.options(scheduling_strategy=pinned(node2)).remote(0.0, 4 << 20)
    assert rtml.get(ref).nbytes == 4 << 20  # pulled to the head
    plane = rtml.core.current.require_runtime().plane
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        records = {o["object_id"]: o for o in plane.list_objects()}
        record = records.get(ref.hex())
        if record and len(record.get("locations", [])) == 2:
            break
        time.sleep(0.1)
    assert record is not None
    assert sorted(record["locations"]) == sorted([head.node_id, node2.node_id])
    assert record["node_id"] == node2.node_id


def test_wait_fetches_remote_objects_unless_told_not_to(three_nodes) -> None:
    _, _, node2, _ = three_nodes
    lazy = slow_array.options(scheduling_strategy=pinned(node2)).remote(0.0, 8 << 20)
    ready, _ = rtml.wait([lazy], fetch_local=False, timeout=30)
    assert ready == [lazy]
    before = rtml.api._store_stats()["pulls_started"]
    eager = slow_array.options(scheduling_strategy=pinned(node2)).remote(0.0, 8 << 20)
    ready, _ = rtml.wait([eager], timeout=30)  # fetch_local=True: pulled to this node
    assert ready == [eager]
    assert rtml.api._store_stats()["pulls_started"] == before + 1


def test_spilled_work_prefers_the_node_holding_its_large_argument(three_nodes) -> None:
    _, head, node2, node3 = three_nodes
    ref = big_array.options(scheduling_strategy=pinned(node3)).remote(8 << 20)
    rtml.wait([ref], fetch_local=False)
    blocker = sleepy_node.options(scheduling_strategy=pinned(head)).remote(3.0)
    # Wait until the global scheduler's view (fed by heartbeats) shows the scene: the
    # head's only CPU taken, node3's free (a lease an earlier test just returned may
    # still show there for a heartbeat).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        available = {n["NodeID"]: n["Available"].get("CPU", 0.0) for n in rtml.nodes()}
        if available[head.node_id] == 0.0 and available[node3.node_id] == 1.0:
            break
        time.sleep(0.05)
    # node2 has more free CPUs, but node3 holds the argument.
    assert rtml.get(checksum.remote(ref), timeout=30)[2] == node3.node_id
    rtml.get(blocker)


def test_a_waited_remote_result_is_freed_on_both_nodes_when_dropped(three_nodes) -> None:
    import gc
    import os

    _, head, node2, _ = three_nodes
    gc.disable()  # freeing must not wait for the cyclic garbage collector
    try:
        ref = slow_array.options(scheduling_strategy=pinned(node2)).remote(0.2, 2 << 20)
        rtml.wait([ref], timeout=30)  # pulls a copy here too
        assert rtml.get(ref).nbytes == 2 << 20
        files = [f"/dev/shm/rtml-{node.node_id}/{ref.hex()}" for node in (head, node2)]
        assert all(os.path.exists(f) for f in files)
        del ref
        deadline = time.monotonic() + 10
        while any(os.path.exists(f) for f in files) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(os.path.exists(f) for f in files)
    finally:
        gc.enable()
