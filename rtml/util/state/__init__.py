"""Ray's state API, ``ray.util.state``: what the cluster's tasks, actors, objects, nodes
and jobs are doing, read from rtml's control plane.

    from rtml.util.state import list_tasks, summarize_tasks

    failed = list_tasks(filters=[("state", "=", "FAILED"), ("name", "!=", "probe")])
    print(failed[0].error_type, failed[0]["task_id"])

``list_*`` return lists of state objects (``common``: ``TaskState``, ``ActorState``,
``ObjectState``, ``NodeState``, ``JobState``), read as attributes or by key, sorted by
id, the first ``limit`` (default 100, Ray's ``DEFAULT_LIMIT``); their detail columns
are None unless ``detail=True``. ``filters``: ``(column, "=" | "!=", value)`` tuples,
all of which must hold; strings compare case-insensitively. A predicate other than
those, or a column that is not filterable, raises ValueError saying what is allowed.
``get_task`` / ``get_actor`` / ``get_node`` return one object with every column, or
None. ``summarize_*`` return Ray's ``{"cluster": {...}}`` dicts of counts. ``address``,
``timeout``, ``raise_on_missing_output`` and ``_explain`` are accepted as in Ray (see
``api`` for what each does here).

rtml's states in Ray's names:

    task     PENDING (submitted; its outcome not yet recorded)  -> PENDING_NODE_ASSIGNMENT
             FINISHED -> FINISHED, FAILED -> FAILED
    actor    PENDING -> PENDING_CREATION; ALIVE, RESTARTING, DEAD as they are
    node     alive -> ALIVE, dead -> DEAD
    job      running -> RUNNING, its driver gone -> SUCCEEDED (rtml does not record how
             a driver ended; Ray says SUCCEEDED for an ended driver job too)

A task's error type: its code raised -> TASK_EXECUTION_EXCEPTION (``error_message``: the
traceback of its last attempt, which its worker records); cancelled -> TASK_CANCELLED; its
worker died -> WORKER_DIED; its node -> NODE_DIED; its actor -> ACTOR_DIED; an argument
failed -> DEPENDENCY_RESOLUTION_FAILED; its driver exited first -> OWNER_DIED; no lease
-> TASK_UNSCHEDULABLE_ERROR; the node manager gone -> LOCAL_RAYLET_DIED.

What rtml does not record, and so leaves out or fills as noted:

- a task's start until it ends: a running task is PENDING_NODE_ASSIGNMENT (its
  ``start_time_ms`` and ``node_id`` arrive with its outcome); no RUNNING state.
- a task's ``actor_id``, ``parent_task_id``, ``worker_id``, ``required_resources``,
  events and profile (not columns here); no ACTOR_CREATION_TASK records (actors are
  ``list_actors``'). ``func_or_class_name`` is the task's name (the ``name`` option if
  given). A retried task is one record, its latest attempt.
- an actor's ``repr_name``; a node's ``is_head_node`` and ``labels``.
- per-process references to an object: a listed object is ``ACTOR_HANDLE`` if it is
  the one an actor's handles hold, else ``LOCAL_REFERENCE`` (a record lives while a
  reference does); ``task_status`` is FINISHED (it is in a store), ``call_site``
  "disabled" (Ray's text when call sites are not recorded); its ``ip`` is that of the
  node that stored it; no ``pid`` or ``type``. Small values kept in their owner's
  memory are not objects here.
- workers: there is no ``list_workers`` (rtml keeps no worker table), nor placement
  groups, runtime envs, logs or cluster events.
"""

from __future__ import annotations

from rtml.state import common
from rtml.state.common import ActorState, JobState, NodeState, ObjectState, TaskState
from rtml.util.state.api import (
    get_actor,
    get_node,
    get_task,
    list_actors,
    list_jobs,
    list_nodes,
    list_objects,
    list_tasks,
    summarize_actors,
    summarize_objects,
    summarize_tasks,
)

__all__ = [
    "ActorState",
    "JobState",
    "NodeState",
    "ObjectState",
    "TaskState",
    "common",
    "get_actor",
    "get_node",
    "get_task",
    "list_actors",
    "list_jobs",
    "list_nodes",
    "list_objects",
    "list_tasks",
    "summarize_actors",
    "summarize_objects",
    "summarize_tasks",
]
