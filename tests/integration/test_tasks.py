"""Tasks on an embedded 2-CPU node: submission, options, arguments, nesting, cancel."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest

import rtml
from rtml.core import current
from rtml.core.remote_function import RemoteFunction
from rtml.core.runtime import ClientRuntime
from rtml.exceptions import GetTimeoutError, TaskCancelledError, TaskError

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote
def add(a: int, b: int = 0) -> int:
    return a + b


@rtml.remote
def timed_sleep(seconds: float) -> tuple[float, float]:
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


@rtml.remote
def describe(x: object) -> tuple[str, object]:
    return type(x).__name__, x


@rtml.remote
def resolve_nested(items: list) -> tuple[list[bool], list[int]]:
    return [isinstance(i, rtml.ObjectRef) for i in items], rtml.get(list(items))


@rtml.remote
def sum_of_squares(n: int) -> int:
    return sum(rtml.get([square.remote(i) for i in range(n)]))


@rtml.remote
def square(x: int) -> int:
    return x * x


@rtml.remote
def fib(n: int) -> int:
    if n < 2:
        return n
    return sum(rtml.get([fib.remote(n - 1), fib.remote(n - 2)]))


@rtml.remote
def sleep_forever(marker: str) -> str:
    open(marker, "w").close()
    time.sleep(60)
    return "not cancelled"


@rtml.remote
def three_values() -> tuple[int, str, list[int]]:
    return 1, "two", [3]


@rtml.remote
def frozen_objects() -> tuple[int, int]:
    import gc
    return gc.get_freeze_count(), os.getpid()


@rtml.remote
def context_ids() -> tuple[str | None, str | None, str]:
    ctx = rtml.get_runtime_context()
    return ctx.get_task_id(), ctx.get_actor_id(), ctx.get_node_id()


@rtml.remote
def echo_ref_list(refs: list) -> list:
    return refs


@rtml.remote
def job_ids(depth: int) -> list[str]:
    """This task's job id, then its nested task's, down to ``depth``."""
    mine = rtml.get_runtime_context().get_job_id()
    return [mine] + (rtml.get(job_ids.remote(depth - 1)) if depth else [])


@rtml.remote
class JobReporter:
    def job(self) -> str:
        return rtml.get_runtime_context().get_job_id()

    def nested_job(self) -> list[str]:
        return rtml.get(job_ids.remote(0))


def _wait_for_file(path: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"task never started ({path} missing)"
        time.sleep(0.05)


# -- basics -------------------------------------------------------------------------------------

def test_remote_returns_object_ref_at_once_and_get_gives_value() -> None:
    ref = add.remote(1, 2)
    assert isinstance(ref, rtml.ObjectRef)
    assert rtml.get(ref) == 3
    assert rtml.get(add.remote(1, b=5)) == 6


def test_get_list_preserves_order() -> None:
    refs = [add.remote(i, 100) for i in range(10)]
    assert rtml.get(refs) == [i + 100 for i in range(10)]


def test_is_initialized_and_cluster_resources() -> None:
    assert rtml.is_initialized()
    total = rtml.cluster_resources()
    assert total["CPU"] == 2.0
    assert total.get("GPU", 0.0) == 0.0
    assert any(k.startswith("node:") for k in total)
    avail = rtml.available_resources()
    assert avail.get("CPU", 0.0) <= 2.0
    assert all(amount > 0 for amount in avail.values())  # none free: left out, as in Ray


@rtml.remote(num_cpus=2)
def hold_both_cpus(seconds: float) -> None:
    time.sleep(seconds)


def test_available_resources_leaves_out_what_is_all_taken() -> None:
    busy = hold_both_cpus.remote(2.0)
    deadline = time.monotonic() + 10
    while "CPU" in rtml.available_resources() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "CPU" not in rtml.available_resources()
    assert rtml.cluster_resources()["CPU"] == 2.0
    rtml.get(busy)


MB = 1024 * 1024


def store_free() -> float:
    return rtml.available_resources().get("object_store_memory", 0.0)


def settle_store_free(predicate) -> float:
    deadline = time.monotonic() + 10
    while not predicate(free := store_free()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return free


def test_available_resources_count_object_store_use() -> None:
    total = rtml.cluster_resources()["object_store_memory"]
    before = settle_store_free(lambda free: free > total - 8 * MB)
    held = rtml.put(np.zeros(32 * MB, dtype=np.uint8))
    during = settle_store_free(lambda free: free <= before - 32 * MB)
    assert before - 33 * MB <= during <= before - 32 * MB
    del held  # freed: the bytes come back
    assert settle_store_free(lambda free: free >= before) >= before


def test_nodes_table_matches_runtime_context() -> None:
    (node,) = rtml.nodes()
    assert node["Alive"] is True
    assert node["Resources"]["CPU"] == 2.0
    assert "NodeManagerAddress" in node
    assert node["NodeID"] == rtml.get_runtime_context().get_node_id()


def test_workers_start_with_the_imported_code_frozen_out_of_the_collector() -> None:
    frozen, pid = rtml.get(frozen_objects.remote())
    assert pid != os.getpid()
    assert frozen > 10_000  # the zygote froze what rtml's imports made before it forked


def test_tasks_nested_tasks_and_actors_report_the_driver_s_job() -> None:
    driver_job = rtml.get_runtime_context().get_job_id()
    assert len(driver_job) == 8  # a 4-byte job id, in hex
    assert rtml.get(job_ids.remote(2), timeout=60) == [driver_job] * 3
    reporter = JobReporter.remote()
    assert rtml.get(reporter.job.remote(), timeout=60) == driver_job
    assert rtml.get(reporter.nested_job.remote(), timeout=60) == [driver_job]
    rtml.kill(reporter)


def test_runtime_context_inside_task() -> None:
    task_id, actor_id, node_id = rtml.get(context_ids.remote())
    assert task_id is not None and isinstance(task_id, str)
    assert actor_id is None
    assert node_id == rtml.get_runtime_context().get_node_id()
    assert rtml.get_runtime_context().get_actor_id() is None


# -- options ------------------------------------------------------------------------------------

def test_options_num_returns() -> None:
    refs = three_values.options(num_returns=3).remote()
    assert isinstance(refs, list) and len(refs) == 3
    assert all(isinstance(r, rtml.ObjectRef) for r in refs)
    assert rtml.get(refs) == [1, "two", [3]]
    assert rtml.get(refs[1]) == "two"


def test_options_resources_and_cpus() -> None:
    node_res = next(k for k in rtml.cluster_resources() if k.startswith("node:"))
    ref = add.options(num_cpus=0.5, num_gpus=0, resources={node_res: 0.01},
                      max_retries=0, retry_exceptions=False, name="custom_add").remote(2, 3)
    assert rtml.get(ref, timeout=30) == 5
    assert rtml.get(add.options(num_cpus=0).remote(1, 1), timeout=30) == 2
    assert rtml.get(add.options(num_cpus=2).remote(2, 2), timeout=30) == 4


def test_decorator_with_options() -> None:
    @rtml.remote(num_cpus=1, max_retries=1, name="decorated")
    def mul(a: int, b: int) -> int:
        return a * b

    assert rtml.get(mul.remote(6, 7)) == 42
    assert rtml.get(mul.options(num_cpus=0.5).remote(2, 3)) == 6


def test_options_name_appears_in_task_error() -> None:
    @rtml.remote
    def fail() -> None:
        raise RuntimeError("named failure")

    with pytest.raises(TaskError) as info:
        rtml.get(fail.options(name="my_special_task_name", max_retries=0).remote())
    assert "my_special_task_name" in str(info.value)


def test_infeasible_request_stays_pending_then_cancel() -> None:
    ref = add.options(resources={"no_such_resource": 1}).remote(1, 1)
    ready, not_ready = rtml.wait([ref], timeout=1.0)
    assert ready == [] and not_ready == [ref]
    rtml.cancel(ref)
    with pytest.raises(TaskCancelledError):
        rtml.get(ref, timeout=10)


def test_two_cpu_node_runs_at_most_two_one_cpu_tasks_at_once() -> None:
    spans = rtml.get([timed_sleep.remote(0.5) for _ in range(6)], timeout=60)
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak <= 2, f"{peak} one-CPU tasks overlapped on a 2-CPU node: {spans}"
    assert peak == 2, f"tasks never ran in parallel: {spans}"


# -- arguments ----------------------------------------------------------------------------------

def test_top_level_ref_args_are_resolved() -> None:
    ref = rtml.put(41)
    assert rtml.get(add.remote(ref, 1)) == 42
    assert rtml.get(add.remote(1, b=ref)) == 42  # keyword arguments too
    assert rtml.get(describe.remote(add.remote(1, 2))) == ("int", 3)


def test_nested_refs_are_passed_as_refs() -> None:
    inner = [rtml.put(1), add.remote(1, 1)]
    is_ref, values = rtml.get(resolve_nested.remote(inner))
    assert is_ref == [True, True]
    assert values == [1, 2]


def test_refs_compare_equal_after_travelling_through_a_task() -> None:
    refs = [rtml.put(i) for i in range(3)]
    back = rtml.get(echo_ref_list.remote(refs))
    assert back == refs
    assert {hash(r) for r in back} == {hash(r) for r in refs}
    assert [r.hex() for r in back] == [r.hex() for r in refs]
    assert rtml.get(back) == [0, 1, 2]


def test_object_ref_is_hashable_picklable_and_has_hex() -> None:
    ref = rtml.put("value")
    assert isinstance(ref.hex(), str) and ref.hex()
    same = pickle.loads(pickle.dumps(ref))
    assert same == ref and hash(same) == hash(ref)
    assert rtml.get(same) == "value"
    assert {ref: 1}[same] == 1


def test_object_ref_future_and_await() -> None:
    fut = add.remote(20, 22).future()
    assert isinstance(fut, concurrent.futures.Future)
    assert fut.result(timeout=30) == 42

    async def main() -> int:
        return await add.remote(1, 2)

    assert asyncio.run(main()) == 3


# -- nesting ------------------------------------------------------------------------------------

def test_task_submits_tasks_and_gets_results() -> None:
    assert rtml.get(sum_of_squares.remote(5), timeout=60) == 0 + 1 + 4 + 9 + 16


def test_a_remote_function_used_here_can_be_shipped_inside_another() -> None:
    # ``outer`` is pickled by value with ``inner`` in it, after ``inner`` ran from here:
    # what ``inner`` keeps about this process (its runtime) must not travel with it.
    @rtml.remote
    def inner(x: int) -> int:
        return x + 1

    assert rtml.get(inner.remote(1), timeout=60) == 2

    @rtml.remote
    def outer(x: int) -> int:
        return rtml.get(inner.remote(x)) * 10

    assert rtml.get(outer.remote(2), timeout=60) == 30


def test_recursive_fib_on_two_cpus_does_not_deadlock() -> None:
    assert rtml.get(fib.remote(6), timeout=90) == 8


# -- cancel -------------------------------------------------------------------------------------

def test_cancel_running_sleep_task(tmp_path) -> None:
    marker = str(tmp_path / "started")
    ref = sleep_forever.options(max_retries=3).remote(marker)
    _wait_for_file(marker)
    t0 = time.monotonic()
    rtml.cancel(ref)
    with pytest.raises(TaskCancelledError):
        rtml.get(ref, timeout=20)
    assert time.monotonic() - t0 < 10
    # the node still works afterwards
    assert rtml.get(add.remote(1, 1), timeout=30) == 2


@rtml.remote
def sleep_until(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


@rtml.remote
def waits_on_sleeper(marker: str, release: str) -> None:
    inner = sleep_until.remote(release)
    open(marker, "w").close()
    rtml.get(inner)


def test_cancel_reaches_a_task_blocked_in_get(tmp_path) -> None:
    # While it waits, the task's own thread runs the I/O loop: the cancellation must
    # still end the wait, not be raised (and lost) inside a message handler, which
    # would leave the task blocked until its inner task ends.
    marker, release = str(tmp_path / "started"), str(tmp_path / "release")
    ref = waits_on_sleeper.options(max_retries=0).remote(marker, release)
    try:
        _wait_for_file(marker)
        rtml.cancel(ref, recursive=False)
        with pytest.raises(TaskCancelledError):
            rtml.get(ref, timeout=10)
    finally:
        open(release, "w").close()  # ends the inner task (cancel is not recursive)


@rtml.remote
def notes_its_cancellation(started: str, cancelled: str) -> None:
    open(started, "w").close()
    try:
        while True:
            time.sleep(0.01)
    except TaskCancelledError:
        open(cancelled, "w").close()
        raise


@rtml.remote
def waits_on_child(levels: int, started: str, cancelled: str) -> None:
    if levels == 1:
        rtml.get(notes_its_cancellation.remote(started, cancelled))
    else:
        rtml.get(waits_on_child.remote(levels - 1, started, cancelled))


@pytest.mark.parametrize("levels", [1, 2])
def test_recursive_cancel_reaches_the_tasks_a_task_submitted(tmp_path, levels) -> None:
    # levels=2: a grandchild, owned by the child's worker, is cancelled through it.
    started, cancelled = str(tmp_path / "started"), str(tmp_path / "cancelled")
    ref = waits_on_child.options(max_retries=0).remote(levels, started, cancelled)
    _wait_for_file(started)
    rtml.cancel(ref)  # recursive by default, as in Ray
    with pytest.raises(TaskCancelledError):
        rtml.get(ref, timeout=10)
    _wait_for_file(cancelled, timeout=10)


def test_negative_timeouts_are_refused_clearly() -> None:
    ref = add.remote(1, 1)
    with pytest.raises(ValueError, match="timeout must be None"):
        rtml.get(ref, timeout=-1)
    with pytest.raises(ValueError, match="timeout must be None"):
        rtml.wait([ref], timeout=-0.5)
    assert rtml.get(ref, timeout=30) == 2


def test_a_short_task_does_not_queue_behind_a_long_one(tmp_path) -> None:
    rtml.get([timed_sleep.remote(0) for _ in range(50)])  # timed: a short function
    marker = str(tmp_path / "started")
    slow = sleep_forever.options(max_retries=0).remote(marker)  # untimed: runs alone
    _wait_for_file(marker)
    # The other CPU is free: the short task must run there, not wait behind the long one.
    start, end = rtml.get(timed_sleep.remote(0), timeout=20)
    assert end - start < 5
    rtml.cancel(slow, force=True)


def test_a_run_cut_short_by_cancel_does_not_make_a_function_look_short(tmp_path) -> None:
    # Cancelled a few ms after it started, sleep_forever must still count as untimed
    # (run alone): a recorded run time of a few ms would let short tasks queue behind it.
    first = str(tmp_path / "first")
    ref = sleep_forever.options(max_retries=0).remote(first)
    while not os.path.exists(first):
        time.sleep(0.001)
    rtml.cancel(ref)
    with pytest.raises(TaskCancelledError):
        rtml.get(ref, timeout=20)
    rtml.get([timed_sleep.remote(0) for _ in range(50)])
    second = str(tmp_path / "second")
    slow = sleep_forever.options(max_retries=0).remote(second)
    try:
        _wait_for_file(second)
        start, end = rtml.get(timed_sleep.remote(0), timeout=20)
        assert end - start < 5
    finally:
        rtml.cancel(slow, force=True)


def test_force_cancel_running_task(tmp_path) -> None:
    marker = str(tmp_path / "started")
    ref = sleep_forever.remote(marker)
    _wait_for_file(marker)
    rtml.cancel(ref, force=True)
    with pytest.raises(TaskCancelledError):
        rtml.get(ref, timeout=20)
    assert rtml.get(add.remote(2, 2), timeout=30) == 4


def test_get_timeout_on_slow_task() -> None:
    ref = timed_sleep.remote(2.0)
    t0 = time.monotonic()
    with pytest.raises(GetTimeoutError):
        rtml.get(ref, timeout=0.2)
    assert time.monotonic() - t0 < 1.5
    start, end = rtml.get(ref, timeout=30)
    assert end - start >= 2.0


# -- timeline -----------------------------------------------------------------------------------

def test_timeline_has_chrome_trace_events(tmp_path) -> None:
    rtml.get(add.options(name="traced_add").remote(1, 2))
    path = tmp_path / "trace.json"
    events = rtml.timeline(str(path))
    assert isinstance(events, list) and events
    slices = [e for e in events if e["ph"] == "X"]
    for event in slices:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(event)
    for event in events:  # the rest name the lanes (nodes, workers, owners)
        assert event["ph"] == "X" or event["name"] in ("process_name", "thread_name")
    (task,) = [e for e in slices if e["name"] == "traced_add"]
    phases = {e["name"]: e for e in slices if e["cat"] == "phase" and e["tid"] == task["tid"]
              and task["ts"] <= e["ts"] <= task["ts"] + task["dur"]}
    assert {"fetch arguments", "run", "store result"} <= set(phases)
    assert phases["fetch arguments"]["ts"] == task["ts"]
    assert phases["run"]["ts"] + phases["run"]["dur"] <= task["ts"] + task["dur"] + 1
    assert any(e["name"] == "queued: traced_add" for e in slices)
    import json
    assert json.loads(path.read_text()) == events


def test_timed_out_gets_leave_no_waiters_behind(tmp_path) -> None:
    from rtml.core import current

    marker, release = str(tmp_path / "started"), str(tmp_path / "release")
    ref = waits_on_sleeper.options(max_retries=0).remote(marker, release)
    try:
        for _ in range(50):  # a polling loop
            with pytest.raises(GetTimeoutError):
                rtml.get(ref, timeout=0.001)
        store = current.require_runtime().store
        assert store._waiters.get(ref.id, []) == []
    finally:
        open(release, "w").close()
    assert rtml.get(ref, timeout=30) is None


def test_arguments_of_other_numeric_types_are_taken_as_python_ones(cluster: None) -> None:
    # The runtime is compiled and checks its argument types: api converts what users pass.
    ref = square.remote(3)
    assert rtml.get(ref, timeout=np.int64(30)) == 9
    assert rtml.get(ref, timeout=np.float32(30.0)) == 9
    assert rtml.wait([ref], fetch_local=1, timeout=np.int64(30)) == ([ref], [])
    rtml.cancel(ref, force=0, recursive=None)  # finished: nothing to cancel
    assert rtml.get(ref) == 9


def test_a_name_that_is_not_a_str_is_refused(cluster: None) -> None:
    with pytest.raises(TypeError, match="name must be a str, got b'x'"):
        square.options(name=b"x")


def test_an_object_ref_built_with_bad_arguments_raises_and_does_not_crash() -> None:
    script = ("import rtml\n"
              "try:\n"
              "    rtml.ObjectRef(b'x' * 20, b'', b'extra')\n"
              "except TypeError as exc:\n"
              "    print('TypeError', 'argument' in str(exc))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["TypeError", "True"]


def _function_key(fn: RemoteFunction) -> tuple[ClientRuntime, str]:
    """The runtime and the Redis key of ``fn``, exported now (without running it)."""
    rt = current.require_runtime()
    function_id = fn._export(rt)
    return rt, rt.plane.keys.function(function_id.hex())


def test_a_function_redis_lacks_is_sent_by_its_owner_to_the_workers_that_ask() -> None:
    @rtml.remote
    def triple(x: int) -> int:
        return 3 * x

    rt, key = _function_key(triple)
    assert rt.plane._client.execute("DEL", key) == 1  # as if the export still waited
    assert rtml.get([triple.remote(i) for i in range(40)], timeout=60) == [
        3 * i for i in range(40)]
    assert rt.plane._client.execute("GET", key) is None


def test_code_planted_under_a_functions_id_is_not_run() -> None:
    import cloudpickle

    @rtml.remote
    def honest() -> str:
        return "honest"

    rt, key = _function_key(honest)
    planted = cloudpickle.dumps(lambda: "planted")
    rt.plane._client.execute("SET", key, planted)
    assert rtml.get([honest.remote() for _ in range(8)], timeout=60) == ["honest"] * 8


def test_get_and_wait_show_a_progress_bar_of_the_refs_ready(capsys) -> None:
    refs = [add.remote(i, 1) for i in range(20)]
    assert rtml.get(refs, progress="adding") == list(range(1, 21))
    err = capsys.readouterr().err
    assert "adding" in err and "20/20" in err
    slow = timed_sleep.remote(0.5)
    one, two = rtml.put(1), rtml.put(2)
    ready, rest = rtml.wait([slow, one, two], num_returns=2, progress=True)
    assert ready == [one, two] and rest == [slow]
    err = capsys.readouterr().err
    assert "wait" in err and "2/3" in err  # the slow one was not ready when it returned
    assert rtml.get(slow, progress=False)[1] > 0
    assert capsys.readouterr().err == ""  # no bar asked for, none drawn
    with pytest.raises(TypeError, match="progress= takes True"):
        rtml.get(refs, progress=3)  # type: ignore[arg-type]
