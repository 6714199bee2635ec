"""The session's log files, as the dashboard lists and follows them: one file per daemon
and per worker in ``<session>/logs/`` (``head.log``, ``node_manager.log``,
``worker-<id>.log`` and what each printed, ``*-out.log``; ``job-driver-<id>.log``).

A read names a file by its name in that directory, never by a path: a name that is not
one of the listed files is refused, so nothing outside the directory can be read.
Following a file is reading it again from the offset the last read ended at.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READ_MAX = 256 * 1024
"""Bytes one read returns at most (a follower reads on from where it ended)."""


@dataclass(frozen=True)
class Chunk:
    """Bytes of a log from ``offset`` to ``next_offset`` (of ``size`` now)."""

    name: str
    offset: int
    next_offset: int
    size: int
    text: str

    def asdict(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "next_offset": self.next_offset,
                "size": self.size, "text": self.text}


def list_logs(directory: Path) -> list[dict[str, Any]]:
    """``{"name", "size", "modified", "kind"}`` of each log file, by name."""
    found = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name) if directory.is_dir() else []:
        if entry.is_file(follow_symlinks=False) and entry.name.endswith(".log"):
            stat = entry.stat(follow_symlinks=False)
            found.append({"name": entry.name, "size": stat.st_size,
                          "modified": stat.st_mtime, "kind": _kind(entry.name)})
    return found


def _kind(name: str) -> str:
    if name.startswith("worker-"):
        return "worker"
    if name.startswith("job-driver-"):
        return "job"
    return "daemon"


def log_path(directory: Path, name: str) -> Path:
    """The file of the log called ``name``. Raises LookupError if there is none."""
    if name in {entry["name"] for entry in list_logs(directory)}:
        return directory / name
    raise LookupError(f"no log file {name!r} in this session; /api/logs lists them")


def read_log(directory: Path, name: str, offset: int, limit: int = READ_MAX) -> Chunk:
    """Up to ``limit`` bytes of log ``name`` from ``offset`` (negative: that many bytes
    before its end). Raises LookupError for an unknown name."""
    path = log_path(directory, name)
    with open(path, "rb", opener=_no_follow) as f:
        size = os.fstat(f.fileno()).st_size
        start = max(size + offset, 0) if offset < 0 else min(offset, size)
        f.seek(start)
        data = f.read(min(limit, READ_MAX))
    return Chunk(name, start, start + len(data), size, data.decode("utf-8", "replace"))


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)
