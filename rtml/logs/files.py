"""A node's log files, as its node manager serves them: listed, and read in bounded
chunks, never outside the session's ``logs/`` directory.

    ListLogs --> list_files(logs_dir): every regular file directly in it (name, size, mtime)
    ReadLog(name, offset, max_bytes) --> read(logs_dir, ...): LogChunk, or its error

A name is one file name of that directory: no ``/``, not ``.`` or ``..``, no leading
dot; the file is opened with ``O_NOFOLLOW`` and read only if it is a regular file, so
neither a crafted name nor a symlink planted in the directory reads anything else (the
token, the store, another user's files).
"""

from __future__ import annotations

import os
import stat

from rtml.rpc import messages as m

MAX_CHUNK = 1 << 20
"""Bytes one ReadLog returns at most (a larger ask is cut to this): a frame stays small,
and a caller reads a big file in turns."""


def bad_name(name: str) -> str:
    """Why ``name`` is not a log file name ("" when it is one)."""
    if not name or "/" in name or "\0" in name or name.startswith("."):
        return (f"{name!r} is not a log file name: give a file name as `rtml logs` lists "
                f"it (no directories)")
    return ""


def list_files(logs_dir: str) -> list[m.LogFile]:
    """The regular files directly in ``logs_dir``, by name."""
    files = []
    try:
        entries = list(os.scandir(logs_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and not bad_name(entry.name):
            files.append(m.LogFile(entry.name, info.st_size, info.st_mtime))
    return sorted(files, key=lambda f: f.name)


def read(logs_dir: str, req_id: int, name: str, offset: int, max_bytes: int) -> m.LogChunk:
    """Up to ``max_bytes`` (at most MAX_CHUNK) of file ``name`` from ``offset`` (a negative
    one counts from its end); a LogChunk with ``error`` set says why nothing was read."""
    wrong = bad_name(name)
    if wrong:
        return m.LogChunk(req_id, error=wrong)
    try:
        fd = os.open(os.path.join(logs_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return m.LogChunk(req_id, error=f"no log file {name!r} in {logs_dir}")
    except OSError as exc:
        return m.LogChunk(req_id, error=f"cannot open log file {name!r}: {exc.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return m.LogChunk(req_id, error=f"{name!r} is not a regular file")
        size = info.st_size
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        data = os.pread(fd, max(0, min(max_bytes, MAX_CHUNK)), start)
        return m.LogChunk(req_id, data, start, size)
    finally:
        os.close(fd)
