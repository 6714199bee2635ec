"""The state API's calls: read the connected cluster's control plane, as Ray's
``ray.util.state.api``.

::

    list_tasks(filters=..., limit=..., detail=...)
        -> check the filters (ValueError before anything is read)
        -> this process's own task records written first (owner.settle, writer.flush)
        -> ControlPlane.list_tasks / list_actors / list_objects / list_nodes / list_jobs
        -> records.*_state (Ray's names and states) -> common.select -> [TaskState, ...]

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

from collections.abc import Callable, Sequence
from typing import Any

from rtml.control_plane import ControlPlane
from rtml.core import current
from rtml.core.object_ref import ObjectRef
from rtml.util.state import records, summary
from rtml.util.state.common import (
    DEFAULT_LIMIT,
    DEFAULT_RPC_TIMEOUT,
    ActorState,
    Filter,
    JobState,
    NodeState,
    ObjectState,
    S,
    StateSchema,
    TaskState,
    check_filters,
    select,
)

_EVERY = 1 << 62  # "no limit" for the control plane's reads: the state API cuts its own

Filters = Sequence[Filter] | None


def _plane(tasks: bool = False) -> ControlPlane:
    """The connected cluster's control plane; with ``tasks``, after this process's own
    task records are written, so that a task that just ended is listed as ended."""
    rt = current.require_runtime()
    if tasks:
        rt.owner.settle()
        rt.writer.flush()
    return rt.plane


def _list(read: Callable[[], list[S]], schema: type[StateSchema], key: str,
          filters: Filters, limit: int, detail: bool) -> list[S]:
    checked = check_filters(filters, schema)
    return select(read(), checked, key, limit, detail)


def _tasks() -> list[TaskState]:
    return [records.task_state(r) for r in _plane(tasks=True).list_tasks(limit=_EVERY)]


def _actors() -> list[ActorState]:
    return [records.actor_state(r) for r in _plane().list_actors()]


def _objects() -> tuple[list[ObjectState], list[str]]:
    """Every object's state, and the id of the process owning each."""
    plane = _plane()
    ips = {node["NodeID"]: records.node_ip(node) for node in plane.list_nodes()}
    handles = records.actor_handles(plane.list_actors())
    found = plane.list_objects(limit=_EVERY)
    return ([records.object_state(r, ips, handles) for r in found],
            [str(r.get("owner", "")) for r in found])


def _nodes() -> list[NodeState]:
    return [records.node_state(r) for r in _plane().list_nodes()]


def _jobs() -> list[JobState]:
    return [records.job_state(r) for r in _plane().list_jobs()]


# -- list ----------------------------------------------------------------------------------

def list_tasks(address: str | None = None, filters: Filters = None,
               limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
               detail: bool = False, raise_on_missing_output: bool = True,
               _explain: bool = False) -> list[TaskState]:
    """Tasks and actor calls of every job, by task id: the first ``limit`` that every
    filter holds for. Raises ValueError for a filter that is not
    ``(column, "=" | "!=", value)`` over a filterable column of TaskState."""
    return _list(_tasks, TaskState, "task_id", filters, limit, detail)


def list_actors(address: str | None = None, filters: Filters = None,
                limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
                detail: bool = False, raise_on_missing_output: bool = True,
                _explain: bool = False) -> list[ActorState]:
    """Actors, alive or dead, by actor id (filters as ``list_tasks``')."""
    return _list(_actors, ActorState, "actor_id", filters, limit, detail)


def list_objects(address: str | None = None, filters: Filters = None,
                 limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
                 detail: bool = False, raise_on_missing_output: bool = True,
                 _explain: bool = False) -> list[ObjectState]:
    """Objects in the nodes' shared-memory stores (or spilled from them), by object id
    (filters as ``list_tasks``'). Small values kept in their owner's memory are not
    listed; a node records its store's objects each heartbeat (0.5 s)."""
    return _list(lambda: _objects()[0], ObjectState, "object_id", filters, limit, detail)


def list_nodes(address: str | None = None, filters: Filters = None,
               limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
               detail: bool = False, raise_on_missing_output: bool = True,
               _explain: bool = False) -> list[NodeState]:
    """Nodes, alive and dead, by node id (filters as ``list_tasks``')."""
    return _list(_nodes, NodeState, "node_id", filters, limit, detail)


def list_jobs(address: str | None = None, filters: Filters = None,
              limit: int = DEFAULT_LIMIT, timeout: int = DEFAULT_RPC_TIMEOUT,
              detail: bool = False, raise_on_missing_output: bool = True,
              _explain: bool = False) -> list[JobState]:
    """Jobs (drivers), running and ended, by job id (filters as ``list_tasks``')."""
    return _list(_jobs, JobState, "job_id", filters, limit, detail)


# -- get -----------------------------------------------------------------------------------

def get_task(id: str | ObjectRef, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
             _explain: bool = False) -> TaskState | None:
    """The task with this id (hex, or an ObjectRef it made), all columns; None if no
    such task is recorded. rtml keeps one record per task, its latest attempt's."""
    task_id = id if isinstance(id, str) else id.task_id().hex()
    found = _plane(tasks=True).list_tasks({"task_id": task_id.lower()}, limit=_EVERY)
    return records.task_state(found[0]) if found else None


def get_actor(id: str, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
              _explain: bool = False) -> ActorState | None:
    """The actor with this (hex) id, all columns; None if there is none."""
    return _find(_actors(), "actor_id", id)


def get_node(id: str, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
             _explain: bool = False) -> NodeState | None:
    """The node with this (hex) id, all columns; None if there is none."""
    return _find(_nodes(), "node_id", id)


def _find(rows: list[S], key: str, wanted: str) -> S | None:
    wanted = str(wanted).lower()
    return next((row for row in rows if getattr(row, key) == wanted), None)


# -- summarize -----------------------------------------------------------------------------

def summarize_tasks(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                    raise_on_missing_output: bool = True,
                    _explain: bool = False) -> dict[str, Any]:
    """``{"cluster": {"summary": {name: {"func_or_class_name", "type", "state_counts"}},
    "total_tasks", "total_actor_tasks", "total_actor_scheduled", "summary_by"}}``."""
    return summary.task_summary(_tasks())


def summarize_actors(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                     raise_on_missing_output: bool = True,
                     _explain: bool = False) -> dict[str, Any]:
    """``{"cluster": {"summary": {class_name: {"class_name", "state_counts"}},
    "total_actors", "summary_by"}}``."""
    return summary.actor_summary(_actors())


def summarize_objects(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                      raise_on_missing_output: bool = True,
                      _explain: bool = False) -> dict[str, Any]:
    """``{"cluster": {"summary": {call_site: {"total_objects", "total_size_mb",
    "total_num_workers", "total_num_nodes", "task_state_counts", "ref_type_counts"}},
    "total_objects", "total_size_mb", "callsite_enabled", "summary_by"}}``."""
    return summary.object_summary(*_objects())
