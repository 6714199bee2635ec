"""What a Pool hands back: ``AsyncResult`` (apply_async, map_async) and ``IMapIterator``.

    chunk ref --.future()--> Chunk (a Future of [value | Failure, ...])
      AsyncResult: every chunk done --> value or first error (input order)
                   --> callback(value) | error_callback(error) --> ready; get() returns
      IMapIterator: next() --> keep `window` chunks submitted, pulling the input lazily
                           --> the head chunk (imap) | the first done (imap_unordered)
                           --> its items, one by one; a Failure is raised at its place

Callbacks run in the driver, one at a time (a lock the pool shares among its results),
as Python's single result-handler thread runs them: a callback should return quickly.
A chunk that failed as a whole (its actor died or was terminated) gives its error at
each of its places.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import multiprocessing
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rtml.util.multiprocessing.process import Failure

log = logging.getLogger(__name__)

Callback = Callable[[Any], object]


@dataclass(frozen=True)
class Chunk:
    """One submitted chunk: the future of its outcomes, and how many items it holds."""

    future: concurrent.futures.Future[list[Any]]
    size: int

    def outcomes(self) -> list[Any]:
        """Its values and Failures, in order; each place a Failure if it failed whole.
        Call once it is done."""
        error = self.future.exception()
        if error is not None:
            return [Failure(error)] * self.size
        return self.future.result()


def first_failure(outcomes: list[Any]) -> Failure | None:
    return next((o for o in outcomes if isinstance(o, Failure)), None)


class AsyncResult:
    """The result of ``apply_async``, ``map_async`` or ``starmap_async``, as Python's.

    ``get`` raises the first error (in input order) of the calls, as the user's exception
    class, once every call is done.
    """

    def __init__(self, chunks: list[Chunk], single: bool, callback: Callback | None,
                 error_callback: Callback | None, callback_lock: threading.Lock) -> None:
        self._chunks = chunks
        self._single = single
        self._callback = callback
        self._error_callback = error_callback
        self._callback_lock = callback_lock
        self._left = len(chunks)
        self._left_lock = threading.Lock()
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        if not chunks:  # map of nothing: [] at once, as Python
            self._finish()
        for chunk in chunks:
            chunk.future.add_done_callback(self._chunk_done)

    def _chunk_done(self, _: concurrent.futures.Future[list[Any]]) -> None:
        with self._left_lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        outcomes = [o for chunk in self._chunks for o in chunk.outcomes()]
        failure = first_failure(outcomes)
        if failure is not None:
            self._error = failure.error
        else:
            self._value = outcomes[0] if self._single else outcomes
        self._chunks = []  # the futures hold the values a second time
        self._run_callback()
        self._done.set()

    def _run_callback(self) -> None:
        callback, arg = ((self._error_callback, self._error) if self._error is not None
                         else (self._callback, self._value))
        if callback is None:
            return
        with self._callback_lock:
            try:
                callback(arg)
            except Exception:  # noqa: BLE001 - as Python's pool, it does not stop the rest
                log.exception("a Pool callback %r raised", callback)

    def ready(self) -> bool:
        """Whether every call is done (and its callback has run)."""
        return self._done.is_set()

    def successful(self) -> bool:
        """Whether no call raised; ValueError if not ready yet (as Python)."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready: call wait() or get() first")
        return self._error is None

    def wait(self, timeout: float | None = None) -> None:
        """Block until ready, or for ``timeout`` seconds."""
        self._done.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The value (a list for map); raises the first call's error, or
        ``multiprocessing.TimeoutError`` if not ready within ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise multiprocessing.TimeoutError(
                f"the pool's result was not ready within {timeout} s; get() again to "
                f"wait longer")
        if self._error is not None:
            raise self._error
        return self._value


class IMapIterator:
    """The results of ``imap`` (in input order) or ``imap_unordered`` (as they finish).

    The input is pulled lazily: ``window`` chunks at most are submitted and not yet
    yielded, so an endless iterable works. ``next(timeout)`` raises
    ``multiprocessing.TimeoutError`` if the next result is not there in time. Once the
    pool is terminated (or joined) the chunks already submitted are still handed out
    (a terminated one's as ActorDiedError), then ``ValueError("Pool not running")``.
    """

    def __init__(self, submit: Callable[[list[Any]], Chunk], items: Iterator[Any],
                 chunksize: int, window: int, ordered: bool) -> None:
        self._submit = submit
        self._items = items
        self._chunksize = chunksize
        self._window = window
        self._ordered = ordered
        self._pending: deque[Chunk] = deque()  # submitted, not yet taken, in order
        self._ready: deque[Any] = deque()  # outcomes of taken chunks, not yet yielded
        self._exhausted = False
        self._stopped: ValueError | None = None  # the pool went before the input did
        self._lock = threading.Lock()  # pulling the input: the consumer, or Pool.join

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: float | None = None) -> Any:
        """The next result; raises its call's error, or StopIteration at the end."""
        while not self._ready:
            self._top_up()
            if not self._pending:
                raise self._stopped or StopIteration
            self._ready.extend(self._take(timeout).outcomes())
        outcome = self._ready.popleft()
        if isinstance(outcome, Failure):
            raise outcome.error
        return outcome

    def _take(self, timeout: float | None) -> Chunk:
        """The next chunk to yield, once done: the oldest (imap) or any (unordered)."""
        with self._lock:
            candidates = [self._pending[0]] if self._ordered else list(self._pending)
        done, _ = concurrent.futures.wait([c.future for c in candidates], timeout,
                                          concurrent.futures.FIRST_COMPLETED)
        if not done:
            raise multiprocessing.TimeoutError(
                f"no result of the pool's imap within {timeout} s; call next() again to "
                f"wait longer")
        chunk = next(c for c in candidates if c.future in done)
        with self._lock:
            self._pending.remove(chunk)
        self._top_up()  # before the consumer works on it: keep the processes busy
        return chunk

    def _top_up(self) -> None:
        with self._lock:
            while len(self._pending) < self._window and self._submit_next():
                pass

    def submit_rest(self) -> None:
        """Submit all the input left (Pool.join: every task runs, consumed or not)."""
        with self._lock:
            while self._submit_next():
                pass

    def _submit_next(self) -> bool:
        """Submit the next chunk of the input; False once it is used up."""
        if self._exhausted:
            return False
        items = list(itertools.islice(self._items, self._chunksize))
        if not items:
            self._exhausted = True
            return False
        try:
            chunk = self._submit(items)
        except ValueError as exc:  # terminated or joined: hand out what was submitted first
            self._exhausted, self._stopped = True, exc
            return False
        self._pending.append(chunk)
        return True
