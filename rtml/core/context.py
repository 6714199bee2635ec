"""The per-task runtime context: the task (or actor call) running, its job, this actor.

The process's runtime itself is :mod:`rtml.core.current`'s."""

from __future__ import annotations

import contextvars

from rtml.ids import UNKNOWN_JOB, JobID, TaskID
from rtml.rpc import messages as m

_task: contextvars.ContextVar[m.TaskSpec | None] = contextvars.ContextVar("rtml_task",
                                                                         default=None)
"""The spec of the task (or actor call) running: per thread and per asyncio task, so
concurrent actor calls each see their own."""


set_current_task = _task.set
"""Set the spec of the task (or actor call) running in this thread or asyncio task (a C
call: it runs twice per task)."""

current_spec = _task.get
"""The spec of the task (or actor call) running in this thread or asyncio task, if any."""


def captured_group() -> str:
    """The placement group (hex) that the running task, or this actor, puts the tasks and
    actors it makes in (``placement_group_capture_child_tasks``); "" if none."""
    spec = _task.get()
    if spec is not None and spec.capture_group:
        return spec.capture_group
    actor = _actor
    return actor.spec.capture_group if actor is not None else ""


def current_task() -> TaskID | None:
    """The id of the task (or actor call) running in this thread or asyncio task, if any."""
    spec = _task.get()
    return None if spec is None else spec.task_id

_job_id: contextvars.ContextVar[JobID] = contextvars.ContextVar("rtml_job_id",
                                                               default=UNKNOWN_JOB)
_process_job = UNKNOWN_JOB  # an actor's: its job, for every call it serves

set_task_job = _job_id.set
"""Set the job of the task running in this thread (a worker serves many jobs' tasks)."""


def set_process_job(job_id: JobID) -> None:
    global _process_job
    _process_job = job_id


def current_job() -> JobID:
    """In a worker, the job of the code running here: the running task's, else this
    actor's. A driver's is its runtime's ``job_id`` (callers look at that first: it
    saves a driver this call on every submission)."""
    return _job_id.get() or _process_job


class ActorProcess:
    """What the worker that became an actor knows of it (its runtime context's answers)."""

    def __init__(self, spec: m.ActorSpec, gpu_ids: tuple[int, ...], restarts: int) -> None:
        self.spec = spec
        self.gpu_ids = gpu_ids
        self.restarts = restarts  # how many times it was started again before this one


_actor: ActorProcess | None = None
_cancelled: set[TaskID] = set()
"""Tasks cancelled while queued or running here (the worker's executor owns the set)."""


def set_actor(actor: ActorProcess) -> None:
    global _actor
    _actor = actor


def current_actor() -> ActorProcess | None:
    return _actor


def set_cancelled(cancelled: set[TaskID]) -> None:
    """Give ``is_cancelled`` the executor's set of cancelled tasks."""
    global _cancelled
    _cancelled = cancelled


def is_cancelled(task_id: TaskID) -> bool:
    return task_id in _cancelled
