"""Typed identifiers. Each is ``bytes`` at run time and a distinct type to the checker.

A task id is its job's id (4 bytes), a per-process random prefix (6) and a counter
(6), so minting one costs no syscall and an id names its job (``ObjectRef.job_id()``,
as Ray's); an object id is the id of the task that made it plus a 4-byte index (0 for
``put``, 1..n for a task's returns), so a task's outputs are derivable.
"""

from __future__ import annotations

import itertools
import os
import struct
from typing import Final, NewType

TaskID = NewType("TaskID", bytes)
ObjectID = NewType("ObjectID", bytes)
NodeID = NewType("NodeID", bytes)
ClientID = NewType("ClientID", bytes)
"""A process connected to a node manager: a driver, a worker, the CLI. Objects and
tasks name their owner by it."""
WorkerID = NewType("WorkerID", ClientID)
"""A worker is a client whose client id is its worker id (a ``WorkerID`` is a
``ClientID``)."""
ActorID = NewType("ActorID", bytes)
JobID = NewType("JobID", bytes)
PlacementGroupID = NewType("PlacementGroupID", bytes)

TASK_ID_SIZE = 16
OBJECT_ID_SIZE = TASK_ID_SIZE + 4
JOB_ID_SIZE = 4
NO_JOB: Final = JobID(bytes(JOB_ID_SIZE))
"""The job part of the ids made outside any job (none is known)."""
NO_NODE: Final = NodeID(b"")
"""A message's node field when no node is named (the receiver's, or none)."""
NO_OBJECT: Final = ObjectID(b"")
NO_CLIENT: Final = ClientID(b"")
NO_ACTOR: Final = ActorID(b"")
NO_TASK: Final = TaskID(b"")
NO_GROUP: Final = PlacementGroupID(b"")
UNKNOWN_JOB: Final = JobID(b"")
"""A message's job field when the sender names none (not ``NO_JOB``, a job part)."""

_prefix = os.urandom(6)
_counter = itertools.count(1)
_pid = os.getpid()
_INDEX = struct.Struct(">I")
_FIRST = _INDEX.pack(1)


def _reseed_after_fork() -> None:
    global _prefix, _counter, _pid
    _prefix, _counter, _pid = os.urandom(6), itertools.count(1), os.getpid()


os.register_at_fork(after_in_child=_reseed_after_fork)


def new_task_id(job_id: JobID) -> TaskID:
    """A task id of ``job_id``, unique across the cluster (job, random 6-byte prefix of
    this process, counter). Over 1,000 processes of one job, two prefixes collide with
    a chance of 2e-9."""
    if len(job_id) != JOB_ID_SIZE:
        job_id = NO_JOB
    return TaskID(job_id + _prefix + next(_counter).to_bytes(6, "big"))


def object_id_for(task_id: TaskID, index: int) -> ObjectID:
    """The id of output ``index`` of ``task_id`` (0 is reserved for ``put``)."""
    return ObjectID(task_id + _INDEX.pack(index))


def first_return_id(task_id: TaskID) -> ObjectID:
    """``object_id_for(task_id, 1)``, with the index packed once: a lone return's id."""
    return ObjectID(task_id + _FIRST)


def task_of(object_id: ObjectID) -> TaskID:
    """The id of the task that created ``object_id``."""
    return TaskID(object_id[:TASK_ID_SIZE])


def job_of(task_or_object_id: bytes) -> JobID:
    """The job whose task made ``task_or_object_id`` (``NO_JOB`` if none was known)."""
    return JobID(task_or_object_id[:JOB_ID_SIZE])


def random_id(size: int = 16) -> bytes:
    """Random bytes: the body of the ids below."""
    return os.urandom(size)


def new_client_id() -> ClientID:
    return ClientID(random_id())


def new_worker_id() -> WorkerID:
    return WorkerID(new_client_id())


def new_actor_id() -> ActorID:
    return ActorID(random_id())


def new_placement_group_id() -> PlacementGroupID:
    return PlacementGroupID(random_id())


def new_node_id() -> NodeID:
    """This process's pid (4 bytes, to tell nodes apart in logs) and 12 random bytes."""
    return NodeID(os.getpid().to_bytes(4, "big") + random_id(12))


def new_job_id() -> JobID:
    job_id = os.urandom(JOB_ID_SIZE)
    return JobID(job_id) if job_id != NO_JOB else new_job_id()
