"""A client's (driver's or worker's) connection to the head service, kept through head
restarts.

    send(msg)        written now. While the head is away: a request (a message with a
                     req_id) waits for it, other messages queue
    head gone        (not our close) a thread reconnects with the same hello, every
                     RECONNECT_MAX_DELAY s at most, for up to ``timeout`` s
    back             ``on_back()``'s messages go first (the runtime's: the actors this
                     process created, which the head that took over may not have heard
                     of), then the last KILLS_KEPT kills and placement group creations
                     and removals (one written to a head that was stopped, then died, was
                     never read; each is idempotent), then the
                     requests still unanswered, then what queued, in order
    not back         ``on_gone(error, req_ids)``: every waiting request fails with
                     ``error``, and so does every later one; other messages are dropped

A reply (its req_id) ends a request's wait: the runtime calls :meth:`settled`, as when it
stops waiting. The new head takes this driver's job back from its hello
(``rtml.head.service``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from rtml.exceptions import RtmlSystemError
from rtml.rpc import messages as m
from rtml.rpc.reactor import CloseHandler, Connection, Handler, Reactor, open_connection

log = logging.getLogger(__name__)

RECONNECT_MAX_DELAY = 0.5
"""Seconds between reconnection attempts, at most (they start at 0.02 s and double)."""
KILLS_KEPT = 1000


class HeadLink:
    def __init__(self, reactor: Reactor, address: str, token: str, hello: m.Hello,
                 handler: Handler, timeout: float, on_back: Callable[[], list[m.Msg]],
                 on_gone: Callable[[RtmlSystemError, list[int]], None]) -> None:
        """Connect. Raises RtmlSystemError if the head cannot be reached now."""
        self.reactor = reactor
        self.name = address
        self.token = token
        self.hello = hello
        self.handler = handler
        self.timeout = timeout  # also how long a request may wait (a hung head answers nothing)
        self.on_back = on_back
        self.on_gone = on_gone
        self.closed = False
        self.gone: RtmlSystemError | None = None
        self._lock = threading.Lock()
        self._unanswered: dict[int, m.Msg] = {}
        self._queued: list[m.Msg] = []
        self._kills: deque[m.Msg] = deque(maxlen=KILLS_KEPT)
        self.conn: Connection | None
        self.conn, self.reply = self._connect()

    def _connect(self) -> tuple[Connection, m.HelloReply]:
        on_close: CloseHandler = self._on_closed
        return open_connection(self.reactor, self.name, self.token, self.hello, self.handler,
                               on_close)

    def send(self, msg: m.Msg) -> None:
        """Raises RtmlSystemError for a request once the head is given up on."""
        req_id: int = getattr(msg, "req_id", 0)
        with self._lock:
            if self.gone is not None:
                if req_id:
                    raise self.gone
                return
            if req_id:
                self._unanswered[req_id] = msg
            elif (isinstance(msg, m.KillActor) and msg.no_restart) or isinstance(
                    msg, m.CreatePlacementGroup | m.RemovePlacementGroup):
                self._kills.append(msg)  # (as a kill: a head that takes over hears it again)
            conn = self.conn
            if conn is None:
                if not req_id:
                    self._queued.append(msg)
                return
        conn.send(msg)

    def settled(self, req_id: int) -> None:
        """Request ``req_id`` was answered, or its asker stopped waiting: it is not sent
        again."""
        if req_id:
            with self._lock:
                self._unanswered.pop(req_id, None)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            conn, self.conn = self.conn, None
        if conn is not None:
            conn.on_close = None
            conn.close("shutdown")

    def _on_closed(self, conn: Connection, reason: str) -> None:
        with self._lock:
            if self.closed or conn is not self.conn:
                return
            self.conn = None
        log.warning("lost the head service at %s (%s); reconnecting for up to %g s",
                    self.name, reason, self.timeout)
        threading.Thread(target=self._reconnect, name="rtml-head-reconnect",
                         daemon=True).start()

    def _reconnect(self) -> None:
        deadline = time.monotonic() + self.timeout
        delay = 0.02
        while not self.closed:
            try:
                conn, _ = self._connect()
            except RtmlSystemError as exc:
                if time.monotonic() + delay > deadline:
                    self._give_up(exc)
                    return
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_DELAY)
                continue
            first = self.on_back()
            with self._lock:
                if self.closed:
                    conn.close("shutdown")
                    return
                self.conn = conn
                resend = [*first, *self._kills]
                resend += [self._unanswered[r] for r in sorted(self._unanswered)]
                resend += self._queued
                self._queued = []
            for msg in resend:
                conn.send(msg)
            log.info("reconnected to the head service at %s", self.name)
            return

    def _give_up(self, last: RtmlSystemError) -> None:
        error = RtmlSystemError(
            f"the head service at {self.name} has been unreachable for {self.timeout:g} s "
            f"({last}); what needs it (actors, rtml.nodes(), named actors) fails. Restart "
            f"the cluster, or raise RTML_HEAD_TIMEOUT_S to wait longer")
        with self._lock:
            self.gone = error
            waiting = list(self._unanswered)
            self._unanswered.clear()
            self._queued.clear()
        log.error("%s", error)
        self.on_gone(error, waiting)
