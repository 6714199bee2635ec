"""One reader of the cluster's state, shared by the state API (``rtml.util.state``), the
command line (``rtml status / list / get / summary / memory / timeline``) and the
dashboard's JSON API, so that all three show the same rows.

::

    ControlPlane (Redis) --list_tasks / task_history / list_actors / list_objects /
                           list_nodes / list_jobs / list_submissions-->
        records.* (Ray's names and states) --> StateReader
            .listing(kind, filters, limit, detail) rows, cut as common.select cuts them
            .task(id) / .actor(id)                one, every column, and its attempts
            .summarize(kind) / .memory()          counts / objects by owner
            .cluster()                            nodes, used/total, store, pending demand
            .timeline()                           Chrome trace events

It only reads, over the ControlPlane it is given (each read gives up after the
plane's timeout with RtmlSystemError); it holds no state between calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rtml.config import STORE_RESOURCE
from rtml.control_plane import ControlPlane, chrome_trace
from rtml.ids import TASK_ID_SIZE
from rtml.state import records, summary
from rtml.state.common import (
    DEFAULT_LIMIT,
    ActorState,
    Filter,
    JobState,
    NodeState,
    ObjectState,
    StateSchema,
    TaskState,
    check_filters,
    select,
)

_EVERY = 1 << 62  # "no limit" for the control plane's reads: the reader cuts its own
_ACTOR_ID_SIZE = 16  # an actor's id is a random_id()

KINDS: dict[str, tuple[type[StateSchema], str]] = {
    "tasks": (TaskState, "task_id"), "actors": (ActorState, "actor_id"),
    "objects": (ObjectState, "object_id"), "nodes": (NodeState, "node_id"),
    "jobs": (JobState, "job_id"),
}
"""What can be listed: kind -> (its state class, the column rows are sorted by)."""
SUMMARIES = ("tasks", "actors", "objects")


def replay_command(task_id: str) -> str:
    """The command that runs a past task again under a debugger."""
    return f"rtml debug {task_id}"


class StateReader:
    """Reads the cluster's tasks, actors, objects, nodes and jobs from ``plane``."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    # -- every row of a kind -----------------------------------------------------------

    def tasks(self) -> list[TaskState]:
        return [records.task_state(r) for r in self.plane.list_tasks(limit=_EVERY)]

    def actors(self) -> list[ActorState]:
        return [records.actor_state(r) for r in self.plane.list_actors()]

    def objects(self) -> list[ObjectState]:
        """Objects in the nodes' stores (or spilled from them), every column."""
        ips = {node["NodeID"]: records.node_ip(node) for node in self.plane.list_nodes()}
        handles = records.actor_handles(self.plane.list_actors())
        return [records.object_state(r, ips, handles)
                for r in self.plane.list_objects(limit=_EVERY)]

    def nodes(self) -> list[NodeState]:
        return [records.node_state(r) for r in self.plane.list_nodes()]

    def jobs(self) -> list[JobState]:
        """Drivers, and the jobs submitted with ``rtml job submit``."""
        return ([records.job_state(r) for r in self.plane.list_jobs()]
                + [records.submission_state(r) for r in self.plane.list_submissions()])

    # -- listing --------------------------------------------------------------------------

    def listing(self, kind: str, filters: Sequence[Filter] | None = None,
             limit: int = DEFAULT_LIMIT, detail: bool = False) -> list[Any]:
        """The rows of ``kind`` (one of KINDS) every filter holds for, sorted by id, the
        first ``limit``. Raises ValueError naming what is allowed for an unknown kind,
        a bad filter or a negative limit (before anything is read)."""
        if kind not in KINDS:
            raise ValueError(f"cannot list {kind!r}; list one of {', '.join(KINDS)}")
        schema, key = KINDS[kind]
        checked = check_filters(filters, schema)
        if limit < 0:
            raise ValueError(f"limit must be 0 or more, got {limit}")
        read: Callable[[], list[Any]] = getattr(self, kind)
        return select(read(), checked, key, limit, detail)

    # -- one ------------------------------------------------------------------------------

    def task_state(self, task_id: str) -> TaskState | None:
        """The task with this hex id, every column; None if none is recorded. Raises
        ValueError if ``task_id`` is not a task id."""
        wanted = _hex_id(task_id, TASK_ID_SIZE, "task")
        found = self.plane.list_tasks({"task_id": wanted}, limit=_EVERY)
        return records.task_state(found[0]) if found else None

    def task(self, task_id: str) -> dict[str, Any] | None:
        """The task's columns, its ``attempts`` (``records.attempts``) and the ``replay``
        command; None if no such task is recorded. Raises ValueError for a bad id."""
        state = self.task_state(task_id)
        if state is None:
            return None
        history = self.plane.task_history(bytes.fromhex(state.task_id))
        return {**state.asdict(), "attempts": records.attempts(history),
                "replay": replay_command(state.task_id)}

    def actor(self, actor_id: str) -> dict[str, Any] | None:
        """The actor's columns and what its spec says (restarts allowed, concurrency,
        resources, address); None if there is none. Raises ValueError for a bad id."""
        wanted = _hex_id(actor_id, _ACTOR_ID_SIZE, "actor")
        record = next((r for r in self.plane.list_actors() if r["actor_id"] == wanted), None)
        if record is None:
            return None
        spec = records.actor_spec(record)
        extra: dict[str, Any] = {"address": record.get("tcp_address") or record.get("address"),
                                 "max_restarts": record.get("max_restarts")}
        if spec is not None:
            extra.update(max_task_retries=spec.max_task_retries,
                         max_concurrency=spec.max_concurrency, is_async=spec.is_async,
                         hold_resources=dict(spec.hold_shape))
        return {**records.actor_state(record).asdict(), **extra}

    # -- summaries -------------------------------------------------------------------------

    def summarize(self, kind: str) -> dict[str, Any]:
        """Ray's summary of ``kind`` (tasks, actors or objects). Raises ValueError for
        another kind."""
        if kind == "tasks":
            return summary.task_summary(self.tasks())
        if kind == "actors":
            return summary.actor_summary(self.actors())
        if kind == "objects":
            objects = self.objects()
            return summary.object_summary(objects, [o.owner_id or "" for o in objects])
        raise ValueError(f"cannot summarize {kind!r}; summarize one of {', '.join(SUMMARIES)}")

    def memory(self) -> dict[str, Any]:
        """Objects by the process owning them, with sizes, nodes and spilled bytes
        (``summary.memory_summary``), and the objects themselves (``objects``)."""
        objects = self.objects()
        return {**summary.memory_summary(objects), "objects": [o.asdict() for o in objects]}

    def cluster(self) -> dict[str, Any]:
        """The cluster at a glance: each node with its resources used/total and object
        store use, totals over the alive nodes, the demand no node can place, and the
        tasks and actors counted by state."""
        raw = self.plane.list_nodes()
        nodes = [_node_use(node) for node in raw]
        totals: dict[str, dict[str, float]] = {}
        for node in nodes:
            for name, use in node["resources"].items() if node["alive"] else ():
                total = totals.setdefault(name, {"used": 0.0, "total": 0.0})
                total["used"] += use["used"]
                total["total"] += use["total"]
        return {"nodes": nodes, "resources": totals, "pending_demand": _demand(raw),
                "tasks": dict(Counter(t.state for t in self.tasks())),
                "actors": dict(Counter(a.state for a in self.actors()))}

    def timeline(self) -> list[dict[str, Any]]:
        """Chrome trace events of the tasks and actor calls with their phases, leases and
        object transfers (``rtml.control_plane.chrome_trace``)."""
        return chrome_trace(self.plane.list_tasks(limit=_EVERY), self.plane.read_events())


