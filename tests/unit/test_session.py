"""Session directories of ended embedded clusters are pruned, the newest few kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rtml.session import prune_ended_sessions


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_ended_sessions_are_pruned_but_the_newest_are_kept(tmp_path: Path) -> None:
    dead = _dead_pid()
    live = tmp_path / f"session_{os.getpid()}_live"
    live.mkdir()
    ended = []
    for i in range(4):
        path = tmp_path / f"session_{dead}_{i}"
        path.mkdir()
        (path / "log").write_text("x")
        os.utime(path, (time.time() - 100 + i, time.time() - 100 + i))
        ended.append(path)
    prune_ended_sessions(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, ended[2].name, ended[3].name])
