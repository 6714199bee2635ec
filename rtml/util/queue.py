"""A FIFO queue shared by tasks and actors, as Ray's ``ray.util.queue``.

    Queue(maxsize) --creates--> _QueueActor: an asyncio.Queue in its own (async) worker
    q.put(x) / q.get()  in the driver, a task or an actor (a Queue pickles as its handle)
        --> actor call put / get: served at once, or awaits room / an item up to timeout
        <-- None / the item; or Full / Empty, raised there and re-raised here as such
    q.shutdown() --> kill the actor; every copy of the Queue then raises ActorDiedError

A blocked ``get`` is a coroutine parked on the actor's event loop, not a caller
polling, so a ``put`` from anywhere wakes it at once. The actor serves up to
``max_concurrency`` (1000) calls at a time: that many callers may block on it before a
put has to wait for a turn. Items travel as actor-call arguments, so an ``ObjectRef``
put directly is stored as its value (as in Ray); wrap it in a list to keep the ref.
"""

from __future__ import annotations

import asyncio
import queue as _stdlib_queue
from collections.abc import Iterable
from typing import Any

from rtml import api
from rtml.core.actors import ActorHandle
from rtml.core.object_ref import ObjectRef
from rtml.exceptions import ActorDiedError, TaskError

MAX_CONCURRENCY = 1000
"""Calls the queue's actor serves at once: blocked gets and puts each take one."""


class Empty(_stdlib_queue.Empty):
    """``get`` found no item: at once (``block=False``, ``get_nowait``), within
    ``timeout``, or fewer than ``num_items`` (``get_nowait_batch``)."""


class Full(_stdlib_queue.Full):
    """``put`` found no room: at once (``block=False``, ``put_nowait``), within
    ``timeout``, or not for every item (``put_nowait_batch``, which then puts none)."""


