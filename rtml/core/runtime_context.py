"""``rtml.get_runtime_context()``: where the calling code runs, read from the process's
runtime and the task it is running (``rtml.core.context``), as Ray's RuntimeContext.

    driver:  node, job, worker; no task, no actor
    task:    its spec (id, name, function, resources, GPUs), set by the executor per call
    actor:   its spec and restarts (set when the worker became it), and each call's spec
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rtml.core import context
from rtml.core.actors import ActorHandle, handle_of
from rtml.ids import JobID, NodeID
from rtml.scheduler.bundles import BUNDLE
from rtml.scheduler.resources import DEFAULT_SHAPE

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime


class RuntimeContext:
    """What ``rtml.get_runtime_context()`` returns."""

    def __init__(self, runtime: ClientRuntime) -> None:
        self._rt = runtime

    def get_node_id(self) -> str:
        return self._rt.node_id.hex()

    @property
    def node_id(self) -> NodeID:
        return NodeID(self._rt.node_id)

    def get_job_id(self) -> str:
        return self.job_id.hex()

    @property
    def job_id(self) -> JobID:
        return JobID(context.current_job() or self._rt.job_id)

    def get_task_id(self) -> str | None:
        task_id = context.current_task()
        return task_id.hex() if task_id else None

    def get_actor_id(self) -> str | None:
        actor = context.current_actor()
        return actor.spec.actor_id.hex() if actor else None

    def get_worker_id(self) -> str:
        return self._rt.client_id.hex()

    @property
    def namespace(self) -> str:
        return self._rt.config.namespace

    def get_task_name(self) -> str | None:
        """The running task's name (its ``name`` option, else its function's); None in a
        driver."""
        spec = context.current_spec()
        return spec.name if spec else None

    def get_task_function_name(self) -> str | None:
        """The running task's function as ``module.qualname`` (an actor call's method as
        ``module.Class.method``); None in a driver."""
        spec = context.current_spec()
        if spec is None:
            return None
        actor = context.current_actor()
        if spec.actor_id and actor is not None:
            cls = self._rt.functions.get(actor.spec.class_id)
            module = getattr(cls, "__module__", "")
            return f"{module}.{actor.spec.class_name}.{spec.method}"
        function = self._rt.functions.get(spec.function_id)
        return (f"{getattr(function, '__module__', '')}."
                f"{getattr(function, '__qualname__', spec.name)}")

    def get_assigned_resources(self) -> dict[str, float]:
        """What the running task (or this actor, for its life) holds: ``{"CPU": 1.0}``
        for a task given no resource options; ``{}`` in a driver."""
        actor = context.current_actor()
        if actor is not None:
            return base_resources(actor.spec.hold_shape)
        spec = context.current_spec()
        if spec is None:
            return {}
        return base_resources(spec.resources if spec.resources is not None else DEFAULT_SHAPE)

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        return {"GPU": [str(i) for i in gpu_ids()]}

    @property
    def current_actor(self) -> ActorHandle:
        """A handle to the actor this code runs in. Raises RuntimeError elsewhere."""
        actor = context.current_actor()
        if actor is None:
            raise RuntimeError("current_actor is only available inside an actor's methods")
        return handle_of(actor.spec, self._rt.functions[actor.spec.class_id])  # loaded: ours

    @property
    def was_current_actor_reconstructed(self) -> bool:
        """Whether this actor was started again after its process died (a restart)."""
        actor = context.current_actor()
        return actor is not None and actor.restarts > 0

    def is_canceled(self) -> bool:
        """Whether the running task (or actor call) was cancelled. Raises RuntimeError
        outside a task."""
        task_id = context.current_task()
        if task_id is None:
            raise RuntimeError("is_canceled() is only available inside a task or actor call")
        return context.is_cancelled(task_id)

    def get(self) -> dict[str, Any]:
        return {"node_id": self.get_node_id(), "job_id": self.get_job_id(),
                "task_id": self.get_task_id(), "actor_id": self.get_actor_id()}


def gpu_ids() -> list[int]:
    """The GPUs of the running task (its lease's), else of this actor; [] in a driver."""
    spec = context.current_spec()
    if spec is not None and spec.gpu_ids:
        return list(spec.gpu_ids)
    actor = context.current_actor()
    return list(actor.gpu_ids) if actor is not None else []


def base_resources(shape: dict[str, float]) -> dict[str, float]:
    """``shape`` with a placement group's names read as the resources they stand for
    (``CPU_group_0_<pg>``: CPU), as a task sees them."""
    named: dict[str, float] = {}
    for name, amount in shape.items():
        base = name.split("_group_", 1)[0]
        if amount and base != BUNDLE:
            named[base] = named.get(base, 0.0) + amount
    return named
