"""The node's object store as a pure state machine: events in, commands out.

No file or socket is touched here. The node manager's asyncio shell calls a
method for each event it sees and executes the returned commands in order::

    client / owner / daemon events            commands for the shell
    ------------------------------            ----------------------
    make_room, reserve          --+       +-> Spill(id, size)      copy shm -> disk, unlink shm
    seal, add_holds, release_*  --+
    wait, cancel_waiter           |       +-> Restore(id, size)    copy disk -> shm, then restored()
    spilled, restored, lost       +-> StoreCore -> Delete(id, spilled)  unlink the file
    collect (once per loop turn) -+       +-> NotifyReady(id, waiters)
                                          +-> NotifyLost(id, waiters, reason)

Lifecycle of one object::

    (placeholder) --seal--> SEALED --Spill--> SPILLED --wait/Restore--> RESTORING
                               ^                                            |
                               +---------------- restored() ----------------+
    any sealed state --last holder released, then collect()--> Delete

Holders are opaque ``bytes``: a client id, or the id of a container object or
task whose value holds nested references. Deleting an object releases
everything it held (the cascade). Releases only mark candidates; ``collect()``
deletes them, so a hold that arrives in the same loop turn as a release wins.

Accounting: ``used`` counts bytes in shared memory (SEALED, plus RESTORING
objects, whose room is reserved when ``Restore`` is issued, plus the room reserved
for objects being created). A ``Spill`` command lowers ``used`` at once: the shell
performs it before the next event, and gives the bytes back (``spill_failed``) if
it could not, so the object stays where it is.

Creating an object (a ``put``, a task's large return) asks for its room first:
``make_room`` spills LRU objects, then ``reserve`` grants the room if it fits (the
seal then counts nothing more), so the store's capacity holds when objects are
made; a reservation whose creator leaves is given back.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from rtml.ids import NO_OBJECT, ClientID, ObjectID

__all__ = [
    "RESTORING",
    "SEALED",
    "SPILLED",
    "Command",
    "Delete",
    "NotifyLost",
    "NotifyReady",
    "Restore",
    "Spill",
    "StoreCore",
]

RELEASED_EARLY_KEPT = 65_536
"""Releases remembered that came before their object's seal (oldest forgotten first)."""

SEALED = "SEALED"
SPILLED = "SPILLED"
RESTORING = "RESTORING"


@dataclass(frozen=True, slots=True)
class Spill:
    """Copy the object's segment to the spill directory, then unlink the segment."""

    object_id: ObjectID
    size: int


@dataclass(frozen=True, slots=True)
class Restore:
    """Copy the object back from the spill directory into shm; then call ``restored``."""

    object_id: ObjectID
    size: int


@dataclass(frozen=True, slots=True)
class Delete:
    """Unlink the object's file: the spill file if ``spilled``, else the shm segment.

    A file that is already gone counts as deleted.
    """

    object_id: ObjectID
    spilled: bool


@dataclass(frozen=True, slots=True)
class NotifyReady:
    """Tell each waiter that the object is in shm and can be mapped."""

    object_id: ObjectID
    waiter_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NotifyLost:
    """Tell each waiter that the object cannot be served, and why."""

    object_id: ObjectID
    waiter_ids: tuple[int, ...]
    reason: str


Command = Spill | Restore | Delete | NotifyReady | NotifyLost


@dataclass(slots=True)
class _Entry:
    """One object; ``state is None`` for a placeholder (held or awaited, not sealed)."""

    state: str | None = None
    size: int = 0
    holders: set[bytes] = field(default_factory=set)
    last_access: int = 0
    waiters: dict[int, None] = field(default_factory=dict)  # ordered set


