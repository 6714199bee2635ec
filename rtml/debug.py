"""Replay a past task in this process, under a debugger: ``rtml.debug.replay(task_id)``
and ``rtml debug TASK_ID``.

    task id --ControlPlane.task_call--> its record (name, function id, job, attempt) and
            its call (rtml.core.kept_calls: arguments as the worker got them, options)
        function  <-- the control plane's functions table (checked against its id: a hash)
        arguments <-- inline ones from the record; those in an object store read from the
                      node holding them, while they live (else: which one is gone, and why)
        --> pdb.Pdb().runcall(function, *args, **kwargs) here: a breakpoint at its first
            line; the value it returns, or the exception it raises (after a post-mortem)

The call runs in the replaying process (its Python, its working directory, the job's on
``sys.path``): the task's runtime_env is not set up, and anything the function does to
the cluster (tasks it submits, objects it puts) is done again, by this process.
"""

from __future__ import annotations

import bdb
import os
import pdb as pdb_module
import sys
import time
from dataclasses import dataclass
from typing import Any

import cloudpickle
import msgspec

from rtml.config import HEARTBEAT_INTERVAL
from rtml.core import current
from rtml.core.kept_calls import CALL_ARGS_KEPT
from rtml.core.memory_store import StoredError
from rtml.core.object_ref import ObjectRef
from rtml.core.runtime import ClientRuntime
from rtml.core.serialization import from_payload
from rtml.exceptions import GetTimeoutError, ObjectLostError, OwnerDiedError, ReplayError
from rtml.rpc import messages as m

READ_TIMEOUT = 10.0
"""Seconds to read an argument from an object store (pulled from another node; one freed
since its location was recorded is awaited that long)."""

__all__ = ["Call", "ReplayError", "load", "replay"]


class KeptCall(msgspec.Struct, array_like=True):
    """A task's call as its outcome record keeps it (``rtml.core.kept_calls``)."""

    args: list[m.TaskArg] | int  # the call's arguments, or the bytes of them dropped
    kwarg_names: list[str]
    num_returns: int
    resources: dict[str, float] | None


@dataclass
class Call:
    """A task's call, rebuilt: what :func:`replay` runs."""

    task_id: str
    name: str
    status: str
    function: Any
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]


def replay(task_id: str | bytes | ObjectRef, *, debugger: bool = True, pdb: bool = True,
           stdin: Any = None, stdout: Any = None) -> Any:
    """Run task ``task_id`` (hex, bytes, or an ObjectRef it returned) again in this process
    and return its value, or raise what it raises. ``debugger`` (or ``pdb``) False: run
    it plainly (tests); else under ``pdb``, stopped at its first line, with a post-mortem
    when it raises (``stdin`` / ``stdout``: pdb's, default the terminal's).
    Raises ReplayError when it cannot be rebuilt."""
    call = load(task_id)
    if not (debugger and pdb):
        return call.function(*call.args, **call.kwargs)
    return _under_pdb(call, stdin, stdout)


def load(task_id: str | bytes | ObjectRef) -> Call:
    """The task's call, rebuilt from the control plane (see the module's diagram). Raises
    ReplayError naming what is missing."""
    rt = current.require_runtime()
    task_bytes = _task_bytes(task_id)
    rt.owner.settle()  # this process's own tasks: their records written first
    rt.writer.flush()
    try:
        record, call = rt.plane.task_call(task_bytes)
    except KeyError:
        raise ReplayError(f"no task {task_bytes.hex()} is recorded in the control plane "
                          f"(`rtml list tasks` lists those it keeps: the newest "
                          f"RTML_TASK_RECORDS_KEPT)") from None
    name = str(record.get("name") or "task")
    if call is None:
        raise ReplayError(f"task {name!r} ({task_bytes.hex()}) has no recorded call: it has "
                          f"not run (status {record.get('status')}), so there is nothing to "
                          f"replay yet")
    if isinstance(call, bytes):  # an actor call: its actor's id
        raise ReplayError(f"{name!r} is a call of an actor's method: replaying actor calls "
                          f"is not supported (it needs the actor's state at that moment, "
                          f"which no record keeps); replay the tasks it calls instead")
    kept = msgspec.convert(call, KeptCall)
    if isinstance(kept.args, int):
        raise ReplayError(f"task {name!r} was passed {kept.args} bytes of inline arguments, "
                          f"over the {CALL_ARGS_KEPT} bytes a task record keeps; pass large "
                          f"values with rtml.put (their refs are kept) to replay such a task")
    _job_path(rt, str(record.get("job_id") or ""))
    values = [_argument(rt, i, arg) for i, arg in enumerate(kept.args)]
    split = len(values) - len(kept.kwarg_names)
    options = {"num_returns": kept.num_returns, "resources": kept.resources or {"CPU": 1.0},
               "attempt": record.get("attempt", 0)}
    return Call(task_bytes.hex(), name, str(record.get("status")),
                _function(rt, bytes.fromhex(str(record.get("function_id") or "")), name),
                values[:split], dict(zip(kept.kwarg_names, values[split:], strict=True)),
                options)


