"""The task protocol: an owner (driver or worker) and the worker it leased.

    owner --PushTask(spec)--> worker (runs it: a task, or an actor method)
    owner <--TaskResult------ worker (small returns inline, large ones in shared memory)
    owner --CancelCall------> actor worker (a call already sent: skipped if not started; an
                              async method running gets asyncio.CancelledError)
"""

from __future__ import annotations

from rtml.rpc.protocols.base import Msg, ReturnObject, TaskSpec


class PushTask(Msg, tag=10):
    spec: TaskSpec


class TaskResult(Msg, tag=11):
    task_id: bytes
    returns: tuple[ReturnObject, ...]
    start_ts: float
    end_ts: float
    worker_pid: int
    node_id: bytes
    cancelled: bool = False


class CancelCall(Msg, tag=12):
    task_id: bytes


Message = (
    PushTask | TaskResult | CancelCall
)
"""Every message of this protocol."""