class _QueueActor:
    """The queue's state, in its own worker: an ``asyncio.Queue`` of ``maxsize``."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    def ping(self) -> None:
        """Answered once the calls sent before it are served (``shutdown``'s grace)."""

    def qsize(self) -> int:
        return self.queue.qsize()

    def empty(self) -> bool:
        return self.queue.empty()

    def full(self) -> bool:
        return self.queue.full()

    async def put(self, item: Any, timeout: float | None = None) -> None:
        # Room now is taken now: asyncio.wait_for(..., 0) would time out even so.
        if not self.queue.full():
            self.queue.put_nowait(item)
            return
        try:
            await asyncio.wait_for(self.queue.put(item), timeout)
        except TimeoutError:
            raise Full(f"no room in the queue (maxsize {self.maxsize}) within {timeout} s; "
                       f"take items out with get(), or wait longer") from None

    async def get(self, timeout: float | None = None) -> Any:
        if not self.queue.empty():
            return self.queue.get_nowait()
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            raise Empty(f"no item came into the queue within {timeout} s; put() one, "
                        f"or wait longer") from None

    def put_nowait(self, item: Any) -> None:
        if self.queue.full():
            raise Full(f"the queue is full (maxsize {self.maxsize}); take items out with "
                       f"get(), or put(item) with block=True to wait for room")
        self.queue.put_nowait(item)

    def put_nowait_batch(self, items: list[Any]) -> None:
        if self.maxsize > 0 and len(items) + self.qsize() > self.maxsize:
            raise Full(f"Cannot add {len(items)} items to queue of size {self.qsize()} and "
                       f"maxsize {self.maxsize}; none was added: put fewer, or take items "
                       f"out first")
        for item in items:
            self.queue.put_nowait(item)

    def get_nowait(self) -> Any:
        if self.queue.empty():
            raise Empty("the queue is empty; put() an item first, or get() with "
                        "block=True to wait for one")
        return self.queue.get_nowait()

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        if num_items > self.qsize():
            raise Empty(f"Cannot get {num_items} items from queue of size {self.qsize()}; "
                        f"none was taken: ask for fewer (qsize()), or wait for more")
        return [self.queue.get_nowait() for _ in range(num_items)]


_QUEUE_ACTOR = api.remote(_QueueActor)


class Queue:
    """A first-in first-out queue that any task, actor or driver holding it may use.

    ``maxsize <= 0``: unbounded. ``actor_options``: ``.options(...)`` for the queue's
    actor (say ``num_cpus``, ``name``, ``lifetime``). Picklable: pass it to tasks and
    actors; every copy is the same queue.
    """

    def __init__(self, maxsize: int = 0, actor_options: dict[str, Any] | None = None) -> None:
        self.maxsize = maxsize
        options = {"max_concurrency": MAX_CONCURRENCY, **(actor_options or {})}
        self.actor: ActorHandle | None = _QUEUE_ACTOR.options(**options).remote(maxsize)

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        """The number of items in the queue now."""
        return int(api.get(self._actor().qsize.remote()))

    def qsize(self) -> int:
        """The number of items in the queue now (as :meth:`size`)."""
        return self.size()

    def empty(self) -> bool:
        return bool(api.get(self._actor().empty.remote()))

    def full(self) -> bool:
        return bool(api.get(self._actor().full.remote()))

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item`` at the end; with ``block``, wait up to ``timeout`` s (None: for
        ever) for room. Raises Full if there is none; ValueError if ``timeout < 0``."""
        _result(self._put_call(item, block, timeout))

    async def put_async(self, item: Any, block: bool = True,
                        timeout: float | None = None) -> None:
        """:meth:`put`, awaited instead of blocking the caller's thread."""
        await _result_async(self._put_call(item, block, timeout))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Take the first item; with ``block``, wait up to ``timeout`` s (None: for
        ever) for one. Raises Empty if there is none; ValueError if ``timeout < 0``."""
        return _result(self._get_call(block, timeout))

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """:meth:`get`, awaited instead of blocking the caller's thread."""
        return await _result_async(self._get_call(block, timeout))

    def put_nowait(self, item: Any) -> None:
        """``put(item, block=False)``: raises Full at once if there is no room."""
        self.put(item, block=False)

    def get_nowait(self) -> Any:
        """``get(block=False)``: raises Empty at once if there is no item."""
        return self.get(block=False)

    def put_nowait_batch(self, items: Iterable[Any]) -> None:
        """Add every item of ``items``, in order, or none: raises Full if not all fit."""
        if not isinstance(items, Iterable):
            raise TypeError(f"put_nowait_batch() takes an iterable of items, got "
                            f"{type(items).__name__}; for one item use put_nowait()")
        _result(self._actor().put_nowait_batch.remote(list(items)))

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        """Take the first ``num_items`` items, or none: raises Empty if there are fewer."""
        if not isinstance(num_items, int) or isinstance(num_items, bool):
            raise TypeError(f"get_nowait_batch() takes the number of items as an int, got "
                            f"{num_items!r}")
        if num_items < 0:
            raise ValueError(f"'num_items' must be nonnegative, got {num_items}")
        return list(_result(self._actor().get_nowait_batch.remote(num_items)))

    def shutdown(self, force: bool = False, grace_period_s: float = 5) -> None:
        """Kill the queue's actor; its items are lost and every copy of this Queue then
        raises ActorDiedError. Unless ``force``, first let the actor serve the calls this
        process sent it, for up to ``grace_period_s`` seconds."""
        actor, self.actor = self.actor, None
        if actor is None:
            return
        if not force:
            api.wait([actor.ping.remote()], timeout=grace_period_s)
        api.kill(actor, no_restart=True)

    def _actor(self) -> ActorHandle:
        if self.actor is None:
            raise ActorDiedError("this Queue was shut down (Queue.shutdown()), and its items "
                                 "with it; make a new Queue")
        return self.actor

    def _put_call(self, item: Any, block: bool, timeout: float | None) -> ObjectRef:
        if not block:
            return self._actor().put_nowait.remote(item)
        _check_timeout(timeout)
        return self._actor().put.remote(item, timeout)

    def _get_call(self, block: bool, timeout: float | None) -> ObjectRef:
        if not block:
            return self._actor().get_nowait.remote()
        _check_timeout(timeout)
        return self._actor().get.remote(timeout)


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError(f"'timeout' must be a non-negative number, got {timeout!r}; "
                         f"None waits for ever")


def _result(ref: ObjectRef) -> Any:
    """The value of a queue call; its Empty or Full raised as a plain one, as the caller
    of a local queue gets it (not wrapped with the actor's traceback)."""
    try:
        return api.get(ref)
    except (Empty, Full) as err:
        raise _unwrapped(err) from None


async def _result_async(ref: ObjectRef) -> Any:
    try:
        return await ref
    except (Empty, Full) as err:
        raise _unwrapped(err) from None


def _unwrapped(err: Empty | Full) -> Empty | Full:
    cause = err.cause if isinstance(err, TaskError) else err
    if not isinstance(cause, (Empty, Full)):  # cannot be: the dual class names its cause
        return err
    return type(cause)(*cause.args)
