"""A node's store directory: where its objects live, open to the cluster's user alone.

/dev/shm is writable by every local user, so files in it directly could be planted by
another user under the names a store is about to use, and mapped and unpickled by the
cluster's processes (code run as the cluster's user). Each node manager therefore makes
its own directory, mode 0700, under a name nobody can guess::

    node manager start    mkdir /dev/shm/rtml-<node id>  (0700; the id: pid + 96 random bits)
                          --> sent to every client in the hello's reply
    client connect        check_store_dir: a directory, not a symlink, ours, 0700
    every read            open_private: a regular file, not a symlink, ours, no bits
                          for group or others  (one fstat, which the reader needs anyway)
    node manager stop     remove_store_dir

Only the cluster's user (and root) can create a name inside, so an existing name there is
an earlier attempt of our own, never another user's file. Spill files live in the session
directory, which is private the same way, and are read through ``open_private`` too.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from rtml.exceptions import ObjectLostError, RtmlSystemError

SHM_ROOT = "/dev/shm"
PREFIX = "rtml-"


def store_dir_of(node_id_hex: str) -> str:
    """The store directory of the node with that id (hex)."""
    return os.path.join(SHM_ROOT, PREFIX + node_id_hex)


def create_store_dir(node_id_hex: str) -> str:
    """Make the node's store directory (0700); returns its path. Raises RtmlSystemError if
    it exists: its name holds 96 random bits, so someone made it to take it over."""
    path = store_dir_of(node_id_hex)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise RtmlSystemError(
            f"the object store directory {path} exists already, made by someone else "
            "(its name is random): remove it, and find out who made it") from None
    os.chmod(path, 0o700)  # (mkdir's mode passes through the umask, which could only narrow it)
    return path


def check_store_dir(path: str) -> str:
    """``path`` if it is a directory, not a symlink, owned by this process's user, with no
    access for anyone else; raises RtmlSystemError naming what is wrong otherwise."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RtmlSystemError(f"the node manager's object store {path} cannot be "
                              f"read ({exc.strerror})") from None
    wrong = _wrong(st, stat.S_ISDIR, "a directory")
    if wrong:
        raise RtmlSystemError(f"refusing the object store {path}: {wrong}; is the node "
                              "manager this session names the cluster's own?")
    return path


def open_private(path: str) -> int:
    """Open an object's file read-only after checking it is ours alone; returns the fd.
    Raises FileNotFoundError if it is absent and ObjectLostError if it is not private."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        wrong = _wrong(os.fstat(fd), stat.S_ISREG, "a regular file")
    except BaseException:
        os.close(fd)
        raise
    if wrong:
        os.close(fd)
        raise ObjectLostError(f"refusing to read object file {path}: {wrong} (not written "
                              "by this cluster); the object must be rebuilt or re-fetched")
    return fd


def _wrong(st: os.stat_result, is_kind: Callable[[int], bool], kind: str) -> str:
    """What makes ``st`` not private to this user ("" if nothing)."""
    if not is_kind(st.st_mode):
        return f"it is not {kind}"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return f"its mode {stat.S_IMODE(st.st_mode):o} lets others in"
    return ""


def remove_store_dir(path: str) -> None:
    """Remove a store directory of ours and every file in it (gone already, or someone
    else's: nothing to do)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if _wrong(st, stat.S_ISDIR, "a directory"):
            return
        for entry in os.scandir(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        os.rmdir(path)


def store_dirs() -> list[Path]:
    """Every store directory on this machine that this user owns."""
    me = os.geteuid()
    found = []
    for path in Path(SHM_ROOT).glob(PREFIX + "*"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == me:
                found.append(path)
    return found
