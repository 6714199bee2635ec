"""A node manager removes shared-memory segments orphaned by a dead node manager."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rtml.node.manager import ORPHAN_MIN_AGE, sweep_orphaned_segments


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _segment(pid: int, tag: str, age: float) -> Path:
    path = Path(f"/dev/shm/rtml-{pid:08x}{tag}-{os.urandom(20).hex()}")
    path.write_bytes(b"x" * 64)
    old = time.time() - age
    os.utime(path, (old, old))
    return path


def test_sweep_removes_old_segments_of_dead_node_managers_only() -> None:
    dead = _dead_pid()
    orphan = _segment(dead, "abcd", ORPHAN_MIN_AGE + 10)
    young = _segment(dead, "abce", 1)  # maybe still being written by someone else
    alive = _segment(os.getpid(), "abcf", ORPHAN_MIN_AGE + 10)
    try:
        sweep_orphaned_segments()
        assert not orphan.exists()
        assert young.exists() and alive.exists()
    finally:
        for path in (orphan, young, alive):
            path.unlink(missing_ok=True)
