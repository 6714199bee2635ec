"""The owner's memory: small values it owns, and callbacks waiting for values.

An entry is an inline :class:`Payload` or ``IN_STORE`` (the value lives in the
node's shared-memory store). Guarded by the runtime's lock; callbacks returned
by :meth:`put` are run by the caller after releasing it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rtml.ids import NodeID, ObjectID
from rtml.rpc.messages import Payload


class _InStore:
    def __repr__(self) -> str:
        return "IN_STORE"


IN_STORE = _InStore()
Entry = Payload | _InStore
Callback = Callable[[ObjectID], Any]


class StoredError:
    """Wraps an exception stored as an object's value, so ``get`` raises it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[type[StoredError], tuple[BaseException]]:
        return StoredError, (self.error,)  # compiled, the default would call __init__()


class MemoryStore:
    def __init__(self) -> None:
        self.entries: dict[ObjectID, Entry] = {}
        self.promoted: set[ObjectID] = set()
        self.has_contained: dict[ObjectID, NodeID] = {}
        """Inline values holding refs -> the node whose manager holds those refs for them
        (``NO_NODE``: this process's own): released there when the value is freed."""
        self._waiters: dict[ObjectID, list[Callback]] = {}

    def put(self, entries: list[tuple[ObjectID, Entry]]) -> list[tuple[Callback, ObjectID]]:
        """Store values; return the callbacks to run (outside the lock), each with the id
        of the object it waited for."""
        stored = self.entries
        waiting = self._waiters
        callbacks: list[tuple[Callback, ObjectID]] = []
        for object_id, entry in entries:
            stored[object_id] = entry
            if waiting:
                waiters = waiting.pop(object_id, None)
                if waiters:
                    callbacks += [(callback, object_id) for callback in waiters]
        return callbacks

    def get(self, object_id: ObjectID) -> Entry | None:
        return self.entries.get(object_id)

    def add_waiter(self, object_id: ObjectID, callback: Callback) -> None:
        self._waiters.setdefault(object_id, []).append(callback)

    def remove_waiter(self, object_id: ObjectID, callback: Callback) -> None:
        waiters = self._waiters.get(object_id)
        if waiters and callback in waiters:
            waiters.remove(callback)
            if not waiters:
                del self._waiters[object_id]

    def pop(self, object_id: ObjectID) -> Entry | None:
        self.promoted.discard(object_id)
        return self.entries.pop(object_id, None)
