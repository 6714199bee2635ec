"""The head's control-plane writes, kept off its event loop.

    event loop                                    writes thread
    ----------                                    -------------
    write(fn, *args, then=cb) --FIFO queue------> fn(*args), in the order asked
                              <--call_soon_threadsafe(cb)-- once done (or failed)
    latest(key, fn, *args)    --one queued write per key; a newer call replaces the
                                arguments of the one still queued (heartbeats)
    aside(fn, *args)          --second thread---> long scans that must not hold up the
                                                  queue (a job's PENDING tasks)
    close(timeout)            later writes are dropped; the queues get up to timeout s

A slow or absent Redis then delays the records, never a heartbeat's handling or a
placement; a failed write is logged and the head goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger(__name__)


class PlaneWrites:
    def __init__(self) -> None:
        self._queue = concurrent.futures.ThreadPoolExecutor(1, "rtml-head-plane")
        self._aside = concurrent.futures.ThreadPoolExecutor(1, "rtml-head-scans")
        self._lock = threading.Lock()
        self._latest: dict[Hashable, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
        self._closed = False

    def write(self, fn: Callable[..., Any], *args: Any,
              then: Callable[[], None] | None = None) -> None:
        """Queue ``fn(*args)``; ``then()`` runs on the calling event loop once it is done."""
        loop = asyncio.get_running_loop() if then is not None else None
        self._submit(self._queue, _run, fn, args, loop, then)

    def latest(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` unless a write of ``key`` is queued: that one then writes
        these arguments instead (only the newest state of ``key`` matters)."""
        with self._lock:
            queued = key in self._latest
            self._latest[key] = (fn, args)
        if not queued:
            self._submit(self._queue, self._write_latest, key)

    def aside(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the second thread, in no order with the queue."""
        self._submit(self._aside, _run, fn, args, None, None)

    def close(self, timeout: float) -> None:
        """Drop later writes; give the queued ones up to ``timeout`` s, then stop."""
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + timeout
        for pool in (self._queue, self._aside):
            marker = pool.submit(_nothing)
            try:
                marker.result(max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                log.warning("control-plane writes still queued after %g s were dropped",
                            timeout)
            pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, pool: concurrent.futures.ThreadPoolExecutor, fn: Callable[..., Any],
                *args: Any) -> None:
        with self._lock:  # so that no write is submitted after close() shut a pool down
            if self._closed:
                log.debug("control-plane write after shutdown dropped")
                return
            pool.submit(fn, *args)

    def _write_latest(self, key: Hashable) -> None:
        with self._lock:
            fn, args = self._latest.pop(key)
        _run(fn, args, None, None)


def _run(fn: Callable[..., Any], args: tuple[Any, ...],
         loop: asyncio.AbstractEventLoop | None, then: Callable[[], None] | None) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("control-plane write %s failed", getattr(fn, "__name__", fn))
    if loop is not None and then is not None:
        try:
            loop.call_soon_threadsafe(then)
        except RuntimeError:  # the loop closed meanwhile: nobody is left to tell
            pass


def _nothing() -> None:
    pass
