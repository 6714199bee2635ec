"""Batched, off-the-hot-path writes of task records and events to the control plane.

::

    submit_task / submit_event   (caller's thread: one deque.append, ~0.1 us)
        |
        v
    deque (tasks)   deque (events)
        |   every `interval` s, or on flush()
        v
    flusher thread: drain <= max_batch
        |
        v
    ControlPlane.write_task_records / append_events   (one round trip each; a batch of
                                                       task records is one hash field)

``deque.append`` and ``deque.popleft`` are atomic, so submitting takes no lock.
A lock serialises *flushes* only, so a caller's ``flush()`` and the thread never
write two batches out of order (an older status cannot overwrite a newer one).

While Redis cannot be reached (it died and its supervisor starts it again), a batch
that failed goes back to the front of its queue and the next flush tries again:
nothing is lost but what exceeds ``MAX_QUEUED`` (the oldest, counted in the log).
Functions exported meanwhile wait here too, and are written before anything else.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
from typing import Any, TypeVar

from rtml.control_plane.tables import ControlPlane, TaskRecordData, unreachable

T = TypeVar("T")

logger = logging.getLogger(__name__)

MAX_QUEUED = 200_000
"""Task records (and, apart, events) kept while Redis is away; older ones are dropped."""


class BatchedWriter:
    """Buffers task records and events and writes them to Redis in batches.

    A write that fails because Redis is away is kept and tried again; other failures
    are logged and the batch dropped. Nothing is raised into the submitting thread,
    and the flusher thread keeps running.
    """

    def __init__(self, plane: ControlPlane, interval: float = 0.02,
                 max_batch: int = 2000) -> None:
        self._plane = plane
        self._interval = interval
        self._max_batch = max_batch
        self._tasks: collections.deque[TaskRecordData] = collections.deque()
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._functions: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._away = False  # the last write found Redis away (logged once per outage)
        self._flush_lock = threading.Lock()
        self._batch_prefix = os.urandom(8)  # then a sequence number: batches sort in order
        self._batch_seq = itertools.count()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rtml-batched-writer",
                                        daemon=True)
        self._thread.start()

    def submit_task(self, record: TaskRecordData) -> None:
        """Queue a task record (with a ``task_id``; a dict, or a compact tuple: see
        ``ControlPlane.write_task_records``); never blocks, never raises."""
        self._tasks.append(record)

    def submit_event(self, event: dict[str, Any]) -> None:
        """Queue a timeline event; never blocks, never raises."""
        self._events.append(event)

    def submit_function(self, function_id: bytes, blob: bytes) -> None:
        """Queue the export of a function that could not be written at once (Redis away)."""
        self._functions.append((function_id, blob))

    def flush(self) -> None:
        """Write everything submitted before this call; returns when it is written, or
        dropped, or kept for the next flush because Redis is away."""
        with self._flush_lock:
            while self._functions:
                if not self._write(self._plane.export_function, *self._functions[0]):
                    return
                self._functions.popleft()
            # Bounded by what is queued now, so steady submitters cannot keep it looping.
            tasks_left, events_left = len(self._tasks), len(self._events)
            while tasks_left > 0 or events_left > 0:
                tasks = _drain(self._tasks, min(tasks_left, self._max_batch))
                events = _drain(self._events, min(events_left, self._max_batch))
                tasks_left -= len(tasks)
                events_left -= len(events)
                if not (self._write_tasks(tasks) and self._write_events(events)):
                    self._tasks.extendleft(reversed(tasks))  # (a batch written twice is
                    self._events.extendleft(reversed(events))  # the same hash field)
                    self._bound()
                    return

    def close(self) -> None:
        """Flush what is queued and stop the flusher thread; what Redis, away, did not
        take is dropped (logged). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        self.flush()
        left = len(self._tasks) + len(self._events) + len(self._functions)
        if left:
            logger.warning("dropped %d control-plane records at exit: Redis at %s:%d is away",
                           left, self._plane.host, self._plane.port)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception:  # the thread must outlive any bug in one flush
                logger.exception("batched control-plane flush failed; continuing")

    def _write_tasks(self, records: list[TaskRecordData]) -> bool:
        if not records:
            return True
        batch_id = self._batch_prefix + next(self._batch_seq).to_bytes(8, "big")
        return self._write(self._plane.write_task_records, records, batch_id)

    def _write_events(self, events: list[dict[str, Any]]) -> bool:
        return not events or self._write(self._plane.append_events, events)

    def _write(self, write: Any, *args: Any) -> bool:
        """One write; False if Redis is away (to be tried again)."""
        try:
            write(*args)
        except Exception as exc:
            if unreachable(exc):
                if not self._away:
                    self._away = True
                    logger.warning("the control plane is away (%s); its records are kept "
                                   "and written once it is back", exc)
                return False
            logger.exception("dropped a control-plane write (%s)", getattr(write, "__name__",
                                                                           write))
            return True
        if self._away:
            self._away = False
            logger.warning("the control plane is back; writing the records kept meanwhile")
        return True

    def _bound(self) -> None:
        """Keep at most MAX_QUEUED of each queue while Redis is away: the oldest go."""
        for queue in (self._tasks, self._events):
            excess = len(queue) - MAX_QUEUED
            if excess > 0:
                for _ in range(excess):
                    queue.popleft()
                logger.warning("dropped the %d oldest control-plane records: Redis has been "
                               "away for long", excess)


def _drain(queue: collections.deque[T], limit: int) -> list[T]:
    """Pop up to ``limit`` items from the left of ``queue``."""
    out: list[T] = []
    popleft = queue.popleft
    try:
        for _ in range(limit):
            out.append(popleft())
    except IndexError:
        pass
    return out

