"""Connections that have not proven the token yet: how many a listener holds, and what
it says about the ones it turns away. Every listener uses these (node manager, head,
workers, object-transfer side streams, Launchpad's courier and controller).

    accept --> Admissions.arrive(conn, peer) --> a connection displaced? close it
               ... the handshake, within its deadline ...
           --> Admissions.leave(conn)      (proven, refused, timed out or closed)

Over a cap (per listener, or per peer address), a new connection displaces the oldest
pending one (of its peer, when that peer is at its cap) rather than being refused:
idle connections, however many, cannot keep out a client that proves the token at once
(a handshake takes about a millisecond; they sit until their deadline).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Hashable
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)

HELLO_TIMEOUT = 5.0
"""Seconds a connection has to prove the token before it is closed."""


class Admissions(Generic[C]):
    """The pending connections of one listener, oldest first (thread-safe)."""

    def __init__(self, max_pending: int, max_per_peer: int) -> None:
        self.max_pending = max_pending
        self.max_per_peer = max_per_peer
        self._pending: dict[C, str] = {}
        self._per_peer: Counter[str] = Counter()
        self._lock = threading.Lock()

    def arrive(self, conn: C, peer: str) -> C | None:
        """Count ``conn`` (from ``peer``) in; returns the connection it displaces, which
        the caller closes (it no longer counts), or None."""
        with self._lock:
            if self._per_peer[peer] >= self.max_per_peer:
                victim: C | None = next(c for c, p in self._pending.items() if p == peer)
            elif len(self._pending) >= self.max_pending:
                victim = next(iter(self._pending))
            else:
                victim = None
            if victim is not None:
                self._count_out(victim)
            self._pending[conn] = peer
            self._per_peer[peer] += 1
            return victim

    def leave(self, conn: C) -> None:
        """``conn`` no longer waits to prove the token (a second call does nothing)."""
        with self._lock:
            self._count_out(conn)

    def _count_out(self, conn: C) -> None:
        peer = self._pending.pop(conn, None)
        if peer is not None:
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]

    def __len__(self) -> int:
        return len(self._pending)


class RefusalLog:
    """Log refused connections at most once per ``every`` seconds, with how many there
    were: a flood of bad connections must not fill the disk (thread-safe)."""

    def __init__(self, logger: logging.Logger, listener: str, every: float = 10.0) -> None:
        self.logger = logger
        self.listener = listener
        self.every = every
        self._count = 0
        self._logged = -every
        self._lock = threading.Lock()

    def refused(self, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._count += 1
            if now - self._logged < self.every:
                return
            count, self._count, self._logged = self._count, 0, now
        self.logger.warning("%s refused %d connection(s) since it last said; the last: %s",
                            self.listener, count, why)
