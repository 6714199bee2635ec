"""Generator tasks (Ray's streaming generators): the caller gets each item's ref as soon
as the task yields it.

    f.remote() --submit, num_returns=STREAMING--> ObjectRefGenerator (over a Stream)
    worker: for item in f(...): store it --GeneratorItem(index)--> owner
    owner: item's value stored, its ref appended to the Stream --> next(gen) returns it
    worker --TaskResult--> owner: the Stream ends (an error ends it with the error as its
                           last item); gen.completed() is set

Items are in order: index i is object ``object_id_for(task_id, i + 2)`` (index 1 is the
task's own return, its completion). A retried task yields again from the start, and
the items its owner has already are skipped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from rtml.core.links import ClientLinks
from rtml.core.object_ref import ObjectRef
from rtml.exceptions import GetTimeoutError
from rtml.ids import ObjectID, TaskID, object_id_for
from rtml.rpc.reactor import Flag


class Stream:
    """The items of one generator task as its owner receives them (under the runtime's
    lock): the refs not yet taken by the consumer, how many came, whether it ended."""

    def __init__(self) -> None:
        self.refs: deque[ObjectRef] = deque()
        self.received = 0
        self.ended = False
        self.abandoned = False  # the consumer dropped its generator: items are let go
        self.waiters: list[Callable[[], Any]] = []

    def accept(self, index: int) -> bool:
        """Whether item ``index`` is the next one (a retried task yields its items again);
        counted if so."""
        if index != self.received or self.ended:
            return False
        self.received += 1
        return True

    def add(self, ref: ObjectRef) -> None:
        """The ref of an item accepted, once its value is stored."""
        if not self.abandoned:
            self.refs.append(ref)
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()


class DynamicObjectRefGenerator:
    """The value of a ``num_returns="dynamic"`` task's ref: the refs of its items, in the
    order it yielded them (iterate it, ``len()`` it; picklable, as a list of refs is)."""

    def __init__(self, refs: list[ObjectRef]) -> None:
        self._refs = refs

    def __iter__(self) -> Iterator[ObjectRef]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DynamicObjectRefGenerator, (self._refs,))

    def __repr__(self) -> str:
        return f"DynamicObjectRefGenerator({len(self._refs)} refs)"


class ObjectRefGenerator:
    """What ``.remote()`` of a generator function (or method) returns: iterate it for the
    refs of the items, each as soon as the task yields it (``for ref in gen`` or
    ``async for``); ``rtml.get(ref)`` raises the task's error at the item where it
    failed. ``rtml.cancel(gen)`` stops the task."""

    def __init__(self, links: ClientLinks, task_id: TaskID, stream: Stream,
                 completed: ObjectRef) -> None:
        self._links = links
        self._task_id = task_id
        self._stream = stream
        self._completed = completed

    def __iter__(self) -> ObjectRefGenerator:
        return self

    def __next__(self) -> ObjectRef:
        return self._next(None)

    def next(self, timeout: float | None = None) -> ObjectRef:
        """The next item's ref; GetTimeoutError if it is not yielded within ``timeout``
        s; StopIteration once the task has ended and every item was taken."""
        return self._next(None if timeout is None else time.monotonic() + timeout)

    def _take(self, wake: Callable[[], Any]) -> ObjectRef | None:
        """The next item's ref if it came, else None with ``wake`` called at the stream's
        next change. Raises StopIteration once the task ended and every item was taken."""
        stream = self._stream
        with self._links.lock:
            if stream.refs:
                return stream.refs.popleft()
            if stream.ended:
                raise StopIteration
            stream.waiters.append(wake)
            return None

    def _next(self, deadline: float | None) -> ObjectRef:
        while True:
            flag = Flag()
            ref = self._take(flag.set)
            if ref is not None:
                return ref
            try:
                self._links.block(flag, deadline, [self._next_id()])
            except GetTimeoutError:
                raise GetTimeoutError(f"generator task {self._task_id.hex()} yielded no item "
                                      f"within the timeout; it may still be running") from None

    def __aiter__(self) -> ObjectRefGenerator:
        return self

    async def __anext__(self) -> ObjectRef:
        while True:
            arrived: concurrent.futures.Future[None] = concurrent.futures.Future()
            try:
                ref = self._take(_setter(arrived))
            except StopIteration:  # (raised in a coroutine, it would be a RuntimeError)
                raise StopAsyncIteration from None
            if ref is not None:
                return ref
            await asyncio.wrap_future(arrived)

    def _next_id(self) -> ObjectID:
        return object_id_for(self._task_id, self._stream.received + 2)

    def completed(self) -> ObjectRef:
        """A ref set when the task has ended: its value is None, or the task's error."""
        return self._completed

    def is_finished(self) -> bool:
        """Whether the task has ended and every item was taken."""
        with self._links.lock:
            return self._stream.ended and not self._stream.refs

    def task_id(self) -> TaskID:
        return self._task_id

    def __del__(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.abandoned = True  # items still to come are freed as they arrive
            stream.refs.clear()

    def __reduce__(self) -> Any:
        raise TypeError("an ObjectRefGenerator cannot be passed to another task or stored; "
                        "pass the refs it yields instead")

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._task_id.hex()})"


def _setter(future: concurrent.futures.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        if not future.done():
            future.set_result(None)
    return wake
