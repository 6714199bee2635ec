"""Objects whose every copy died with their node are rebuilt from lineage (issue 16, item 3).

Two nodes: the head (the driver's) and node2, SIGKILLed mid-run. The tasks that made
node2's objects run again on the head, recursively for lost arguments; a copy that
survives on the head is used instead of running anything; what cannot be rebuilt fails
with an ObjectLostError saying why.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_multinode import pinned

import rtml
from rtml.exceptions import ObjectLostError
from rtml.testing import Cluster, ClusterNode

PART = 1 << 17  # float64s: 1 MiB, so each part lives in shared memory


@pytest.fixture
def two_nodes(start_nodes: Callable[..., Any]) -> tuple[Cluster, ClusterNode]:
    """A head (2 CPUs) and node2 (2 CPUs); a silent node is dead after 1.5 s."""
    cluster, (node2,) = start_nodes(2, 2)
    return cluster, node2


def _count(runs: Path, name: str) -> None:
    with open(runs / name, "a") as f:
        f.write("x")


def _runs(runs: Path, name: str) -> int:
    path = runs / name
    return len(path.read_text()) if path.exists() else 0


@rtml.remote
def part(seed: int, runs: Path) -> np.ndarray:
    _count(runs, f"part{seed}")
    return np.random.default_rng(seed).random(PART)


@rtml.remote
def scaled(array: np.ndarray, factor: float, runs: Path) -> np.ndarray:
    _count(runs, f"scaled{factor}")
    return array * factor


@rtml.remote
def reduce_parts(pause: float, *parts: np.ndarray) -> bytes:
    time.sleep(pause)
    total = np.zeros(PART)
    for array in parts:
        total += array
    return hashlib.sha256(total.tobytes()).digest()


@rtml.remote
class Maker:
    def make(self) -> np.ndarray:
        return np.ones(PART)


def _on(node: ClusterNode) -> rtml.NodeAffinitySchedulingStrategy:
    return pinned(node, soft=True)  # there while it lives, elsewhere once it is dead


def _made_everywhere(refs: list[rtml.ObjectRef]) -> None:
    ready, _ = rtml.wait(refs, num_returns=len(refs), timeout=60, fetch_local=False)
    assert len(ready) == len(refs)  # made, and not pulled to the driver's node


def _dag(runs: Path, node2: ClusterNode, head: ClusterNode) -> list[rtml.ObjectRef]:
    """Parts made on both nodes, then a second stage on node2 built from them."""
    parts = [part.options(scheduling_strategy=_on(node2 if i % 2 else head)).remote(i, runs)
             for i in range(6)]
    doubled = [scaled.options(scheduling_strategy=_on(node2)).remote(p, 2.0, runs)
               for p in parts[:2]]
    return parts + doubled


def test_a_dag_whose_node_is_killed_returns_what_a_clean_run_returns(
        two_nodes: tuple[Cluster, ClusterNode], tmp_path: Path) -> None:
    cluster, node2 = two_nodes
    assert cluster.head_node is not None
    clean = tmp_path / "clean"
    faulty = tmp_path / "faulty"
    clean.mkdir()
    faulty.mkdir()
    expected = rtml.get(reduce_parts.remote(0.0, *_dag(clean, node2, cluster.head_node)),
                        timeout=60)

    refs = _dag(faulty, node2, cluster.head_node)
    _made_everywhere(refs)
    reducers = [reduce_parts.options(scheduling_strategy=_on(node2)).remote(1.0, *refs)
                for _ in range(2)]
    time.sleep(0.5)  # the reducers run on node2, reading the parts
    cluster.remove_node(node2, allow_graceful=False)
    assert rtml.get(reducers, timeout=90) == [expected, expected]
    # node2's parts (odd seeds) and the second stage ran again; the head's parts did not
    assert [_runs(faulty, f"part{i}") for i in range(6)] == [1, 2, 1, 2, 1, 2]
    assert _runs(faulty, "scaled2.0") == 4


def test_a_lost_object_is_rebuilt_for_its_getter(
        two_nodes: tuple[Cluster, ClusterNode], tmp_path: Path) -> None:
    cluster, node2 = two_nodes
    first = part.options(scheduling_strategy=_on(node2)).remote(7, tmp_path)
    second = scaled.options(scheduling_strategy=_on(node2)).remote(first, 3.0, tmp_path)
    _made_everywhere([first, second])
    cluster.remove_node(node2, allow_graceful=False)
    expected = np.random.default_rng(7).random(PART) * 3.0
    assert np.array_equal(rtml.get(second, timeout=60), expected)  # both rebuilt, in order
    assert (_runs(tmp_path, "part7"), _runs(tmp_path, "scaled3.0")) == (2, 2)


def test_a_copy_on_a_live_node_is_used_before_anything_runs_again(
        two_nodes: tuple[Cluster, ClusterNode], tmp_path: Path) -> None:
    cluster, node2 = two_nodes
    ref = part.options(scheduling_strategy=_on(node2)).remote(3, tmp_path)
    expected = rtml.get(ref, timeout=60).copy()  # pulled: a copy on the head
    cluster.remove_node(node2, allow_graceful=False)
    time.sleep(3.0)  # node2 is declared dead
    assert np.array_equal(rtml.get(ref, timeout=30), expected)
    assert np.array_equal(rtml.get(scaled.remote(ref, 1.0, tmp_path), timeout=30), expected)
    assert _runs(tmp_path, "part3") == 1


def test_what_cannot_be_rebuilt_fails_saying_why(
        two_nodes: tuple[Cluster, ClusterNode], tmp_path: Path) -> None:
    cluster, node2 = two_nodes
    once = part.options(scheduling_strategy=_on(node2), max_retries=0).remote(5, tmp_path)
    maker = Maker.options(scheduling_strategy=pinned(node2)).remote()
    from_actor = maker.make.remote()
    _made_everywhere([once, from_actor])
    cluster.remove_node(node2, allow_graceful=False)
    with pytest.raises(ObjectLostError, match="max_retries=0"):
        rtml.get(once, timeout=30)
    with pytest.raises(ObjectLostError, match="returned by an actor call"):
        rtml.get(from_actor, timeout=30)
    # a task of the lost object fails with the same error, without running
    with pytest.raises(ObjectLostError, match=once.hex()):
        rtml.get(scaled.remote(once, 1.0, tmp_path), timeout=30)
    assert _runs(tmp_path, "scaled1.0") == 0


@rtml.remote
def nap(seconds: float) -> None:
    time.sleep(seconds)


def test_a_task_that_reads_a_lost_argument_runs_again_once_it_is_rebuilt(
        two_nodes: tuple[Cluster, ClusterNode], tmp_path: Path) -> None:
    cluster, node2 = two_nodes
    assert cluster.head_node is not None
    ref = part.options(scheduling_strategy=_on(node2)).remote(11, tmp_path)
    _made_everywhere([ref])
    head = _on(cluster.head_node)
    busy = [nap.options(scheduling_strategy=head).remote(2.0) for _ in range(2)]
    time.sleep(0.5)  # the head's CPUs are taken: the next task waits, its argument on node2
    queued = scaled.options(scheduling_strategy=head).remote(ref, 1.0, tmp_path)
    cluster.remove_node(node2, allow_graceful=False)
    rtml.get(busy, timeout=30)
    expected = np.random.default_rng(11).random(PART)
    assert np.array_equal(rtml.get(queued, timeout=60), expected)
    assert (_runs(tmp_path, "part11"), _runs(tmp_path, "scaled1.0")) == (2, 1)


@pytest.fixture
def three_nodes(start_nodes: Callable[..., Any]) -> tuple[Cluster, ClusterNode, ClusterNode]:
    """A head with no CPU (the driver's node), node2 and node3 (1 CPU each)."""
    cluster, (node2, node3) = start_nodes(0, 1, 1)
    return cluster, node2, node3


@rtml.remote(num_returns=2)
def two_parts(seed: int, runs: Path) -> tuple[np.ndarray, np.ndarray]:
    _count(runs, f"two{seed}")
    return np.random.default_rng(seed).random(PART), np.random.default_rng(seed + 1).random(PART)


def _segments(node: ClusterNode) -> list[Path]:
    return list(Path(f"/dev/shm/rtml-{node.node_id}").glob("*"))


def test_a_task_queued_with_a_kept_argument_reads_the_copy_and_nothing_runs_again(
        three_nodes: tuple[Cluster, ClusterNode, ClusterNode], tmp_path: Path) -> None:
    cluster, node2, node3 = three_nodes
    ref = part.options(scheduling_strategy=_on(node2), max_retries=0).remote(4, tmp_path)
    expected = rtml.get(ref, timeout=60).copy()  # a copy on the driver's node
    busy = nap.options(scheduling_strategy=_on(node3)).remote(2.0)
    time.sleep(0.5)
    queued = scaled.options(scheduling_strategy=_on(node3)).remote(ref, 1.0, tmp_path)
    cluster.remove_node(node2, allow_graceful=False)  # the queued task still names node2
    rtml.get(busy, timeout=30)
    assert np.array_equal(rtml.get(queued, timeout=60), expected)
    assert np.array_equal(rtml.get(ref, timeout=30), expected)
    assert _runs(tmp_path, "part4") == 1


def test_a_return_kept_as_a_copy_is_let_go_when_its_task_runs_again(
        three_nodes: tuple[Cluster, ClusterNode, ClusterNode], tmp_path: Path) -> None:
    cluster, node2, _ = three_nodes
    assert cluster.head_node is not None
    first, second = two_parts.options(scheduling_strategy=_on(node2)).remote(8, tmp_path)
    rtml.get(first, timeout=60)  # a copy of the first on the driver's node; not the second
    _made_everywhere([second])
    cluster.remove_node(node2, allow_graceful=False)
    values = rtml.get([first, second], timeout=60)  # the task ran again, on node3
    assert np.array_equal(values[1], np.random.default_rng(9).random(PART))
    assert _runs(tmp_path, "two8") == 2
    del values, first, second
    deadline = time.monotonic() + 10
    while _segments(cluster.head_node):  # the copy kept there is freed with its refs
        assert time.monotonic() < deadline, _segments(cluster.head_node)
        time.sleep(0.1)