def _task_bytes(task_id: str | bytes | ObjectRef) -> bytes:
    if isinstance(task_id, ObjectRef):
        return bytes(task_id.task_id())
    if isinstance(task_id, bytes):
        return task_id
    try:
        return bytes.fromhex(str(task_id))
    except ValueError:
        raise ReplayError(f"{task_id!r} is not a task id: give its hex id as `rtml list "
                          f"tasks` shows it") from None


def _function(rt: ClientRuntime, function_id: bytes, name: str) -> Any:
    blob = rt.stored_function(function_id)
    if blob is None:
        raise ReplayError(f"the function of task {name!r} ({function_id.hex()}) is not "
                          f"in the control plane (or not a body of that id); is Redis up?")
    return cloudpickle.loads(blob)


def _job_path(rt: ClientRuntime, job_hex: str) -> None:
    """Put the job's working directory on sys.path (its modules import, as on workers)."""
    for job in rt.plane.list_jobs():
        cwd = job.get("cwd")
        if job["JobID"] == job_hex and cwd and os.path.isdir(cwd) and cwd not in sys.path:
            sys.path.insert(0, cwd)


def _argument(rt: ClientRuntime, index: int, arg: m.TaskArg) -> Any:
    if arg.value is not None:
        value = from_payload(arg.value)
    else:
        value = _stored(rt, index, arg)
    if isinstance(value, StoredError):
        raise ReplayError(f"argument {index} of the task was an error, not a value: "
                          f"{value.error!r}")
    return value


def _stored(rt: ClientRuntime, index: int, arg: m.TaskArg) -> Any:
    """An argument that was in an object store: read from a node holding it now. Nodes
    record where objects are each heartbeat, so one made just now is looked for twice
    that long before it is said to be gone."""
    deadline = time.monotonic() + 2 * HEARTBEAT_INTERVAL
    while True:
        where = rt.plane.object_locations([arg.object_id]).get(arg.object_id)
        if where or time.monotonic() > deadline:
            break
        time.sleep(HEARTBEAT_INTERVAL / 5)
    gone = (f"argument {index} (object {arg.object_id.hex()}) no longer exists: it was "
            f"freed once nothing referenced it, so this task can be replayed only while its "
            f"arguments live (keep a ref to them, or replay it before they go)")
    if not where:
        raise ReplayError(gone)
    try:
        return rt.shared.read(arg.object_id, arg.owner_id, time.monotonic() + READ_TIMEOUT,
                              where[0])
    except (GetTimeoutError, ObjectLostError, OwnerDiedError) as exc:
        raise ReplayError(f"{gone} ({exc})") from None


def _under_pdb(call: Call, stdin: Any, stdout: Any) -> Any:
    out = stdout or sys.stdout
    args = ", ".join([*map(_short, call.args), *(f"{k}={_short(v)}"
                                                 for k, v in call.kwargs.items())])
    print(f"Replaying task {call.name!r} ({call.task_id}, {call.status} when it ran) with "
          f"options {call.options}:\n    {call.name}({args})\n"
          f"pdb stops at its first line: `c` runs it, `n`/`s` step, `q` quits.",
          file=out, flush=True)
    debugger = pdb_module.Pdb(stdin=stdin, stdout=stdout)
    if stdin is not None:
        debugger.use_rawinput = False
    try:
        return debugger.runcall(call.function, *call.args, **call.kwargs)
    except bdb.BdbQuit:  # the user quit: not the task's outcome
        raise
    except BaseException as exc:
        print(f"task {call.name!r} raised {type(exc).__name__}: {exc}; post-mortem (`q` "
              f"quits)", file=out, flush=True)
        debugger.reset()
        debugger.interaction(None, exc.__traceback__)
        raise


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
