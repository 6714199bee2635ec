"""The head's control-plane writes, kept off its event loop.

    event loop                                    writes thread
    ----------                                    -------------
    write(fn, *args)          --FIFO queue------> fn(*args), in the order asked
    latest(key, fn, *args)    --one queued write per key; a newer call replaces the
                                arguments of the one still queued (heartbeats)
    aside(fn, *args)          --second thread---> long scans that must not hold up the
                                                  queue (a job's PENDING tasks)
    close(timeout)            later writes are dropped; the queues get up to timeout s

A slow or absent Redis then delays the records, never a heartbeat's handling or a
placement. A write that finds Redis away (it died; the supervisor starts it again) is
tried again, every RETRY_CAP s at most, before the writes queued after it: records
reach Redis late, in order, and none is lost. Other failures are logged and the head
goes on. The threads are daemons: a write stuck on a hung Redis cannot hold the head's
exit past ``close``'s deadline.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from rtml.control_plane import unreachable

log = logging.getLogger(__name__)

Job = tuple[Callable[..., Any], tuple[Any, ...]]


RETRY_CAP = 1.0
"""Seconds between attempts of a write that finds Redis away, at most."""


class _Worker:
    """One daemon thread running the jobs put on its queue, in order; a job that finds
    Redis away is run again until it is back (or ``closing`` is set)."""

    def __init__(self, name: str, closing: threading.Event) -> None:
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.closing = closing
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            self._run_job(*job)

    def _run_job(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        name = getattr(fn, "__name__", fn)
        delay, away = RETRY_CAP / 8, False
        while True:
            try:
                fn(*args)
            except Exception as exc:
                if not unreachable(exc) or self.closing.is_set():
                    log.exception("control-plane write %s failed", name)
                    return
                if not away:
                    away = True
                    log.warning("the control plane is away (%s); the head's records wait "
                                "for it", exc)
                if self.closing.wait(delay):
                    log.warning("control-plane write %s dropped at shutdown: Redis is away",
                                name)
                    return
                delay = min(delay * 2, RETRY_CAP)
                continue
            if away:
                log.warning("the control plane is back: writing the records kept")
            return


class PlaneWrites:
    def __init__(self) -> None:
        self._closing = threading.Event()
        self._queue = _Worker("rtml-head-plane", self._closing)
        self._aside = _Worker("rtml-head-scans", self._closing)
        self._lock = threading.Lock()
        self._latest: dict[Hashable, Job] = {}
        self._closed = False

    def write(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` after the writes queued before it."""
        self._submit(self._queue, fn, args)

    def latest(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` unless a write of ``key`` is queued: that one then writes
        these arguments instead (only the newest state of ``key`` matters)."""
        with self._lock:
            queued = key in self._latest
            self._latest[key] = (fn, args)
        if not queued:
            self._submit(self._queue, self._write_latest, (key,))

    def aside(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the second thread, in no order with the queue."""
        self._submit(self._aside, fn, args)

    def close(self, timeout: float) -> bool:
        """Drop later writes; give the queued ones up to ``timeout`` s in all. False if
        some did not finish: their threads (daemons) are left to end with the process."""
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + timeout
        give_up = threading.Timer(timeout / 2, self._closing.set)  # then stop waiting for Redis
        give_up.daemon = True
        give_up.start()
        finished = True
        for worker in (self._queue, self._aside):
            worker.jobs.put(None)
            worker.thread.join(max(0.0, deadline - time.monotonic()))
            if worker.thread.is_alive():
                log.warning("control-plane writes still queued after %g s were dropped",
                            timeout)
                finished = False
        return finished

    def _submit(self, worker: _Worker, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with self._lock:
            if self._closed:
                log.debug("control-plane write after shutdown dropped")
                return
        worker.jobs.put((fn, args))

    def _write_latest(self, key: Hashable) -> None:
        """Write the newest arguments given for ``key``; forgotten once written (a write
        that failed is run again by the worker, with whatever is newest then)."""
        while True:
            with self._lock:
                job = self._latest[key]
            fn, args = job
            fn(*args)
            with self._lock:
                if self._latest[key] is job:
                    del self._latest[key]
                    return
