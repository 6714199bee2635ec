"""``batched_handler``: concurrent calls of a handler stacked into one call.

    caller 1 --f(x1)--+
    caller 2 --f(x2)--+--> batch full, or `timeout` s after its first call
    caller N --f(xN)--+        --> f(stack(x1..xN))  (numpy arrays: a new leading axis;
                                                      other values: lists)
    each caller <-- its row of the result (result[i])

Courier handlers run on a thread pool, so callers that arrive together block
in the handler while their batch fills; one of them runs the batched call.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

DEFAULT_TIMEOUT = 0.01


def batched_handler(batch_size: int, timeout: float = DEFAULT_TIMEOUT,
                    max_parallelism: int = 1) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a handler so that up to ``batch_size`` concurrent calls become one.

    The wrapped function receives each argument stacked along a new leading axis
    (numpy arrays) or as a list, and must return something indexable by the
    call's position in the batch (an array with a leading batch axis, a list or
    tuple). ``max_parallelism`` batched calls may run at once.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return BatchedHandler(fn, batch_size, timeout, max_parallelism)
    return decorate


class BatchedHandler:
    """A batched function; on a class, each instance gets its own batches (``__get__``).

    Its batching state is made on first call, so a class holding one still pickles.
    """

    def __init__(self, fn: Callable[..., Any], size: int, timeout: float,
                 parallelism: int) -> None:
        functools.update_wrapper(self, fn)
        self.fn, self.size, self.timeout, self.parallelism = fn, size, timeout, parallelism
        self._batcher: _Batcher | None = None
        self._bound: weakref.WeakKeyDictionary[Any, BatchedHandler] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _CREATE:
            if self._batcher is None:
                self._batcher = _Batcher(self.fn, self.size, self.timeout, self.parallelism)
        return self._batcher.call(args, kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        with _CREATE:
            if self._bound is None:
                self._bound = weakref.WeakKeyDictionary()
            bound = self._bound.get(instance)
            if bound is None:
                bound = BatchedHandler(functools.partial(self.fn, instance), self.size,
                                       self.timeout, self.parallelism)
                self._bound[instance] = bound
        return bound

    def __reduce__(self) -> Any:
        return (BatchedHandler, (self.fn, self.size, self.timeout, self.parallelism))


_CREATE = threading.Lock()


class _Batch:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.closed = False
        self.done = threading.Event()
        self.results: Any = None
        self.error: BaseException | None = None


class _Batcher:
    def __init__(self, fn: Callable[..., Any], size: int, timeout: float,
                 parallelism: int) -> None:
        self.fn, self.size, self.timeout = fn, size, timeout
        self.lock = threading.Condition()
        self.open: _Batch | None = None
        self.slots = threading.Semaphore(parallelism)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self.lock:
            batch = self.open
            if batch is None:
                batch = self.open = _Batch()
            index = len(batch.calls)
            batch.calls.append((args, kwargs))
            leader = index == 0
            if len(batch.calls) >= self.size:
                self._close(batch)
        if leader:
            self._lead(batch)
        batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return batch.results[index]

    def _close(self, batch: _Batch) -> None:
        batch.closed = True
        if self.open is batch:
            self.open = None
        self.lock.notify_all()

    def _lead(self, batch: _Batch) -> None:
        """The first caller waits for the batch to fill (or time out), then runs it."""
        with self.lock:
            self.lock.wait_for(lambda: batch.closed, self.timeout)
            self._close(batch)
        with self.slots:
            try:
                args, kwargs = _stack(batch.calls)
                results = self.fn(*args, **kwargs)
                _check_rows(results, len(batch.calls))
                batch.results = results
            except BaseException as exc:
                batch.error = exc
        batch.done.set()


def _stack(calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> tuple[
        list[Any], dict[str, Any]]:
    first_args, first_kwargs = calls[0]
    for args, kwargs in calls:
        if len(args) != len(first_args) or kwargs.keys() != first_kwargs.keys():
            raise TypeError("calls batched together must pass the same arguments "
                            "(positions and keyword names)")
    stacked = [_column([args[i] for args, _ in calls]) for i in range(len(first_args))]
    named = {k: _column([kwargs[k] for _, kwargs in calls]) for k in first_kwargs}
    return stacked, named


def _column(values: list[Any]) -> Any:
    if all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values)
    return values


def _check_rows(results: Any, n: int) -> None:
    try:
        rows = len(results)
    except TypeError:
        raise TypeError(f"a batched handler must return one row per call (an array with a "
                        f"leading axis of {n}, or a list), got {type(results).__name__}") \
            from None
    if rows != n:
        raise ValueError(f"a batched handler got {n} calls but returned {rows} rows")
