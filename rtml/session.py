"""The session directory: where a node keeps its token, sockets, logs and spills.

    /tmp/rtml-<uid>/          0700, this user's (default base, under $TMPDIR if set)
        session_latest/       the daemons' session (``rtml start``), unless told another
        sessions/session_<pid>_<random>/   one per embedded cluster (``rtml.init()``)

    <session_dir>/            0700
        token                 0600, the cluster token
        session.json          addresses and pids of the processes started here
        sockets/              Unix sockets of the node manager and workers
        logs/                 one log file per process
        spill/                objects spilled from shared memory
        redis/                Redis data and append-only file (head only)
        runtime_resources/    runtime_env caches: packages/<hash>/ unpacked, pip/<hash>/
                              virtualenvs (``rtml.worker.runtime_env``)

A session directory is trusted with the token, its sockets are where the token is sent,
and ``rtml stop`` signals the pids it lists, so it is used only if nobody else can have
changed it, as ssh's StrictModes checks a user's files: the directory, its subdirectories
and every directory rtml makes above it (the base included) must be real directories (not
symlinks) owned by this user that nobody else may write; the existing directories above
must belong to root or this user and be writable by nobody else, unless sticky (as /tmp).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtml.daemon import pid_alive
from rtml.exceptions import RtmlSystemError


@dataclass(frozen=True)
class Session:
    """Paths inside one session directory."""

    root: Path

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def record_file(self) -> Path:
        return self.root / "session.json"

    @property
    def sockets(self) -> Path:
        return self.root / "sockets"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def spill(self) -> Path:
        return self.root / "spill"

    @property
    def redis(self) -> Path:
        return self.root / "redis"

    def create(self) -> Session:
        """Make the directory tree with private permissions (what exists is checked).
        Raises RtmlSystemError naming a directory someone else could have changed."""
        private_dir(self.root, trusted_above=_default_base_of(self.root) or self.root)
        for path in (self.sockets, self.logs, self.spill, self.redis):
            private_dir(path, trusted_above=self.root)
        return self

    def check(self) -> Session:
        """Check an existing session directory before reading it or using its sockets (a
        missing one passes: there is nothing to read). Raises RtmlSystemError as create."""
        _walk(Path(os.path.abspath(self.sockets)), _default_base_of(self.root) or self.root,
              make=False)
        return self

    def write_token(self, token: str) -> None:
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)

    def read_token(self) -> str | None:
        try:
            return self.token_file.read_text().strip()
        except FileNotFoundError:
            return None

    def write_record(self, record: dict[str, Any]) -> None:
        """Atomically replace session.json."""
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".session-")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, self.record_file)

    def read_record(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.record_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"


def process_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), recorded beside its pid
    in ``session.json`` to tell a reused pid apart; None if it is not known."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def new_token() -> str:
    return secrets.token_hex(16)


def user_base() -> Path:
    """Where this user's sessions live unless told otherwise: /tmp/rtml-<uid>. (Not
    /tmp/rtml: a directory named like the package would shadow it for any script run from
    /tmp, as an implicit namespace package.)"""
    return Path(tempfile.gettempdir()) / f"rtml-{os.geteuid()}"


def default_session_dir() -> str:
    return os.environ.get("RTML_SESSION_DIR") or str(user_base() / "session_latest")


def _default_base_of(root: Path) -> Path | None:
    """The user base if ``root`` lies under it (rtml makes it: it is checked as ours)."""
    base = user_base()
    return base if root.is_relative_to(base) and root != base else None


def private_dir(path: Path, trusted_above: Path | None = None) -> None:
    """Make ``path`` (0700, with any missing directories above it), or take it as it is
    if it exists and is private. ``path``, what is made and ``trusted_above`` (with what
    lies between) must be ours alone; the directories above, safe (module docstring).
    Raises RtmlSystemError naming the directory and the fix."""
    _walk(Path(os.path.abspath(path)), trusted_above or path, make=True)
    os.chmod(path, 0o700)


def _walk(path: Path, ours_from: Path, make: bool) -> None:
    """Check every directory from / down to ``path``: from ``ours_from`` down (and any
    made here, with ``make``), ours alone; above, root's or ours and sticky if others may
    write it. Missing ones are made (0700) with ``make``, else the walk stops there."""
    ours_from = Path(os.path.abspath(ours_from))
    for step in [*reversed(path.parents), path]:
        if not os.path.lexists(step):
            if not make:
                return
            with contextlib.suppress(FileExistsError):  # (made meanwhile: checked next)
                os.mkdir(step, 0o700)
            _check_own(step)
        elif step.is_relative_to(ours_from):
            _check_own(step)
        else:
            _check_safe(step)


def _check_own(path: Path) -> None:
    """``path`` is a directory of ours (not a symlink) that nobody else may write."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        wrong = "is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        wrong = "is not a directory"
    elif st.st_uid != os.geteuid():
        wrong = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        wrong = f"can be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    else:
        return
    raise _refused(path, wrong)


def _check_safe(path: Path) -> None:
    """A directory above a session: root's or ours, and sticky if others may write it."""
    st = os.stat(path)
    if st.st_uid not in (0, os.geteuid()):
        raise _refused(path, f"belongs to uid {st.st_uid}, neither root nor this user")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise _refused(path, f"can be written by others and is not sticky (mode "
                             f"{stat.S_IMODE(st.st_mode):o})")


def _refused(path: Path, wrong: str) -> RtmlSystemError:
    return RtmlSystemError(
        f"refusing the session directory {path}: it {wrong}, so someone else could have "
        "changed what rtml keeps there (the token, the sockets, the pids it stops); "
        "remove it if it is not yours, or pass a directory of your own with "
        "--session-dir or RTML_SESSION_DIR")


KEEP_ENDED_SESSIONS = 5
"""Session directories of ended embedded clusters kept for their logs; older ones go."""


def fresh_session_dir() -> str:
    """A new unique session directory for an embedded cluster (named after this pid).

    Directories of earlier embedded clusters whose process has exited are removed,
    but for the KEEP_ENDED_SESSIONS most recent (their logs may be wanted).
    """
    base = user_base() / "sessions"
    private_dir(base, trusted_above=user_base())
    prune_ended_sessions(base)
    return tempfile.mkdtemp(prefix=f"session_{os.getpid()}_", dir=base)


def prune_ended_sessions(base: Path, keep: int = KEEP_ENDED_SESSIONS) -> None:
    """Remove the directories of ended sessions under ``base``, newest ``keep`` spared."""
    ended = []
    for path in base.glob("session_*"):
        pid = path.name.split("_")[1]
        try:
            if pid.isdigit() and pid_alive(int(pid)):
                continue
            ended.append((path.stat().st_mtime, path))
        except OSError:
            continue
    for _, path in sorted(ended, reverse=True)[keep:]:
        shutil.rmtree(path, ignore_errors=True)

