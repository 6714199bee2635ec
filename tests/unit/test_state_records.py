"""rtml.util.state's pure parts, without a cluster: control-plane records in Ray's states
and error types, and how filters compare values (as Ray's state API does)."""

from __future__ import annotations

from typing import Any

import pytest

from rtml.state import records
from rtml.state.common import NodeState, TaskState, check_filters, select


def task(**fields: Any) -> dict[str, Any]:
    return {"task_id": "ab" * 16, "name": "f", "job_id": "01020304", "status": "PENDING",
            "attempt": 0, "function_id": "cd" * 20, "submit_ts": 1.5, **fields}


@pytest.mark.parametrize("error,error_type,message", [
    (None, "TASK_EXECUTION_EXCEPTION", None),
    ("TaskCancelledError(\"task 'f' was cancelled\")", "TASK_CANCELLED",
     "TaskCancelledError: task 'f' was cancelled"),
    ("WorkerCrashedError('the worker died')", "WORKER_DIED",
     "WorkerCrashedError: the worker died"),
    ("ActorDiedError('gone')", "ACTOR_DIED", "ActorDiedError: gone"),
    ("NodeDiedError('gone')", "NODE_DIED", "NodeDiedError: gone"),
    ("dependency failed", "DEPENDENCY_RESOLUTION_FAILED",
     "an argument of this task failed to be made"),
    ("the driver exited", "OWNER_DIED", "its driver (the task's owner) exited before it ran"),
    ("RtmlSystemError(\"task 'f' could not be scheduled: no node\")",
     "TASK_UNSCHEDULABLE_ERROR", "RtmlSystemError: task 'f' could not be scheduled: no node"),
    ("RtmlSystemError('the node manager at x is gone')", "LOCAL_RAYLET_DIED",
     "RtmlSystemError: the node manager at x is gone"),
])
def test_failed_task_error_types(error: str | None, error_type: str,
                                 message: str | None) -> None:
    fields = {"status": "FAILED"} | ({"error": error} if error else {})
    state = records.task_state(task(**fields))
    assert (state.state, state.error_type, state.error_message) == (
        "FAILED", error_type, message)


def test_task_states_and_types_in_ray_names() -> None:
    pending = records.task_state(task())
    assert (pending.state, pending.type, pending.error_type) == (
        "PENDING_NODE_ASSIGNMENT", "NORMAL_TASK", None)
    assert (pending.creation_time_ms, pending.start_time_ms, pending.node_id) == (
        1500, None, None)
    call = records.task_state(task(name="A.m", function_id="", status="FINISHED",
                                   start_ts=2.0, end_ts=2.25, worker_pid=7, node_id="ee"))
    assert (call.state, call.type, call.func_or_class_name) == (
        "FINISHED", "ACTOR_TASK", "A.m")
    assert (call.start_time_ms, call.end_time_ms, call.worker_pid) == (2000, 2250, 7)


def test_actor_and_node_states() -> None:
    actor = records.actor_state({"actor_id": "aa", "class_name": "A", "state": "PENDING",
                                 "spec": "not hex"})
    assert (actor.state, actor.required_resources, actor.death_cause) == (
        "PENDING_CREATION", None, None)
    dead = records.node_state({"NodeID": "n1", "Alive": False,
                               "NodeManagerAddress": "[::1]:7000", "DeathTime": 3.0})
    assert (dead.state, dead.node_ip, dead.node_name, dead.end_time_ms) == (
        "DEAD", "::1", "::1", 3000)


def rows() -> list[TaskState]:
    return [records.task_state(task(task_id=f"{i:032x}", name=name, status=status,
                                    worker_pid=pid))
            for i, (name, status, pid) in enumerate([
                ("f", "FINISHED", 10), ("g", "FAILED", 11), ("F", "FAILED", 10)])]


@pytest.mark.parametrize("filters,names", [
    ([("name", "=", "f")], ["f", "F"]),  # strings: case-insensitively
    ([("name", "!=", "f")], ["g"]),
    ([("state", "=", "FAILED"), ("name", "=", "f")], ["F"]),
    ([("worker_pid", "=", "10")], ["f", "F"]),  # a string given for a number
    ([("worker_pid", "!=", 10)], ["g"]),
    ([("error_type", "=", None)], ["f"]),
    ([("Name", "=", "G")], ["g"]),  # the column too
])
def test_filters(filters: list[tuple[str, str, Any]], names: list[str]) -> None:
    checked = check_filters(filters, TaskState)
    assert [t.name for t in select(rows(), checked, "task_id", 100, False)] == names


def test_select_sorts_limits_and_clears_detail_columns() -> None:
    found = select(list(reversed(rows())), [], "task_id", 2, detail=False)
    assert [t.name for t in found] == ["f", "g"]
    assert all(t.creation_time_ms is None and t.language is None for t in found)
    kept = select(rows(), [], "task_id", 1, detail=True)
    assert kept[0].creation_time_ms == 1500


def test_bad_filters() -> None:
    with pytest.raises(ValueError, match="the predicates are =, !="):
        check_filters([("state", "==", "x")], TaskState)
    with pytest.raises(ValueError, match="node_ip"):
        check_filters([("ip", "=", "x")], NodeState)
