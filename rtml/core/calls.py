"""One call, a task or an actor method, from ``.remote()`` to its owner.

    .remote(*args) -> build_args (inline values, refs held, owned args pending)
                   -> task id, return ids, TaskSpec, TaskRecord
                   -> owner.submit(record) -> the return refs
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rtml.core import context
from rtml.core.arguments import build_args
from rtml.core.generators import ObjectRefGenerator, Stream
from rtml.core.object_ref import ObjectRef
from rtml.core.options import DYNAMIC
from rtml.core.submitter import TaskRecord
from rtml.ids import NO_ACTOR, ActorID, first_return_id, new_task_id, object_id_for
from rtml.rpc import messages as m
from rtml.scheduler.resources import Shape

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime


def submit_call(rt: ClientRuntime, *, name: str, function_id: bytes, args: tuple[Any, ...],
                kwargs: dict[str, Any], num_returns: int, shape: Shape, max_retries: int,
                retry_exceptions: Any, actor_id: ActorID = NO_ACTOR, method: str = "",
                key: tuple[Any, ...] = (), keep: Any = None,
                resources: dict[str, float] | None = None, group: str = "",
                max_calls: int = 0, capture: str = "") -> Any:
    """Submit one task or actor call; its ref (a list for several returns, None for 0).

    ``keep``: held until the call is answered (an actor's life: see ActorLives).
    ``resources``: what the task's ``get_assigned_resources()`` says, if not 1 CPU.
    ``group``: an actor call's concurrency group. ``max_calls``: a task's (0: no limit).
    ``capture``: the placement group the task's own tasks and actors run in.
    """
    built = build_args(rt, args, kwargs)
    keep_alive = built.keep_alive
    if keep is not None:
        keep_alive.append(keep)
    job_id = rt.job_id or context.current_job()
    task_id = new_task_id(job_id)
    dynamic = num_returns == DYNAMIC
    if dynamic:  # its worker streams the items; the caller gets their refs at the end
        num_returns = m.STREAMING
    return_ids = ((first_return_id(task_id),) if num_returns == 1 or num_returns == m.STREAMING
                  else tuple([object_id_for(task_id, i + 1) for i in range(num_returns)]))
    spec = m.TaskSpec(task_id, job_id, name, function_id,
                      built.args, built.kwarg_names,
                      num_returns, rt.client_id, actor_id=actor_id, method=method,
                      owner_node=rt.node_id)
    if resources is not None or group or max_calls or capture:  # (rare: set apart)
        spec.resources, spec.concurrency_group = resources, group
        spec.max_calls, spec.capture_group = max_calls, capture
    running = context.current_spec()  # the task submitting it, if any
    record = TaskRecord(spec, shape, max_retries, retry_exceptions, keep_alive or (),
                        return_ids, has_contained=bool(built.contained), key=key,
                        parent=None if running is None else running.task_id)
    if built.contained:
        rt.refs.send_holds(m.AddHolds, built.contained, task_id)
    if num_returns == 1:
        ref = ObjectRef(return_ids[0], rt.client_id)
        rt.owner.submit(record, built.pending, built.error)
        return ref
    if dynamic:
        record.stream, record.dynamic = Stream(), True
        ref = ObjectRef(return_ids[0], rt.client_id)
        rt.owner.submit(record, built.pending, built.error)
        return ref
    if num_returns == m.STREAMING:
        stream = record.stream = Stream()
        generator = ObjectRefGenerator(rt.links, task_id, stream, ObjectRef(return_ids[0],
                                                                      rt.client_id))
        rt.owner.submit(record, built.pending, built.error)
        return generator
    refs = [ObjectRef(oid, rt.client_id) for oid in return_ids]
    rt.owner.submit(record, built.pending, built.error)
    return refs or None
