"""A fixed set of actors fed tasks, as Ray's ``ray.util.ActorPool``.

    submit(fn, v) --an idle actor?-- yes --> fn(actor, v) -> ref, filed as task #n
                                  \\- no --> pending (FIFO), sent when an actor comes back
    get_next()           -> task #next (submission order): wait for it, if a timeout
    get_next_unordered() -> wait for whichever task is done first
                         -> its actor back to the pool -> rtml.get(ref): value or error
    actor back to the pool -> the oldest pending submit is sent to it at once

Each actor runs at most one of the pool's tasks at a time, so a slow actor holds back
only its own task. The pool lives in the process that made it and calls the actors
through the public API alone (``fn`` returns what ``actor.method.remote(v)`` does).
A task that raised is done like any other: its actor returns to the pool, and
``get_next`` raises its error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from rtml import api
from rtml.core.actors import ActorHandle
from rtml.core.object_ref import ObjectRef

V = TypeVar("V")

Submit = Callable[[ActorHandle, V], Any]
"""``lambda actor, v: actor.method.remote(v)``: an ObjectRef, or a list of them (a
method with ``num_returns > 1``)."""

TIMED_OUT = "Timed out waiting for result"


@dataclass
class _Task:
    """One submitted call: its number in submission order, its actor, its result."""

    index: int
    actor: ActorHandle
    result: Any  # ObjectRef, or a list of them

    @property
    def ref(self) -> ObjectRef:
        """The ref that is ready when the call is done (all its returns come together)."""
        return self.result[0] if isinstance(self.result, list) else self.result


class ActorPool:
    """Run tasks on a fixed pool of actors, one task per actor at a time.

    ``ActorPool([a1, a2]).map(lambda a, v: a.double.remote(v), [1, 2, 3])`` yields
    2, 4, 6 in order.
    """

    def __init__(self, actors: Iterable[ActorHandle]) -> None:
        self._idle_actors: list[ActorHandle] = list(actors)
        self._in_flight: dict[int, _Task] = {}  # by index: insertion order is submission order
        self._pending_submits: deque[tuple[Submit[Any], Any]] = deque()
        self._next_task_index = 0
        self._next_return_index = 0

    # -- many values ---------------------------------------------------------------------

    def map(self, fn: Submit[V], values: Iterable[V]) -> Iterator[Any]:
        """Submit ``fn`` on every value now; yield the results in the order of ``values``.

        Results of earlier submits not yet fetched are dropped first, as in Ray. A
        failed task raises its error from the generator when its turn comes.
        """
        self._drop_unfetched()
        for value in values:
            self.submit(fn, value)
        return self._drain(self.get_next)

    def map_unordered(self, fn: Submit[V], values: Iterable[V]) -> Iterator[Any]:
        """As :meth:`map`, but yield each result as soon as it is ready."""
        self._drop_unfetched()
        for value in values:
            self.submit(fn, value)
        return self._drain(self.get_next_unordered)

    def _drain(self, get: Callable[[], Any]) -> Iterator[Any]:
        while self.has_next():
            yield get()

    def _drop_unfetched(self) -> None:
        """Forget every submitted task, as Ray's ``map`` does before it submits: their
        actors return to the pool (which sends the pending submits, forgotten in turn)."""
        while self._in_flight:
            index = next(iter(self._in_flight))
            self._finish(self._in_flight[index])
        self._next_return_index = self._next_task_index

    # -- one value -----------------------------------------------------------------------

    def submit(self, fn: Submit[V], value: V) -> None:
        """Call ``fn(actor, value)`` on an idle actor, or once one is free; fetch the
        result with :meth:`get_next` or :meth:`get_next_unordered`."""
        if not self._idle_actors:
            self._pending_submits.append((fn, value))
            return
        actor = self._idle_actors.pop()
        index = self._next_task_index
        self._in_flight[index] = _Task(index, actor, fn(actor, value))
        self._next_task_index += 1

    def has_next(self) -> bool:
        """Whether a submitted task's result is still to fetch."""
        return bool(self._in_flight)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order.

        Raises the task's error if it raised; ``TimeoutError`` if it is not done within
        ``timeout`` seconds (with ``ignore_if_timedout``, that task is also dropped and
        its actor returned to the pool); ``StopIteration`` if no task is left.
        """
        if not self.has_next():
            raise StopIteration("No more results to get")
        task = self._next_in_order()
        timed_out = timeout is not None and not self._ready([task.ref], timeout)
        if timed_out and not ignore_if_timedout:
            raise TimeoutError(f"{TIMED_OUT}; call get_next() again to keep waiting, or "
                               f"pass ignore_if_timedout=True to drop the task")
        return self._fetch(task, timed_out)

    def get_next_unordered(self, timeout: float | None = None,
                           ignore_if_timedout: bool = False) -> Any:
        """The result of whichever task finishes first.

        Raises as :meth:`get_next`. With ``ignore_if_timedout``, a timeout drops the
        oldest task (Ray leaves which one undefined).
        """
        if not self.has_next():
            raise StopIteration("No more results to get")
        tasks = {task.ref: task for task in self._in_flight.values()}
        ready, _ = api.wait(list(tasks), num_returns=1, timeout=timeout)
        if not ready and not ignore_if_timedout:
            raise TimeoutError(f"{TIMED_OUT}; call get_next_unordered() again to keep "
                               f"waiting, or pass ignore_if_timedout=True to drop a task")
        task = tasks[ready[0]] if ready else next(iter(self._in_flight.values()))
        return self._fetch(task, timed_out=not ready)

    def _next_in_order(self) -> _Task:
        """The oldest task not before the last one returned (Ray's rule once
        ``get_next_unordered`` has returned tasks out of order)."""
        for index, task in self._in_flight.items():
            if index >= self._next_return_index:
                return task
        raise ValueError("It is not allowed to call get_next() after get_next_unordered(): "
                         "the tasks left were submitted before the last result it returned; "
                         "fetch them with get_next_unordered()")

    @staticmethod
    def _ready(refs: list[ObjectRef], timeout: float) -> bool:
        ready, _ = api.wait(refs, num_returns=len(refs), timeout=timeout)
        return bool(ready)

    def _fetch(self, task: _Task, timed_out: bool) -> Any:
        """Return ``task``'s actor to the pool, then its result (or its error)."""
        self._next_return_index = max(self._next_return_index, task.index + 1)
        self._finish(task)
        if timed_out:
            raise TimeoutError(f"{TIMED_OUT}. The task {task.result} has been ignored.")
        return api.get(task.result)

    def _finish(self, task: _Task) -> None:
        del self._in_flight[task.index]
        self._return_actor(task.actor)

    # -- the actors ----------------------------------------------------------------------

    def has_free(self) -> bool:
        """Whether an actor is idle and no submit waits for one."""
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self) -> ActorHandle | None:
        """Take an idle actor out of the pool; None if none is free (see :meth:`has_free`)."""
        return self._idle_actors.pop() if self.has_free() else None

    def push(self, actor: ActorHandle) -> None:
        """Add ``actor`` to the pool (it takes a pending submit at once, if one waits).

        Raises ValueError if it is in the pool already, idle or busy.
        """
        busy = [task.actor for task in self._in_flight.values()]
        if actor in self._idle_actors or actor in busy:
            raise ValueError("Actor already belongs to current ActorPool; push() takes an "
                             "actor that pop_idle() removed or one new to the pool")
        self._return_actor(actor)

    def _return_actor(self, actor: ActorHandle) -> None:
        self._idle_actors.append(actor)
        if self._pending_submits:
            self.submit(*self._pending_submits.popleft())
