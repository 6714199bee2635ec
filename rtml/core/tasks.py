"""A submitted task's record, and what the parts that run tasks report to its owner.

    calls.submit_call -> TaskRecord -> TaskOwner.submit
        -> TaskSubmitter (tasks: leased workers)    } report through TaskEvents:
        -> ActorCaller   (actor calls: the actor)   } complete_tasks, fail_task, generated

``TaskEvents`` is the owner's face to those parts (``TaskOwner`` implements it), so they
depend on it and not on the owner, and the owner on them: one direction, and under mypyc
a call through it is still a native method call (a vtable entry), not a lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rtml.exceptions import RtmlSystemError
from rtml.ids import ActorID, NodeID, ObjectID, TaskID, WorkerID
from rtml.rpc import messages as m
from rtml.rpc.reactor import Connection
from rtml.scheduler.resources import Shape


@dataclass(eq=False, slots=True)  # compared by identity (queues remove them by it)
class TaskRecord:
    spec: m.TaskSpec
    shape: Shape
    max_retries: int
    retry_exceptions: Any
    keep_alive: Sequence[Any]  # ObjectRefs the arguments need until the task ends
    return_ids: Sequence[ObjectID]
    has_contained: bool = False
    key: tuple[Any, ...] = ()  # shape_key(shape), computed once per remote function
    deps: int = 0
    cancelled: bool = False
    worker: LeasedWorker | None = None
    done: bool = False
    solo: bool = False  # pushed alone (untimed or long): nothing may queue behind it
    parent: TaskID | None = None  # the task that submitted it (None: the driver's own code)
    stream: Any = None  # a generator task's items as they come (a generators.Stream)
    dynamic: bool = False  # num_returns="dynamic": its return is its items' refs, at the end


@dataclass(eq=False)
class LeasedWorker:
    conn: Connection
    lease_id: int
    worker_id: WorkerID
    key: tuple[Any, ...]
    nm: Connection  # the node manager that granted the lease
    node_id: NodeID
    gpu_ids: tuple[int, ...] = ()
    inflight: dict[TaskID, TaskRecord] = field(default_factory=dict)
    solo: int = 0  # in-flight tasks pushed alone
    idle_since: float = 0.0
    timer_armed: bool = False
    functions_sent: set[bytes] = field(default_factory=set)  # answers to FunctionWanted
    retiring: bool = False  # it said it exits (max_calls): nothing in flight had started


class TaskEvents:
    """What happens to submitted tasks, told to their owner (``TaskOwner``)."""

    def complete_tasks(self, done: list[tuple[TaskRecord, m.TaskResult]]) -> None:
        """Tasks finished (their results, or an error their code raised)."""
        raise NotImplementedError

    def fail_task(self, record: TaskRecord, error: BaseException | None = None,
                  payload: m.Payload | None = None) -> None:
        """A task cannot end well: its returns are ``error`` (or an already-stored one)."""
        raise NotImplementedError

    def generated(self, items: list[m.GeneratorItem], node_id: NodeID) -> None:
        """Generator tasks yielded ``items`` on ``node_id``."""
        raise NotImplementedError

    def should_retry_exception(self, record: TaskRecord, msg: m.TaskResult) -> bool:
        """Whether the exception ``msg`` carries is one ``record`` retries on."""
        raise NotImplementedError

    def making(self, object_id: ObjectID) -> bool:
        """Whether ``object_id`` is a return of a task not yet settled (under the lock)."""
        raise NotImplementedError

    def forget_lineage(self, object_id: ObjectID) -> None:
        """``object_id`` was freed (under the lock)."""
        raise NotImplementedError

    def actor_ended(self, actor_id: ActorID, why: str) -> None:
        """Actor ``actor_id`` is DEAD for good (under the lock)."""
        raise NotImplementedError


def scheduling_error(reason: str, name: str) -> RtmlSystemError:
    """The error of a task that could not be scheduled (its lease failed)."""
    return RtmlSystemError(f"task {name!r} could not be scheduled: {reason}")
