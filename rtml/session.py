"""The session directory: where a node keeps its token, sockets, logs and spills.

    <session_dir>/            0700
        token                 0600, the cluster token
        session.json          addresses and pids of the processes started here
        sockets/              Unix sockets of the node manager and workers
        logs/                 one log file per process
        spill/                objects spilled from shared memory
        redis/                Redis data and append-only file (head only)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtml.daemon import pid_alive

DEFAULT_SESSION_DIR = "/tmp/rtml/session_latest"


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
        """Make the directory tree with private permissions."""
        for path in (self.root, self.sockets, self.logs, self.spill, self.redis):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o700)
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


def default_session_dir() -> str:
    return os.environ.get("RTML_SESSION_DIR", DEFAULT_SESSION_DIR)


KEEP_ENDED_SESSIONS = 5
"""Session directories of ended embedded clusters kept for their logs; older ones go."""


def fresh_session_dir() -> str:
    """A new unique session directory for an embedded cluster (named after this pid).

    Directories of earlier embedded clusters whose process has exited are removed,
    but for the KEEP_ENDED_SESSIONS most recent (their logs may be wanted).
    """
    # Not /tmp/rtml: a directory named like the package would shadow it for any
    # script run from /tmp (an implicit namespace package).
    base = Path(tempfile.gettempdir()) / "rtml-sessions"
    base.mkdir(parents=True, exist_ok=True)
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

