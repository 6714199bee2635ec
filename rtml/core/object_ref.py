"""``ObjectRef``: a future naming an object, counted so the object can be freed.

Every live ``ObjectRef`` instance counts one reference in its process's
runtime; when the count reaches zero the runtime frees the value (or releases
its hold on the shared-memory copy). Pickling a ref records it as contained in
the value being pickled; unpickling one in another process registers that
process as a borrower.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import types
from collections.abc import Generator
from typing import Any

from rtml.core import serialization
from rtml.ids import (
    NO_CLIENT,
    NO_NODE,
    ClientID,
    JobID,
    NodeID,
    ObjectID,
    TaskID,
    job_of,
    task_of,
)

_counter: Any = None
"""The runtime's reference counter (set by the runtime; None before ``init``)."""
_futures: Any = None
"""The runtime's maker of a ref's future (``ClientRuntime.future``)."""


def set_counter(counter: Any, futures: Any = None) -> None:
    """Count refs with ``counter`` and make their futures with ``futures`` (None: the
    runtime is gone)."""
    global _counter, _futures
    _counter, _futures = counter, futures


class ObjectRef:
    """A reference to a value that exists now or will exist when its task ends."""

    __slots__ = ("id", "owner", "_counted")  # no weak references: compiled, it has none

    def __init__(self, object_id: ObjectID, owner: ClientID = NO_CLIENT) -> None:
        self.id = object_id
        self.owner = owner
        counter = _counter
        self._counted = counter
        if counter is not None:
            counter.incref(object_id, owner)

    def __del__(self) -> None:
        # Unset if __init__ failed (bad arguments): compiled, reading it would crash.
        counter = getattr(self, "_counted", None)
        if counter is not None and counter is _counter:
            counter.decref(self.id, self.owner)

    def hex(self) -> str:
        return self.id.hex()

    def binary(self) -> ObjectID:
        """The object's id; ``ObjectRef(ref.binary())`` names the same object."""
        return self.id

    def task_id(self) -> TaskID:
        """The id of the task that made the object (a ``put``'s: its own)."""
        return task_of(self.id)

    def job_id(self) -> JobID:
        """The job whose task (or ``put``) made the object."""
        return job_of(self.id)

    def as_future(self) -> asyncio.Future[Any]:
        """An ``asyncio.Future`` of the value, on the running event loop."""
        return asyncio.wrap_future(self.future())

    @classmethod
    def __class_getitem__(cls, item: Any) -> Any:
        """``ObjectRef[T]`` in annotations, as Ray's: the value's type, for readers."""
        return types.GenericAlias(cls, item)

    def __repr__(self) -> str:
        return f"ObjectRef({self.id.hex()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __reduce__(self) -> tuple[Any, ...]:
        serialization.note_contained(self)
        if _counter is None:
            return (borrow, (self.id, self.owner))
        _counter.escaped(self)
        return (borrow, (self.id, self.owner, _counter.location_of(self.id)))

    def future(self) -> concurrent.futures.Future[Any]:
        """A ``concurrent.futures.Future`` resolved with this object's value."""
        return _futures(self)

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self.future()).__await__()


def borrow(object_id: ObjectID, owner: ClientID, node_id: NodeID = NO_NODE) -> ObjectRef:
    """A ref to another process's object, held here as its borrower (how a ref is
    unpickled); ``node_id``: where its primary copy lived when the ref was made."""
    ref = ObjectRef(object_id, owner)
    if _counter is not None:
        _counter.borrowed(ref, node_id)
    return ref
