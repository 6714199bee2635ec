"""The task protocol: an owner (driver or worker) and the worker it leased.

    owner --PushTask(spec)--> worker (runs it: a task, or an actor method)
    owner <--TaskResult------ worker (small returns inline, large ones in shared memory)
    owner <--GeneratorItem--- worker (a generator task's items as they are yielded, in
                              order, before its TaskResult)
    owner <--WorkerRetiring-- worker (after a result: it ran its function max_calls
                              times and exits)
    owner --CancelCall------> actor worker (a call already sent: skipped if not started; an
                              async method running gets asyncio.CancelledError)
    owner <--FunctionWanted-- worker (the task's function is not in the control plane, or
                              Redis is away: the task did not run)
    owner --PushFunction----> worker (the function, from the owner's own export), then the
                              task again, free
"""

from __future__ import annotations

from rtml.ids import NO_TASK, NodeID, TaskID
from rtml.rpc.protocols.base import Msg, ReturnObject, TaskSpec


class PushTask(Msg, tag=10):
    spec: TaskSpec


class TaskResult(Msg, tag=11):
    task_id: TaskID
    returns: tuple[ReturnObject, ...]
    start_ts: float  # when it reached the worker; then its phases, in us from then:
    end_us: int  # its returns stored (the task's end)
    worker_pid: int
    node_id: NodeID
    cancelled: bool = False
    args_us: int = -1  # its arguments ready (fetched, deserialized); -1: not reached
    ran_us: int = -1  # its code returned; -1: not reached


class CancelCall(Msg, tag=12):
    task_id: TaskID


class FunctionWanted(Msg, tag=13):
    task_id: TaskID
    function_id: bytes


class PushFunction(Msg, tag=14):
    function_id: bytes
    blob: bytes


class WorkerRetiring(Msg, tag=16):
    """The worker ran its function ``max_calls`` times and exits after this: the tasks
    its owner pushed behind the last one never started (resubmitted free)."""

    task_id: TaskID = NO_TASK  # none: read past by the owner's result loop as unmatched


class GeneratorItem(Msg, tag=15):
    task_id: TaskID
    index: int  # 0, 1, ...: object id object_id_for(task_id, index + 2)
    item: ReturnObject


Message = (
    PushTask | TaskResult | CancelCall | FunctionWanted | PushFunction | GeneratorItem |
    WorkerRetiring
)
"""Every message of this protocol."""
