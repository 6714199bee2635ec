"""Typed identifiers. Each is ``bytes`` at run time and a distinct type to the checker.

Task ids are a per-process random prefix plus a counter, so minting one costs no
syscall; an object id is the id of the task that made it plus a 4-byte index
(0 for ``put``, 1..n for a task's returns), so a task's outputs are derivable.
"""

from __future__ import annotations

import itertools
import os
import struct
from typing import NewType

TaskID = NewType("TaskID", bytes)
ObjectID = NewType("ObjectID", bytes)
NodeID = NewType("NodeID", bytes)
WorkerID = NewType("WorkerID", bytes)
ActorID = NewType("ActorID", bytes)
JobID = NewType("JobID", bytes)

TASK_ID_SIZE = 16
OBJECT_ID_SIZE = TASK_ID_SIZE + 4

_prefix = os.urandom(8)
_counter = itertools.count(1)
_pid = os.getpid()
_INDEX = struct.Struct(">I")
_FIRST = _INDEX.pack(1)


def _reseed_after_fork() -> None:
    global _prefix, _counter, _pid
    _prefix, _counter, _pid = os.urandom(8), itertools.count(1), os.getpid()


os.register_at_fork(after_in_child=_reseed_after_fork)


def new_task_id() -> TaskID:
    """A task id unique across the cluster (random 8-byte prefix + counter)."""
    return TaskID(_prefix + next(_counter).to_bytes(8, "big"))


def object_id_for(task_id: TaskID, index: int) -> ObjectID:
    """The id of output ``index`` of ``task_id`` (0 is reserved for ``put``)."""
    return ObjectID(task_id + _INDEX.pack(index))


def first_return_id(task_id: bytes) -> ObjectID:
    """``object_id_for(task_id, 1)``, with the index packed once: a lone return's id."""
    return ObjectID(task_id + _FIRST)


def task_of(object_id: bytes) -> TaskID:
    """The id of the task that created ``object_id``."""
    return TaskID(object_id[:TASK_ID_SIZE])


def random_id(size: int = 16) -> bytes:
    """A random id for nodes, workers, actors and leases."""
    return os.urandom(size)


def new_job_id() -> JobID:
    return JobID(os.urandom(4))