class StoreCore:
    """Tracks the node's objects, their holders and waiters; decides spills and deletes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used = 0
        self._entries: dict[ObjectID, _Entry] = {}
        self._lru: OrderedDict[ObjectID, None] = OrderedDict()  # SEALED only, oldest first
        self._held_by: dict[bytes, set[ObjectID]] = {}  # holder -> object ids
        self._waiting: dict[int, set[ObjectID]] = {}  # waiter id -> object ids
        self._candidates: dict[ObjectID, None] = {}  # ordered set of deletion candidates
        # being created -> (bytes, creator)
        self._reserved: dict[ObjectID, tuple[int, ClientID]] = {}
        self._released_early: OrderedDict[tuple[ObjectID, bytes], None] = OrderedDict()
        """(object, holder) released before the seal naming that holder arrived: the seal
        must not hold it for them (a seal and a release come on different connections)."""
        self._tick = itertools.count(1)

    # ---- queries -------------------------------------------------------------

    def contains(self, object_id: ObjectID) -> bool:
        """Whether the object has been sealed and not deleted (in shm or on disk)."""
        entry = self._entries.get(object_id)
        return entry is not None and entry.state is not None

    def state(self, object_id: ObjectID) -> str | None:
        """``SEALED``, ``SPILLED``, ``RESTORING``, or None if unknown or not yet sealed."""
        entry = self._entries.get(object_id)
        return entry.state if entry is not None else None

    def size_of(self, object_id: ObjectID) -> int:
        """The object's size in bytes (0: not here)."""
        entry = self._entries.get(object_id)
        return entry.size if entry is not None else 0

    def waiting_on(self, object_id: ObjectID) -> bool:
        """Whether someone waits for the object to appear here."""
        entry = self._entries.get(object_id)
        return entry is not None and bool(entry.waiters)

    @property
    def free_bytes(self) -> int:
        """Room left in shared memory (0 while the store runs over its capacity)."""
        return max(0, self.capacity - self._used)

    def stats(self) -> dict[str, int]:
        """Counters for metrics and tests."""
        sealed = [e for e in self._entries.values() if e.state is not None]
        spilled = [e for e in sealed if e.state == SPILLED]
        return {
            "num_objects": len(sealed),
            "num_placeholders": len(self._entries) - len(sealed),
            "used_bytes": self._used,
            "capacity": self.capacity,
            "num_spilled": len(spilled),
            "spilled_bytes": sum(e.size for e in spilled),
            "num_waiters": sum(len(e.waiters) for e in self._entries.values()),
        }

    # ---- sealing and access --------------------------------------------------

    def seal(self, object_id: ObjectID, size: int, holder: bytes) -> list[Command]:
        """Record a sealed object held by ``holder``; wake its waiters; spill LRU if full.

        Holds added before the seal are kept. Sealing an id that is already
        sealed only adds the holder. An object bigger than the whole capacity
        is kept anyway (the store runs over capacity until it is freed). An
        empty ``holder`` holds nothing: unless others hold the object,
        :meth:`collect` frees it.
        """
        entry = self._entries.setdefault(object_id, _Entry())
        reserved = self._reserved.pop(object_id, None)
        if reserved is not None:
            self._used -= reserved[0]  # counted below as the object itself
        if holder and (object_id, holder) in self._released_early:
            del self._released_early[(object_id, holder)]
            holder = b""  # its holder let go of it already
        if holder:
            self._hold(object_id, entry, holder)
        else:
            self._candidates[object_id] = None
        if entry.state is not None:
            return []
        entry.state, entry.size = SEALED, size
        self._used += size
        self.touch(object_id)
        commands = self._wake(object_id, entry)
        commands += self._make_room(0, exclude=object_id)
        return commands

    def has_candidates(self) -> bool:
        """Whether :meth:`collect` would delete an object now (one released since)."""
        for object_id in self._candidates:
            entry = self._entries.get(object_id)
            if entry is not None and not entry.holders and entry.state in (SEALED, SPILLED):
                return True
        return False

    def make_room(self, size: int) -> list[Command]:
        """Spill least-recently-used objects until ``size`` more bytes fit (as far as
        spilling can), for an object about to be created; then :meth:`reserve`."""
        return self._make_room(size, exclude=NO_OBJECT)

    def reserve(self, object_id: ObjectID, size: int, creator: ClientID) -> bool:
        """Reserve ``size`` bytes for ``object_id``, about to be created by ``creator``:
        True if they fit now (counted as used until its seal, or :meth:`unreserve`)."""
        if object_id in self._reserved or self.contains(object_id):
            return True  # asked again (a retried task): the first reservation stands
        if self._used + size > self.capacity:
            return False
        self._reserved[object_id] = (size, creator)
        self._used += size
        return True

    def unreserve(self, creator: ClientID) -> list[ObjectID]:
        """``creator`` left: the room it reserved for objects it never sealed is free;
        returns their ids (the shell removes what it wrote of them)."""
        ids = [oid for oid, (_, c) in self._reserved.items() if c == creator]
        for object_id in ids:
            self._used -= self._reserved.pop(object_id)[0]
        return ids

    def spill_failed(self, object_id: ObjectID) -> None:
        """The shell could not carry out a ``Spill``: the object stays in shared memory
        (its bytes count again; it is spilled last from now on)."""
        entry = self._entries.get(object_id)
        if entry is not None and entry.state == SPILLED:
            entry.state = SEALED
            self._used += entry.size
            self.touch(object_id)

    def touch(self, object_id: ObjectID) -> None:
        """Mark the object as just used, so it is spilled last."""
        entry = self._entries.get(object_id)
        if entry is None or entry.state is None:
            return
        entry.last_access = next(self._tick)
        if entry.state == SEALED:
            self._lru[object_id] = None
            self._lru.move_to_end(object_id)

    def spilled(self, object_id: ObjectID) -> None:
        """The shell confirms the object now lives only on disk.

        After a ``Spill`` command this is a no-op (accounting was done when the
        command was issued); for a SEALED object it also releases its bytes.
        """
        entry = self._entries.get(object_id)
        if entry is not None and entry.state == SEALED:
            self._mark_spilled(object_id, entry)

    # ---- waiting -------------------------------------------------------------

    def wait(self, object_id: ObjectID, waiter_id: int) -> list[Command]:
        """Ask to be told when the object is in shm.

        SEALED: ready now. SPILLED: room is made and a ``Restore`` issued; the
        waiter is woken by ``restored``. Unknown or restoring: woken later.
        """
        entry = self._entries.get(object_id)
        if entry is not None and entry.state == SEALED:
            self.touch(object_id)
            return [NotifyReady(object_id, (waiter_id,))]
        if entry is None:
            entry = self._entries[object_id] = _Entry()
        entry.waiters[waiter_id] = None
        self._waiting.setdefault(waiter_id, set()).add(object_id)
        if entry.state == SPILLED:
            return self._restore(object_id, entry)
        return []

    def restored(self, object_id: ObjectID) -> list[Command]:
        """The shell finished a ``Restore``: the object is SEALED again; wake its waiters."""
        entry = self._entries.get(object_id)
        if entry is None or entry.state != RESTORING:
            return []
        entry.state = SEALED
        self.touch(object_id)
        return self._wake(object_id, entry)

    def cancel_waiter(self, waiter_id: int) -> None:
        """Forget ``waiter_id`` (its client went away or timed out)."""
        for object_id in self._waiting.pop(waiter_id, ()):
            entry = self._entries.get(object_id)
            if entry is not None:
                entry.waiters.pop(waiter_id, None)
                self._drop_if_unused_placeholder(object_id, entry)

    def lost(self, object_id: ObjectID, reason: str) -> list[Command]:
        """The shell could not read, spill or restore the object: forget it.

        Returns ``NotifyLost`` for its waiters and a ``Delete`` so that any
        remaining file is removed; what it held is released (the cascade).
        """
        entry = self._entries.get(object_id)
        if entry is None or entry.state is None:
            return []
        waiters = self._forget_waiters(object_id, entry)
        commands: list[Command] = [self._delete(object_id, entry)]
        if waiters:
            commands.append(NotifyLost(object_id, waiters, reason))
        self._release_holder_into_candidates(object_id)
        return commands

    def fail_waiters(self, object_id: ObjectID, reason: str) -> list[Command]:
        """The object cannot be obtained here (its pull failed): tell its waiters why.

        Only for an object not sealed here; its holds are kept.
        """
        entry = self._entries.get(object_id)
        if entry is None or entry.state is not None:
            return []
        waiters = self._forget_waiters(object_id, entry)
        self._drop_if_unused_placeholder(object_id, entry)
        return [NotifyLost(object_id, waiters, reason)] if waiters else []

    # ---- holds and deletion --------------------------------------------------

    def add_holds(self, object_ids: Iterable[ObjectID], holder: bytes) -> list[Command]:
        """``holder`` references each object; unsealed ones get a placeholder. Returns []."""
        for object_id in object_ids:
            entry = self._entries.setdefault(object_id, _Entry())
            self._hold(object_id, entry, holder)
            self._released_early.pop((object_id, holder), None)  # held again, seal or not
        return []

    def take_holds(self, object_id: ObjectID) -> set[bytes]:
        """The holders of an object not sealed here, which stop holding it here: its primary
        copy turned out to live on another node, where they hold it now. Its waiters stay."""
        entry = self._entries.get(object_id)
        if entry is None or entry.state is not None:
            return set()
        holders = set(entry.holders)
        for holder in holders:
            self._unhold(object_id, holder)
        return holders

    def release_holds(self, object_ids: Iterable[ObjectID], holder: bytes) -> list[Command]:
        """``holder`` drops each object. A hold on an object not sealed here yet is taken as
        released early: a later seal naming that holder does not hold it. Other unknown
        holds are ignored. Returns [] (see collect)."""
        for object_id in object_ids:
            self._unhold(object_id, holder)
        return []

    def release_holder(self, holder: bytes) -> list[Command]:
        """Drop every hold of ``holder`` (a client that left, a freed container). Returns []."""
        self._release_holder_into_candidates(holder)
        return []

    def collect(self) -> list[Command]:
        """Delete sealed objects that still have no holder, cascading into what they held.

        A RESTORING object stays a candidate until ``restored``.
        """
        commands: list[Command] = []
        deferred: list[ObjectID] = []
        while self._candidates:
            object_id = next(iter(self._candidates))
            del self._candidates[object_id]
            entry = self._entries.get(object_id)
            if entry is None or entry.holders or entry.state is None:
                continue
            if entry.state == RESTORING:
                deferred.append(object_id)
                continue
            commands.append(self._delete(object_id, entry))
            self._release_holder_into_candidates(object_id)
        self._candidates.update(dict.fromkeys(deferred))
        return commands

    # ---- internals -----------------------------------------------------------

    def _hold(self, object_id: ObjectID, entry: _Entry, holder: bytes) -> None:
        entry.holders.add(holder)
        self._held_by.setdefault(holder, set()).add(object_id)

    def _unhold(self, object_id: ObjectID, holder: bytes) -> None:
        entry = self._entries.get(object_id)
        if entry is None or holder not in entry.holders:
            if entry is None or entry.state is None:  # the seal naming it may be on its way
                self._released_early[(object_id, holder)] = None
                if len(self._released_early) > RELEASED_EARLY_KEPT:
                    self._released_early.popitem(last=False)
            return
        entry.holders.discard(holder)
        held = self._held_by.get(holder)
        if held is not None:
            held.discard(object_id)
            if not held:
                del self._held_by[holder]
        if not entry.holders:
            if entry.state is None:
                self._drop_if_unused_placeholder(object_id, entry)
            else:
                self._candidates[object_id] = None

    def _release_holder_into_candidates(self, holder: bytes) -> None:
        for object_id in list(self._held_by.get(holder, ())):
            self._unhold(object_id, holder)

    def _drop_if_unused_placeholder(self, object_id: ObjectID, entry: _Entry) -> None:
        if entry.state is None and not entry.holders and not entry.waiters:
            del self._entries[object_id]

    def _delete(self, object_id: ObjectID, entry: _Entry) -> Delete:
        """Remove the entry and return the command that unlinks its file."""
        del self._entries[object_id]
        self._candidates.pop(object_id, None)
        self._lru.pop(object_id, None)
        for holder in entry.holders:  # only ``lost`` deletes a held object
            self._held_by[holder].discard(object_id)
            if not self._held_by[holder]:
                del self._held_by[holder]
        if entry.state in (SEALED, RESTORING):
            self._used -= entry.size
        self._forget_waiters(object_id, entry)
        return Delete(object_id, spilled=entry.state in (SPILLED, RESTORING))

    def _forget_waiters(self, object_id: ObjectID, entry: _Entry) -> tuple[int, ...]:
        waiters = tuple(entry.waiters)
        entry.waiters.clear()
        for waiter_id in waiters:
            objects = self._waiting.get(waiter_id)
            if objects is not None:
                objects.discard(object_id)
                if not objects:
                    del self._waiting[waiter_id]
        return waiters

    def _wake(self, object_id: ObjectID, entry: _Entry) -> list[Command]:
        waiters = self._forget_waiters(object_id, entry)
        return [NotifyReady(object_id, waiters)] if waiters else []

    def _restore(self, object_id: ObjectID, entry: _Entry) -> list[Command]:
        commands = self._make_room(entry.size, exclude=object_id)
        entry.state = RESTORING
        self._used += entry.size
        commands.append(Restore(object_id, entry.size))
        return commands

    def _make_room(self, incoming: int, exclude: ObjectID) -> list[Command]:
        """Spill least-recently-used SEALED objects until ``incoming`` more bytes fit."""
        commands: list[Command] = []
        victims = iter(list(self._lru))
        while self._used + incoming > self.capacity:
            victim = next(victims, None)
            if victim is None:
                break  # nothing left to spill: run over capacity
            if victim == exclude:
                continue
            entry = self._entries[victim]
            self._mark_spilled(victim, entry)
            commands.append(Spill(victim, entry.size))
        return commands

    def _mark_spilled(self, object_id: ObjectID, entry: _Entry) -> None:
        entry.state = SPILLED
        self._used -= entry.size
        self._lru.pop(object_id, None)
