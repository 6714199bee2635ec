"""Ray's names beyond the core calls (issue 19): ObjectRef's ids, the runtime context of
tasks and actors, what ``init`` returns, named actors listed, the node's address."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import typing

import pytest

import rtml
from rtml.actor import exit_actor
from rtml.util import get_node_ip_address, list_named_actors

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote
def task_context() -> dict[str, object]:
    c = rtml.get_runtime_context()
    return {"name": c.get_task_name(), "function": c.get_task_function_name(),
            "resources": c.get_assigned_resources(), "task_id": c.get_task_id(),
            "canceled": c.is_canceled(), "gpus": rtml.get_gpu_ids(),
            "job_id": c.get_job_id(), "node_id": c.node_id.hex()}


@rtml.remote(max_restarts=1)
class Probe:
    def __init__(self) -> None:
        self.rebuilt = rtml.get_runtime_context().was_current_actor_reconstructed

    def context(self) -> tuple[bool, str | None, dict[str, float], str | None]:
        c = rtml.get_runtime_context()
        return (self.rebuilt, c.get_task_function_name(), c.get_assigned_resources(),
                c.get_actor_id())

    def me(self) -> rtml.ActorHandle:
        return rtml.get_runtime_context().current_actor

    def names(self) -> list[str]:
        return list_named_actors()

    def die(self) -> None:
        os._exit(1)


def test_object_ref_ids_name_its_task_and_job() -> None:
    ref = rtml.put(41)
    job = rtml.get_runtime_context().get_job_id()
    assert ref.binary() == ref.id and len(ref.binary()) == 20
    assert ref.job_id().hex() == job
    result = task_context.remote()
    assert result.task_id().hex() == rtml.get(result)["task_id"]
    assert result.job_id().hex() == job == rtml.get(result)["job_id"]
    same = rtml.ObjectRef(ref.binary())
    assert same == ref and hash(same) == hash(ref) and rtml.get(same) == 41


def test_object_ref_as_future_and_annotations() -> None:
    async def read() -> int:
        return await rtml.put(7).as_future()

    assert asyncio.run(read()) == 7
    alias = rtml.ObjectRef[int]

    def typed(x: rtml.ObjectRef[int]) -> rtml.ObjectRef[int]:
        return x

    assert alias.__origin__ is rtml.ObjectRef and alias.__args__ == (int,)
    assert typing.get_type_hints(typed)["x"] == alias  # the annotation evaluates


def test_a_task_sees_its_name_function_and_resources() -> None:
    got = rtml.get(task_context.remote())
    assert got["name"] == "task_context"
    assert got["function"] == f"{__name__}.task_context"
    assert got["resources"] == {"CPU": 1.0}
    assert got["canceled"] is False and got["gpus"] == []
    assert got["node_id"] == rtml.get_runtime_context().get_node_id()
    half = rtml.get(task_context.options(num_cpus=0.5, name="half").remote())
    assert half["name"] == "half" and half["resources"] == {"CPU": 0.5}


def test_a_driver_has_no_task() -> None:
    c = rtml.get_runtime_context()
    assert c.get_task_name() is None and c.get_task_function_name() is None
    assert c.get_assigned_resources() == {} and rtml.get_gpu_ids() == []
    with pytest.raises(RuntimeError, match="inside an actor"):
        c.current_actor  # noqa: B018
    with pytest.raises(RuntimeError, match="inside a task"):
        c.is_canceled()
    assert c.was_current_actor_reconstructed is False


def test_an_actor_sees_itself_and_its_restart() -> None:
    probe = Probe.remote()
    rebuilt, function, resources, actor_id = rtml.get(probe.context.remote())
    assert (rebuilt, function, resources) == (False, f"{__name__}.Probe.context", {})
    assert actor_id == probe._actor_id.hex()
    assert rtml.get(probe.me.remote()) == probe
    probe.die.remote()
    deadline = time.monotonic() + 30
    while True:  # the call that finds the restarted actor
        try:
            rebuilt, *_ = rtml.get(probe.context.remote(), timeout=30)
            break
        except rtml.exceptions.ActorDiedError:
            assert time.monotonic() < deadline
    assert rebuilt is True


def test_init_returns_a_mapping_of_the_cluster(start_cluster) -> None:  # noqa: ANN001
    ctx = start_cluster(num_cpus=1)
    assert ctx["node_id"] == rtml.get_runtime_context().get_node_id()
    assert ctx["address"] == ctx.address_info["address"] and ":" in ctx["address"]
    assert ctx["node_ip_address"] == get_node_ip_address() == "127.0.0.1"
    assert {"address", "node_id", "session_dir"} <= set(ctx)
    with pytest.raises(KeyError):
        ctx["dashboard"]


def test_named_actors_are_listed_by_namespace(start_cluster) -> None:  # noqa: ANN001
    start_cluster(num_cpus=2, namespace="ours")
    named = Probe.options(name="first").remote()
    kept = Probe.options(name="elsewhere", namespace="theirs").remote()  # noqa: F841
    anonymous = Probe.remote()
    assert list_named_actors() == ["first"]
    assert list_named_actors(all_namespaces=True) == [
        {"name": "first", "namespace": "ours"}, {"name": "elsewhere", "namespace": "theirs"}]
    assert rtml.get(anonymous.names.remote()) == ["first"]  # an actor: its job's namespace
    rtml.kill(named)
    assert list_named_actors() == []


@rtml.remote(max_restarts=3, max_task_retries=1)
class Leaver:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def ping(self) -> int:
        return os.getpid()

    def leave(self) -> None:
        import atexit

        atexit.register(lambda: open(self.marker, "w").write("ran"))
        exit_actor()


@rtml.remote
class AsyncLeaver:
    async def ping(self) -> int:
        return os.getpid()

    async def leave(self) -> None:
        exit_actor()


def test_exit_actor_ends_it_for_good_and_runs_its_atexit_handlers(tmp_path) -> None:  # noqa: ANN001
    marker = tmp_path / "atexit"
    actor = Leaver.options(name="leaver").remote(str(marker))
    pid = rtml.get(actor.ping.remote())
    with pytest.raises(rtml.exceptions.ActorDiedError):
        rtml.get(actor.leave.remote(), timeout=30)  # retried once: it finds the actor DEAD
    with pytest.raises(rtml.exceptions.ActorDiedError, match="exit_actor"):
        rtml.get(actor.ping.remote(), timeout=30)  # not restarted, despite max_restarts
    assert marker.read_text() == "ran"
    assert "leaver" not in list_named_actors()
    deadline = time.monotonic() + 10  # (its atexit handlers ran; it may still be exiting)
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)
    with pytest.raises(TypeError, match="inside an actor"):
        exit_actor()


def test_ray_terminate_and_async_exit() -> None:
    queued = Leaver.remote("/nonexistent/unused")
    assert rtml.get(queued.ping.remote()) > 0
    queued.__ray_terminate__.remote()
    with pytest.raises(rtml.exceptions.ActorDiedError):
        rtml.get(queued.ping.remote(), timeout=30)
    loop_actor = AsyncLeaver.remote()
    assert rtml.get(loop_actor.ping.remote()) > 0
    loop_actor.leave.remote()
    with pytest.raises(rtml.exceptions.ActorDiedError):
        rtml.get(loop_actor.ping.remote(), timeout=30)


@rtml.remote
class WithConstants:
    LIMIT = 3

    @staticmethod
    def double(x: int) -> int:
        return 2 * x

    def method(self) -> int:
        return self.LIMIT


def test_class_attributes_read_through_the_actor_class() -> None:
    assert WithConstants.LIMIT == 3 and WithConstants.double(4) == 8
    with pytest.raises(AttributeError, match="call it on a handle"):
        WithConstants.method  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        WithConstants.missing  # noqa: B018
    assert rtml.get(WithConstants.remote().method.remote()) == 3


def test_tqdm_ray_draws_a_tasks_bar_in_the_driver() -> None:
    script = textwrap.dedent("""
        import rtml
        from rtml.experimental import tqdm_ray
        @rtml.remote
        def work():
            for _ in tqdm_ray.tqdm(range(30), desc="remote bar", flush_interval_s=0):
                pass
            print("task done")
        rtml.get(work.remote())
        rtml.shutdown()
    """)
    env = {k: v for k, v in os.environ.items() if k != "RTML_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "task done" in done.stdout and "__rtml_tqdm__" not in done.stdout
    assert "remote bar: 100%" in done.stderr and "30/30" in done.stderr


@rtml.remote
def make_named(name: str) -> int:
    actor = Probe.options(name=name).remote()  # no handle kept: its lifetime decides
    return len(rtml.get(actor.names.remote()))


@rtml.remote
def import_from_search_path() -> int:
    import rtml_search_path_probe  # type: ignore[import-not-found]

    return int(rtml_search_path_probe.VALUE)


def test_a_job_config_sets_lifetime_namespace_and_search_path(
        start_cluster, tmp_path) -> None:  # noqa: ANN001
    from rtml.job_config import JobConfig

    (tmp_path / "rtml_search_path_probe.py").write_text("VALUE = 42\n")
    config = JobConfig(default_actor_lifetime="detached", ray_namespace="configured",
                       code_search_path=[str(tmp_path)], metadata={"team": "infra"})
    start_cluster(num_cpus=2, job_config=config)
    assert rtml.get_runtime_context().namespace == "configured"
    dropped = Probe.options(name="by-driver").remote()
    del dropped
    assert rtml.get(make_named.remote("by-task")) >= 1  # a worker asks the head, once
    time.sleep(0.5)
    assert set(list_named_actors()) >= {"by-driver", "by-task"}  # detached: they live on
    assert rtml.get(import_from_search_path.remote()) == 42
    with pytest.raises(ValueError, match="default_actor_lifetime"):
        JobConfig(default_actor_lifetime="forever")
    with pytest.raises(ValueError, match="Java"):
        JobConfig(jvm_options=["-Xmx1g"])
    with pytest.raises(TypeError, match="JobConfig"):
        rtml.init(job_config={"default_actor_lifetime": "detached"})  # type: ignore[arg-type]


@rtml.remote(max_restarts=1)
class Restartable:
    def pid(self) -> int:
        return os.getpid()

    def crash(self) -> None:
        os._exit(1)


def test_a_call_lost_to_a_restart_is_unavailable_not_dead() -> None:
    actor = Restartable.remote()
    before = rtml.get(actor.pid.remote())
    with pytest.raises(rtml.exceptions.ActorUnavailableError, match="restarted"):
        rtml.get(actor.crash.remote(), timeout=30)
    assert rtml.get(actor.pid.remote(), timeout=30) != before  # the restarted actor
    with pytest.raises(rtml.exceptions.ActorDiedError) as died:  # no restart left
        rtml.get(actor.crash.remote(), timeout=30)
    assert not isinstance(died.value, rtml.exceptions.ActorUnavailableError)