def _hex_id(text: str, size: int, what: str) -> str:
    """``text`` as a lowercase hex id of ``size`` bytes. Raises ValueError saying what
    one looks like."""
    wanted = str(text).strip().lower()
    try:
        ok = len(bytes.fromhex(wanted)) == size
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{text!r} is not a {what} id: give the {size * 2} hex digits "
                         f"that `rtml list {what}s` shows in its {what.upper()}_ID column")
    return wanted


def _node_use(node: dict[str, Any]) -> dict[str, Any]:
    """A node record as ``{node_id, address, alive, resources: {name: {used, total}},
    object_store: {used, total}, last_heartbeat, metrics_address}``; ``node:<ip>``
    markers left out."""
    total: dict[str, float] = node.get("Resources") or {}
    available: dict[str, float] = node.get("Available") or total
    resources = {name: {"used": amount - available.get(name, amount), "total": amount}
                 for name, amount in sorted(total.items()) if not name.startswith("node:")}
    store = resources.get(STORE_RESOURCE, {"used": 0.0, "total": 0.0})
    return {"node_id": node["NodeID"], "address": node.get("NodeManagerAddress", ""),
            "alive": bool(node.get("Alive")), "resources": resources, "object_store": store,
            "last_heartbeat": node.get("LastHeartbeat"),
            "metrics_address": str(node.get("metrics_address") or "")}


def _demand(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The resource shapes alive nodes cannot place, with how many tasks wait for each."""
    shapes: Counter[tuple[tuple[str, float], ...]] = Counter()
    for node in nodes:
        if node.get("Alive"):
            for shape in node.get("PendingShapes") or []:
                shapes[tuple(sorted(shape.items()))] += 1
    return [{"shape": dict(shape), "count": n} for shape, n in shapes.most_common()]
