"""rtml.util.state (Ray's ``ray.util.state``) on an embedded 2-CPU node: what a workload
of tasks (one failing, one cancelled), actors (one killed) and a large ``put`` left in
the control plane, read back in Ray's names: each list's fields with their real values,
filters, limits, ``get_*`` of known and unknown ids, and the summaries' counts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pytest

import rtml
from rtml.exceptions import TaskCancelledError, TaskError
from rtml.util import state
from rtml.util.state import ActorState, TaskState

pytestmark = pytest.mark.usefixtures("cluster")

T = TypeVar("T")
BIG_BYTES = 200_000  # > 100 KiB: stored in the node's shared memory, so it has a record


@rtml.remote
def square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@rtml.remote
def fail_on_purpose() -> None:
    raise ValueError("failing on purpose")


@rtml.remote
def nap(seconds: float) -> None:
    time.sleep(seconds)


@rtml.remote
def noop() -> None:
    return None


@rtml.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n

    def my_id(self) -> str | None:
        return rtml.get_runtime_context().get_actor_id()


@dataclass
class Workload:
    started_ms: int
    square_ids: list[str]
    square_pids: list[int]
    failed_id: str
    call_ids: list[str]
    named: Any
    named_id: str
    killed_id: str
    big: rtml.ObjectRef
    job_id: str
    node_id: str
    namespace: str


def eventually(read: Callable[[], T | None], timeout: float = 10.0) -> T:
    """``read()``'s first truthy value, tried until ``timeout`` (records written by
    other processes, e.g. a node's object records each heartbeat, land a little later)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value or time.monotonic() > deadline:
            assert value, f"{read} gave nothing within {timeout} s"
            return value
        time.sleep(0.05)


@pytest.fixture(scope="module")
def work(_module_cluster: None) -> Workload:
    started_ms = int(time.time() * 1000)
    squares = [square.remote(i) for i in range(3)]
    pids = [pid for _, pid in rtml.get(squares, timeout=60)]
    failed = fail_on_purpose.remote()
    with pytest.raises(ValueError):
        rtml.get(failed, timeout=60)
    named = Counter.options(name="state-counter").remote()
    calls = [named.incr.remote(), named.incr.remote()]
    assert rtml.get(calls, timeout=60) == [1, 2]
    doomed = Counter.remote()
    assert rtml.get(doomed.incr.remote(), timeout=60) == 1
    named_id, killed_id = rtml.get([named.my_id.remote(), doomed.my_id.remote()], timeout=60)
    rtml.kill(doomed)
    big = rtml.put(np.zeros(BIG_BYTES, dtype=np.uint8))
    ctx = rtml.get_runtime_context()
    return Workload(
        started_ms=started_ms, square_ids=[r.task_id().hex() for r in squares],
        square_pids=pids, failed_id=failed.task_id().hex(),
        call_ids=[r.task_id().hex() for r in calls], named=named,
        named_id=named_id, killed_id=killed_id, big=big,
        job_id=ctx.get_job_id(), node_id=ctx.get_node_id(), namespace=ctx.namespace)


def by_id(rows: list[TaskState]) -> dict[str, TaskState]:
    return {row.task_id: row for row in rows}


def test_tasks_are_listed_with_their_fields(work: Workload) -> None:
    tasks = by_id(state.list_tasks(detail=True, limit=10_000))
    now_ms = time.time() * 1000
    for task_id, pid in zip(work.square_ids, work.square_pids, strict=True):
        task = tasks[task_id]
        assert (task.name, task.state, task.type) == ("square", "FINISHED", "NORMAL_TASK")
        assert (task.job_id, task.node_id, task.worker_pid) == (work.job_id, work.node_id, pid)
        assert task.func_or_class_name == "square" and task.attempt_number == 0
        assert task.error_type is None and task.error_message is None
        assert task.creation_time_ms is not None and task.start_time_ms is not None
        assert task.end_time_ms is not None
        assert work.started_ms - 1000 <= task.creation_time_ms <= task.start_time_ms
        assert task.start_time_ms <= task.end_time_ms <= now_ms + 1000
        assert task["state"] == task.get("state") == "FINISHED"  # Ray's key access
        assert task.asdict()["worker_pid"] == pid
    failed = tasks[work.failed_id]
    assert (failed.name, failed.state, failed.error_type) == (
        "fail_on_purpose", "FAILED", "TASK_EXECUTION_EXCEPTION")
    for call_id in work.call_ids:
        call = tasks[call_id]
        assert (call.name, call.type, call.state) == ("Counter.incr", "ACTOR_TASK", "FINISHED")


