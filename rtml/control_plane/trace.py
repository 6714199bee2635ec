"""The timeline: task records and events of the control plane as a Chrome trace (the
JSON array format that chrome://tracing and https://ui.perfetto.dev open).

    process "node <id>", one thread per worker ("worker <pid>"):
        [ task name ................................................ ] (cat task | actor_call)
        [ fetch arguments ][ run ............................ ][ store result ]
        [ lease: granted to this worker (the node manager's wait, request -> grant) ]
    process "node <id>", thread "object transfers": [ pull <object> <size> from <node> ]
    process "owners", one thread per owner: [ queued: task name ] submit -> start on its
        worker: the wait for a lease (or a worker of it), for its arguments, and the trip

A phase the worker did not reach (its code raised before its arguments were ready) is
left out. Times are each process's wall clock: nodes whose clocks disagree show queues
shifted by the difference.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

TRANSFERS_TID = 0
"""The lane of a node's object transfers (workers' lanes are their pids)."""


def chrome_trace(tasks: Iterable[dict[str, Any]],
                 events: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Trace events for ``tasks`` (``list_tasks`` records) and the nodes' lease and
    transfer ``events`` (``read_events``), with the lanes named."""
    trace: list[dict[str, Any]] = []
    lanes: dict[tuple[str, int], str] = {}
    for task in tasks:
        if task.get("start_ts") and task.get("end_ts"):
            trace += _task(task, lanes)
    for event in events:
        kind = event.get("kind")
        if kind == "LeaseGranted":
            trace.append(_lease(event, lanes))
        elif kind == "ObjectPulled":
            trace.append(_pull(event, lanes))
    return _names(lanes) + trace


def _slice(name: str, cat: str, start: float, end: float, pid: str, tid: int,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": start * 1e6,
            "dur": max(0.0, end - start) * 1e6, "pid": pid, "tid": tid, "args": args or {}}


def _task(task: dict[str, Any], lanes: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    name = task.get("name") or "task"
    node = f"node {str(task.get('node_id') or '')[:12]}"
    pid = int(task.get("worker_pid") or 0)
    lanes[(node, pid)] = f"worker {pid}"
    start, end = task["start_ts"], task["end_ts"]
    cat = "actor_call" if task.get("actor_id") else "task"
    out = [_slice(name, cat, start, end, node, pid,
                  {"task_id": task.get("task_id"), "status": task.get("status"),
                   "job_id": task.get("job_id"), "attempt": task.get("attempt")})]
    args_ts, run_end = task.get("args_ts") or 0.0, task.get("run_end_ts") or 0.0
    if args_ts:
        out.append(_slice("fetch arguments", "phase", start, args_ts, node, pid))
        if run_end:
            out.append(_slice("run", "phase", args_ts, run_end, node, pid))
            out.append(_slice("store result", "phase", run_end, end, node, pid))
    submitted = task.get("submit_ts")
    if submitted:  # (taken by the owner just after it sent the task: a task that started
        #           at once may start before it, and shows as queued for no time)
        submitted = min(submitted, start)
        owner = str(task.get("owner_id") or "")[:12]
        lane = int(owner or "0", 16) % (1 << 31)
        lanes[("owners", lane)] = f"owner {owner}"
        out.append(_slice(f"queued: {name}", "queued", submitted, start, "owners", lane,
                          {"task_id": task.get("task_id")}))
    return out


def _lease(event: dict[str, Any], lanes: dict[tuple[str, int], str]) -> dict[str, Any]:
    node = f"node {str(event.get('node_id') or '')[:12]}"
    pid = int(event.get("worker_pid") or 0)
    lanes[(node, pid)] = f"worker {pid}"
    return _slice("lease", "lease", event["asked_ts"], event["granted_ts"], node, pid,
                  {"worker_id": event.get("worker_id")})


def _pull(event: dict[str, Any], lanes: dict[tuple[str, int], str]) -> dict[str, Any]:
    node = f"node {str(event.get('node_id') or '')[:12]}"
    lanes[(node, TRANSFERS_TID)] = "object transfers"
    source = str(event.get("from_node") or "")[:12]
    return _slice(f"pull {str(event.get('object_id') or '')[:12]} from {source}", "transfer",
                  event["start_ts"], event["end_ts"], node, TRANSFERS_TID,
                  {"object_id": event.get("object_id"), "bytes": event.get("size"),
                   "from_node": event.get("from_node")})


def _names(lanes: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """Metadata events naming each process (node) and thread (worker) of the trace."""
    named: list[dict[str, Any]] = []
    for process in sorted({node for node, _ in lanes}):
        named.append({"name": "process_name", "ph": "M", "pid": process, "tid": 0,
                      "args": {"name": process}})
    for (process, tid), lane in sorted(lanes.items()):
        named.append({"name": "thread_name", "ph": "M", "pid": process, "tid": tid,
                      "args": {"name": lane}})
    return named
