"""A node manager removes the store directories orphaned by a dead node manager."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rtml import objectstore
from rtml.node.manager import ORPHAN_MIN_AGE, sweep_orphaned_stores


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _store(pid: int, age: float) -> Path:
    path = Path(objectstore.create_store_dir(f"{pid:08x}{os.urandom(12).hex()}"))
    (path / os.urandom(20).hex()).write_bytes(b"x" * 64)
    old = time.time() - age
    os.utime(path, (old, old))
    return path


def test_sweep_removes_old_stores_of_dead_node_managers_only() -> None:
    dead = _dead_pid()
    orphan = _store(dead, ORPHAN_MIN_AGE + 10)
    young = _store(dead, 1)  # maybe its pid was reused by a new node manager
    alive = _store(os.getpid(), ORPHAN_MIN_AGE + 10)
    try:
        sweep_orphaned_stores()
        assert not orphan.exists()
        assert young.exists() and alive.exists()
        assert len(list(young.iterdir())) == 1
    finally:
        for path in (orphan, young, alive):
            objectstore.remove_store_dir(str(path))
