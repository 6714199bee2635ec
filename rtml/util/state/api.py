"""The state API's calls: read the connected cluster's control plane, as Ray's
``ray.util.state.api``.

::

    list_tasks(filters=..., limit=..., detail=...)
        -> check the filters (ValueError before anything is read)
        -> this process's own task records written first (owner.settle, writer.flush)
        -> rtml.state.StateReader over the runtime's ControlPlane (the reader the command
       line and the dashboard use too): records.*_state -> common.select -> [TaskState, ...]

Ray's calls ask the dashboard's HTTP server, which asks the GCS and every raylet; rtml's
read Redis, where rtml keeps that state, over the connection the process already has.
``address`` is accepted for Ray's signatures: the calls read the cluster this process
is connected to (connecting as any first rtml call does). ``timeout`` is accepted too:
each read of Redis gives up after 10 s (RtmlSystemError, saying why). rtml reads every
record from one place, so no output goes missing for ``raise_on_missing_output`` to
raise on (task records trimmed by the head, ``RTML_TASK_RECORDS_KEPT``, are gone for
every reader). ``_explain`` is accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rtml.core import current
from rtml.core.object_ref import ObjectRef
from rtml.state import StateReader
from rtml.state.common import (
    DEFAULT_LIMIT,
    DEFAULT_RPC_TIMEOUT,
    ActorState,
    Filter,
    JobState,
    NodeState,
    ObjectState,
    TaskState,
)

Filters = Sequence[Filter] | None


def _reader(tasks: bool = False) -> StateReader:
    """A reader of the connected cluster's control plane; with ``tasks``, after this
    process's own task records are written, so that a task that just ended is listed as
    ended."""
    rt = current.require_runtime()
    if tasks:
        rt.owner.settle()
        rt.writer.flush()
    return StateReader(rt.plane)


# -- list ----------------------------------------------------------------------------------

def list_tasks(address: str | None = None, filters: Filters = None,
               limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
               detail: bool = False, raise_on_missing_output: bool = True,
               _explain: bool = False) -> list[TaskState]:
    """Tasks and actor calls of every job, by task id: the first ``limit`` that every
    filter holds for. Raises ValueError for a filter that is not
    ``(column, "=" | "!=", value)`` over a filterable column of TaskState."""
    return _reader(tasks=True).listing("tasks", filters, limit, detail)


def list_actors(address: str | None = None, filters: Filters = None,
                limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
                detail: bool = False, raise_on_missing_output: bool = True,
                _explain: bool = False) -> list[ActorState]:
    """Actors, alive or dead, by actor id (filters as ``list_tasks``')."""
    return _reader().listing("actors", filters, limit, detail)


def list_objects(address: str | None = None, filters: Filters = None,
                 limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
                 detail: bool = False, raise_on_missing_output: bool = True,
                 _explain: bool = False) -> list[ObjectState]:
    """Objects in the nodes' shared-memory stores (or spilled from them), by object id
    (filters as ``list_tasks``'). Small values kept in their owner's memory are not
    listed; a node records its store's objects each heartbeat (0.5 s)."""
    return _reader().listing("objects", filters, limit, detail)


def list_nodes(address: str | None = None, filters: Filters = None,
               limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
               detail: bool = False, raise_on_missing_output: bool = True,
               _explain: bool = False) -> list[NodeState]:
    """Nodes, alive and dead, by node id (filters as ``list_tasks``')."""
    return _reader().listing("nodes", filters, limit, detail)


def list_jobs(address: str | None = None, filters: Filters = None,
              limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
              detail: bool = False, raise_on_missing_output: bool = True,
              _explain: bool = False) -> list[JobState]:
    """Jobs (drivers), running and ended, by job id (filters as ``list_tasks``')."""
    return _reader().listing("jobs", filters, limit, detail)


# -- get -----------------------------------------------------------------------------------

def get_task(id: str | ObjectRef, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
             _explain: bool = False) -> TaskState | None:
    """The task with this id (hex, or an ObjectRef it made), all columns; None if no
    such task is recorded. rtml keeps one record per task, its latest attempt's."""
    task_id = id if isinstance(id, str) else id.task_id().hex()
    return _reader(tasks=True).task_state(task_id)


def get_actor(id: str, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
              _explain: bool = False) -> ActorState | None:
    """The actor with this (hex) id, all columns; None if there is none."""
    return _find(_reader().actors(), "actor_id", id)


def get_node(id: str, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
             _explain: bool = False) -> NodeState | None:
    """The node with this (hex) id, all columns; None if there is none."""
    return _find(_reader().nodes(), "node_id", id)


def _find(rows: list[Any], key: str, wanted: str) -> Any:
    wanted = str(wanted).lower()
    return next((row for row in rows if getattr(row, key) == wanted), None)


# -- summarize -----------------------------------------------------------------------------

def summarize_tasks(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                    raise_on_missing_output: bool = True,
                    _explain: bool = False) -> dict[str, Any]:
    """``{"cluster": {"summary": {name: {"func_or_class_name", "type", "state_counts"}},
    "total_tasks", "total_actor_tasks", "total_actor_scheduled", "summary_by"}}``."""
    return _reader(tasks=True).summarize("tasks")


def summarize_actors(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                     raise_on_missing_output: bool = True,
                     _explain: bool = False) -> dict[str, Any]:
    """``{"cluster": {"summary": {class_name: {"class_name", "state_counts"}},
    "total_actors", "summary_by"}}``."""
    return _reader().summarize("actors")


def summarize_objects(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                      raise_on_missing_output: bool = True,
                      _explain: bool = False) -> dict[str, Any]:
    """``{"cluster": {"summary": {call_site: {"total_objects", "total_size_mb",
    "total_num_workers", "total_num_nodes", "task_state_counts", "ref_type_counts"}},
    "total_objects", "total_size_mb", "callsite_enabled", "summary_by"}}``."""
    return _reader().summarize("objects")
