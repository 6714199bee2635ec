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
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
from typing import Any, TypeVar

from rtml.control_plane.tables import ControlPlane, TaskRecordData

T = TypeVar("T")

logger = logging.getLogger(__name__)


class BatchedWriter:
    """Buffers task records and events and writes them to Redis in batches.

    Write failures are logged and the batch dropped; nothing is raised into the
    submitting thread, and the flusher thread keeps running.
    """

    def __init__(self, plane: ControlPlane, interval: float = 0.02,
                 max_batch: int = 2000) -> None:
        self._plane = plane
        self._interval = interval
        self._max_batch = max_batch
        self._tasks: collections.deque[TaskRecordData] = collections.deque()
        self._events: collections.deque[dict[str, Any]] = collections.deque()
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

    def flush(self) -> None:
        """Write everything submitted before this call; returns when it is written (or dropped)."""
        with self._flush_lock:
            # Bounded by what is queued now, so steady submitters cannot keep it looping.
            tasks_left, events_left = len(self._tasks), len(self._events)
            while tasks_left > 0 or events_left > 0:
                tasks = _drain(self._tasks, min(tasks_left, self._max_batch))
                events = _drain(self._events, min(events_left, self._max_batch))
                tasks_left -= len(tasks)
                events_left -= len(events)
                self._write_tasks(tasks)
                self._write_events(events)

    def close(self) -> None:
        """Flush what is queued and stop the flusher thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception:  # the thread must outlive any bug in one flush
                logger.exception("batched control-plane flush failed; continuing")

    def _write_tasks(self, records: list[TaskRecordData]) -> None:
        if not records:
            return
        batch_id = self._batch_prefix + next(self._batch_seq).to_bytes(8, "big")
        try:
            self._plane.write_task_records(records, batch_id)
        except Exception:
            logger.exception("dropped %d task records: control-plane write failed",
                             len(records))

    def _write_events(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        try:
            self._plane.append_events(events)
        except Exception:
            logger.exception("dropped %d events: control-plane write failed", len(events))


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

