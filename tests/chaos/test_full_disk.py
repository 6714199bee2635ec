"""A full spill disk and a full object store never destroy live objects (issue 16, item 5).

The node's spill directory is a small tmpfs mounted for the test (root only; skipped
with the reason elsewhere). Objects are made until the store and the disk are both
full: every object made stays readable, the one that found no room fails with an
OutOfDiskError naming the directory, shared memory never holds more than the store's
capacity, and a spilled object whose file is gone raises instead of hanging.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import rtml
from rtml.exceptions import ObjectLostError, ObjectStoreFullError, OutOfDiskError
from rtml.testing import Cluster, ClusterNode

STORE = 24 << 20
DISK = "9m"
OBJECT = 2 << 20  # 2 MiB: about 12 fit in the store, 4 on the disk

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="mounting a small tmpfs as the spill directory needs root and mount(8)")


@pytest.fixture
def small_disk() -> Iterator[tuple[Cluster, ClusterNode, Path]]:
    if rtml.is_initialized():
        rtml.shutdown()
    cluster = Cluster(head_node_args={"num_cpus": 1, "object_store_memory": STORE})
    assert cluster.head_node is not None
    spill = Path(cluster.head_node.session_dir) / "spill"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(spill)],
                   check=True)
    try:
        cluster.connect()
        yield cluster, cluster.head_node, spill
    finally:
        cluster.shutdown()
        subprocess.run(["umount", str(spill)], check=False)
        shutil.rmtree(spill.parent, ignore_errors=True)


def _shm_bytes(node: ClusterNode) -> int:
    return sum(p.stat().st_size for p in Path(f"/dev/shm/rtml-{node.node_id}").glob("*"))


def _array(i: int) -> np.ndarray:
    return np.full(OBJECT // 8, i, dtype=np.int64)


@rtml.remote
def make(i: int) -> np.ndarray:
    return _array(i)


def test_a_full_spill_disk_refuses_new_objects_and_keeps_every_live_one(
        small_disk: tuple[Cluster, ClusterNode, Path]) -> None:
    _, node, spill = small_disk
    refs, peak = [], 0
    with pytest.raises(OutOfDiskError, match=f"spilling to {spill} failed") as failure:
        for i in range(40):  # 80 MiB: more than the store and the disk together
            refs.append(rtml.put(_array(i)))
            peak = max(peak, _shm_bytes(node))
    assert "No space left on device" in str(failure.value)
    assert 12 <= len(refs) < 20
    assert peak <= STORE + (1 << 20)  # the capacity holds, within the segments' headers
    for i, ref in enumerate(refs):  # nothing made was deleted: all readable, all right
        assert np.array_equal(rtml.get(ref, timeout=30), _array(i))
    with pytest.raises(OutOfDiskError):  # a task's return finds no room either
        rtml.get(make.remote(99), timeout=30)
    del refs[:8]  # freed: their room (in memory and on disk) is free again
    refs.append(rtml.put(_array(100)))
    assert np.array_equal(rtml.get(refs[-1], timeout=30), _array(100))
    assert np.array_equal(rtml.get(make.remote(101), timeout=30), _array(101))


def test_an_object_too_big_for_the_store_fails_at_once(
        small_disk: tuple[Cluster, ClusterNode, Path]) -> None:
    with pytest.raises(ObjectStoreFullError, match="does not fit in the object store"):
        rtml.put(np.zeros(STORE // 8 + 1))
    assert np.array_equal(rtml.get(rtml.put(_array(1)), timeout=30), _array(1))


def test_a_spilled_object_whose_file_is_gone_raises_instead_of_hanging(
        small_disk: tuple[Cluster, ClusterNode, Path]) -> None:
    _, _, spill = small_disk
    refs = [rtml.put(_array(i)) for i in range(14)]  # the oldest are spilled
    spilled = sorted(spill.iterdir())
    assert spilled, "nothing was spilled"
    for path in spilled:
        path.unlink()  # the disk lost them
    lost = [ref for ref in refs if f"rtml-{ref.hex()}" in {p.name for p in spilled}]
    assert lost
    with pytest.raises(ObjectLostError, match="made by put"):
        rtml.get(lost[0], timeout=30)
    assert np.array_equal(rtml.get(refs[-1], timeout=30), _array(13))