def test_detail_columns_only_with_detail(work: Workload) -> None:
    brief = by_id(state.list_tasks(limit=10_000))[work.square_ids[0]]
    assert brief.state == "FINISHED" and brief.worker_pid == work.square_pids[0]
    assert brief.start_time_ms is None and brief.language is None
    assert "start_time_ms" in TaskState.detail_columns()
    assert "start_time_ms" not in TaskState.list_columns(detail=False)


def test_a_task_that_just_finished_is_listed_finished() -> None:
    ref = noop.remote()
    rtml.get(ref, timeout=60)
    task = state.get_task(ref)  # the driver's own records are written before reading
    assert task is not None and task.state == "FINISHED"
    assert task.end_time_ms is not None  # get_* fills the detail columns


def test_a_cancelled_task_says_so() -> None:
    ref = nap.remote(30)
    time.sleep(0.3)
    rtml.cancel(ref)
    with pytest.raises(TaskCancelledError):
        rtml.get(ref, timeout=60)
    task = state.get_task(ref.task_id().hex())
    assert task is not None
    assert (task.state, task.error_type) == ("FAILED", "TASK_CANCELLED")
    assert task.error_message is not None and "cancelled" in task.error_message


def test_actors_are_listed_with_their_fields(work: Workload) -> None:
    def killed() -> ActorState | None:
        found = state.get_actor(work.killed_id)
        return found if found is not None and found.state == "DEAD" else None

    dead = eventually(killed)
    assert dead.class_name == "Counter" and dead.name == ""
    assert dead.death_cause is not None
    assert "kill" in dead.death_cause["actor_died_error_context"]["error_message"]
    actors = {a.actor_id: a for a in state.list_actors(detail=True)}
    alive = actors[work.named_id]
    assert (alive.class_name, alive.state, alive.name) == ("Counter", "ALIVE", "state-counter")
    assert (alive.job_id, alive.node_id, alive.ray_namespace) == (
        work.job_id, work.node_id, work.namespace)
    assert (alive.num_restarts, alive.is_detached, alive.death_cause) == (0, False, None)
    assert alive.required_resources == {"CPU": 1.0}
    assert state.list_actors()[0].num_restarts is None  # a detail column


def test_a_large_put_is_listed_as_an_object(work: Workload) -> None:
    def listed() -> list[Any]:
        return state.list_objects(filters=[("object_id", "=", work.big.hex())])

    (big,) = eventually(listed)
    assert BIG_BYTES <= big.object_size < BIG_BYTES + 4096
    assert (big.reference_type, big.task_status, big.call_site) == (
        "LOCAL_REFERENCE", "FINISHED", "disabled")
    node_ip = rtml.nodes()[0]["NodeManagerAddress"].rsplit(":", 1)[0]
    assert big.ip == node_ip
    handles = state.list_objects(filters=[("reference_type", "=", "ACTOR_HANDLE")])
    assert handles, "the live actor's handle object is listed as an ACTOR_HANDLE"


def test_nodes_and_jobs(work: Workload) -> None:
    (node,) = state.list_nodes()
    assert (node.node_id, node.state, node.resources_total["CPU"]) == (
        work.node_id, "ALIVE", 2.0)
    assert node.node_ip == rtml.nodes()[0]["NodeManagerAddress"].rsplit(":", 1)[0]
    assert node.start_time_ms is None  # a detail column
    got = state.get_node(work.node_id)
    assert got is not None and got.start_time_ms is not None and got.end_time_ms == 0
    assert state.get_node("ff" * 16) is None
    jobs = {job.job_id: job for job in state.list_jobs()}
    job = jobs[work.job_id]
    assert (job.type, job.status) == ("DRIVER", "RUNNING")
    assert job.driver_info is not None and job.driver_info.pid == str(os.getpid())


