"""The process's current runtime and the per-task runtime context."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime

_runtime: ClientRuntime | None = None
_auto_init: Callable[[], object] | None = None
_task_id: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("rtml_task_id",
                                                                        default=None)
"""Per thread and per asyncio task, so concurrent actor calls each see their own."""


def set_runtime(runtime: ClientRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def get_runtime() -> ClientRuntime | None:
    return _runtime


def set_auto_init(start: Callable[[], object] | None) -> None:
    """What :func:`require_runtime` calls in a driver that has not called ``init``: it
    starts or joins a cluster (``rtml.api``'s, as Ray's auto-init)."""
    global _auto_init
    _auto_init = start


def require_runtime() -> ClientRuntime:
    """The connected runtime, started by the auto-init hook on first use if need be.
    Raises RuntimeError telling the user to call init() if there is none."""
    runtime = _runtime
    if runtime is None and _auto_init is not None:
        _auto_init()
        runtime = _runtime
    if runtime is None:
        raise RuntimeError("rtml is not initialized; call rtml.init() first")
    return runtime


set_current_task = _task_id.set
"""Set the task (or actor call) running in this thread or asyncio task (a C call: it
runs twice per task)."""

current_task = _task_id.get
"""The task (or actor call) running in this thread or asyncio task, if any."""

_job_id: contextvars.ContextVar[bytes] = contextvars.ContextVar("rtml_job_id", default=b"")
_process_job = b""  # an actor's: its job, for every call it serves

set_task_job = _job_id.set
"""Set the job of the task running in this thread (a worker serves many jobs' tasks)."""


def set_process_job(job_id: bytes) -> None:
    global _process_job
    _process_job = job_id


def current_job() -> bytes:
    """In a worker, the job of the code running here: the running task's, else this
    actor's. A driver's is its runtime's ``job_id`` (callers look at that first: it
    saves a driver this call on every submission)."""
    return _job_id.get() or _process_job


_actor_id: bytes | None = None


def set_actor(actor_id: bytes | None) -> None:
    global _actor_id
    _actor_id = actor_id


class RuntimeContext:
    """What ``rtml.get_runtime_context()`` returns."""

    def __init__(self, runtime: ClientRuntime) -> None:
        self._rt = runtime

    def get_node_id(self) -> str:
        return self._rt.node_id.hex()

    def get_job_id(self) -> str:
        return (current_job() or self._rt.job_id).hex()

    def get_task_id(self) -> str | None:
        task_id = _task_id.get()
        return task_id.hex() if task_id else None

    def get_actor_id(self) -> str | None:
        return _actor_id.hex() if _actor_id else None

    def get_worker_id(self) -> str:
        return self._rt.client_id.hex()

    @property
    def namespace(self) -> str:
        return self._rt.config.namespace

    def get(self) -> dict[str, Any]:
        return {"node_id": self.get_node_id(), "job_id": self.get_job_id(),
                "task_id": self.get_task_id(), "actor_id": self.get_actor_id()}
