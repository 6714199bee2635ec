"""The timeline: task records as Chrome trace events (``chrome://tracing``, Perfetto),
one process per node and one lane per worker. Pure functions over the state reader's
records, shared by ``rtml timeline`` and the dashboard's ``/api/timeline``."""

from __future__ import annotations

from typing import Any


def trace_events(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``{"name", "cat", "ph": "X", "ts", "dur", "pid", "tid", "args"}`` for each task
    record (``ControlPlane.list_tasks``) that has run, in microseconds."""
    return [_event(t) for t in tasks if t.get("start_ts") and t.get("end_ts")]


def _event(task: dict[str, Any]) -> dict[str, Any]:
    return {"name": task.get("name") or "task", "cat": "task", "ph": "X",
            "ts": task["start_ts"] * 1e6, "dur": (task["end_ts"] - task["start_ts"]) * 1e6,
            "pid": str(task.get("node_id") or "")[:12], "tid": task.get("worker_pid", 0),
            "args": {"task_id": task.get("task_id"), "status": task.get("status"),
                     "job_id": task.get("job_id")}}