def test_filters_equal_and_not_equal(work: Workload) -> None:
    failed = state.list_tasks(filters=[("state", "=", "FAILED"), ("name", "=", "fail_on_purpose")])
    assert [t.task_id for t in failed] == [work.failed_id]
    assert state.list_tasks(filters=[("STATE", "=", "failed"),  # as Ray: case-insensitive
                                     ("name", "=", "FAIL_ON_PURPOSE")]) == failed
    others = state.list_tasks(filters=[("name", "!=", "square")], limit=10_000)
    assert others and all(t.name != "square" for t in others)
    assert not set(work.square_ids) & {t.task_id for t in others}
    pid = work.square_pids[0]
    mine = state.list_tasks(filters=[("worker_pid", "=", str(pid)), ("name", "=", "square")])
    assert {t.task_id for t in mine} == {
        i for i, p in zip(work.square_ids, work.square_pids, strict=True) if p == pid}
    assert [a.actor_id for a in state.list_actors(filters=[("name", "=", "state-counter")])] \
        == [work.named_id]
    assert state.list_nodes(filters=[("state", "!=", "ALIVE")]) == []


def test_bad_filters_say_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"predicate '>'.*=, !="):
        state.list_tasks(filters=[("state", ">", "FAILED")])
    with pytest.raises(ValueError, match=r"'colour' is not supported.*\bstate\b"):
        state.list_tasks(filters=[("colour", "=", "red")])
    with pytest.raises(ValueError, match="not supported"):  # a column, not a filterable one
        state.list_actors(filters=[("death_cause", "=", "x")])
    with pytest.raises(ValueError, match=r"\(key, predicate, value\)"):
        state.list_tasks(filters=[("state", "FAILED")])  # type: ignore[list-item]


def test_limit(work: Workload) -> None:
    rtml.get([noop.remote() for _ in range(110)], timeout=60)
    everything = state.list_tasks(limit=10_000)
    assert len(everything) > 110
    assert len(state.list_tasks()) == 100  # Ray's DEFAULT_LIMIT
    assert state.list_tasks(limit=3) == everything[:3]  # sorted by id, as Ray
    assert [t.task_id for t in everything] == sorted(t.task_id for t in everything)
    assert state.list_tasks(limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        state.list_tasks(limit=-1)


def test_get_known_and_unknown(work: Workload) -> None:
    task = state.get_task(work.failed_id)
    assert task is not None and task.state == "FAILED" and task.end_time_ms is not None
    assert state.get_task(work.failed_id.upper()) == task
    assert state.get_task("00" * 16) is None
    actor = state.get_actor(work.named_id)
    assert actor is not None and actor.name == "state-counter"
    assert actor.required_resources is not None  # get_* fills the detail columns
    assert state.get_actor("00" * 16) is None


def test_summaries_count_by_name_and_state(work: Workload) -> None:
    tasks = state.summarize_tasks()["cluster"]
    assert tasks["summary"]["square"] == {
        "func_or_class_name": "square", "type": "NORMAL_TASK", "state_counts": {"FINISHED": 3}}
    assert tasks["summary"]["fail_on_purpose"]["state_counts"] == {"FAILED": 1}
    assert tasks["summary"]["Counter.incr"]["type"] == "ACTOR_TASK"
    assert tasks["summary"]["Counter.incr"]["state_counts"] == {"FINISHED": 3}
    listed = state.list_tasks(limit=10_000)
    assert tasks["total_tasks"] == sum(t.type == "NORMAL_TASK" for t in listed)
    assert tasks["total_actor_tasks"] == sum(t.type == "ACTOR_TASK" for t in listed) == 5
    assert tasks["summary_by"] == "func_name"

    actors = state.summarize_actors()["cluster"]
    assert actors["summary"]["Counter"] == {
        "class_name": "Counter", "state_counts": {"ALIVE": 1, "DEAD": 1}}
    assert actors["total_actors"] == 2

    objects = state.summarize_objects()["cluster"]
    assert objects["total_objects"] == len(state.list_objects(limit=10_000)) >= 1
    group = objects["summary"]["disabled"]
    assert group["total_size_mb"] >= BIG_BYTES / (1 << 20)
    assert (group["total_num_nodes"], objects["callsite_enabled"]) == (1, False)


def test_state_objects_are_ray_dataclasses() -> None:
    node = state.list_nodes()[0]
    assert node.asdict()["state"] == node["state"] == "ALIVE"
    with pytest.raises(KeyError):
        node["no_such_column"]
    assert "node_ip" in type(node).filterable_columns()


def test_the_name_option_names_the_task() -> None:
    ref = fail_on_purpose.options(name="named-failure").remote()
    with pytest.raises(TaskError):
        rtml.get(ref, timeout=60)
    task = state.get_task(ref)
    assert task is not None
    assert (task.name, task.func_or_class_name) == ("named-failure", "named-failure")
    assert task.error_type == "TASK_EXECUTION_EXCEPTION"
