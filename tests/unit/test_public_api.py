"""The public surface of ``rtml`` matches API.md (no processes started)."""

from __future__ import annotations

import pickle

import pytest

import rtml
import rtml.exceptions as exc

# Every top-level name in API.md, plus ``method`` (Ray's ``ray.method`` decorator, which a
# plain Ray-core program may use; API.md: "behave as Ray 2.x does where this page is silent").
EXPECTED_ALL = {
    "init", "shutdown", "is_initialized", "nodes", "cluster_resources", "available_resources",
    "get_runtime_context", "timeline", "remote", "get", "put", "wait", "cancel", "kill",
    "get_actor", "get_gpu_ids", "ObjectRef", "ObjectRefGenerator", "ActorHandle",
    "NodeAffinitySchedulingStrategy",
    "exceptions", "method",
}

API_MD_CALLS = [
    "init", "shutdown", "is_initialized", "nodes", "cluster_resources", "available_resources",
    "get_runtime_context", "timeline", "remote", "get", "put", "wait", "cancel", "kill",
    "get_actor", "get_gpu_ids",
]

ERROR_NAMES = [
    "RtmlError", "TaskError", "ActorDiedError", "ActorError", "WorkerCrashedError",
    "NodeDiedError", "ObjectLostError", "GetTimeoutError", "TaskCancelledError",
    "RtmlSystemError",
]


def test_all_is_exactly_the_documented_surface() -> None:
    assert set(rtml.__all__) == EXPECTED_ALL
    assert len(rtml.__all__) == len(set(rtml.__all__)), "duplicates in rtml.__all__"


def test_every_all_name_exists() -> None:
    for name in rtml.__all__:
        assert hasattr(rtml, name), name


@pytest.mark.parametrize("name", API_MD_CALLS)
def test_api_md_calls_exist_and_are_callable(name: str) -> None:
    assert callable(getattr(rtml, name))


def test_api_md_classes_are_importable_from_top_level() -> None:
    from rtml import ActorHandle, NodeAffinitySchedulingStrategy, ObjectRef  # noqa: F401
    assert isinstance(ObjectRef, type)
    assert isinstance(ActorHandle, type)
    strategy = NodeAffinitySchedulingStrategy(node_id="ab" * 16, soft=True)
    assert strategy.node_id == "ab" * 16 and strategy.soft is True


def test_exceptions_module_is_exported() -> None:
    assert rtml.exceptions is exc


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_error_classes_exist_and_derive_from_rtml_error(name: str) -> None:
    cls = getattr(exc, name)
    assert isinstance(cls, type)
    assert issubclass(cls, exc.RtmlError)
    assert issubclass(cls, Exception)


def test_actor_error_is_an_alias_of_actor_died_error() -> None:
    assert exc.ActorError is exc.ActorDiedError


def test_get_timeout_error_is_a_timeout_error() -> None:
    assert issubclass(exc.GetTimeoutError, TimeoutError)
    with pytest.raises(TimeoutError):
        raise exc.GetTimeoutError("timed out")


@pytest.mark.parametrize("name", [n for n in ERROR_NAMES if n != "TaskError"])
def test_simple_errors_pickle(name: str) -> None:
    cls = getattr(exc, name)
    err = cls("something went wrong")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert "something went wrong" in str(back)


def test_task_error_pickles_and_is_instance_of_cause() -> None:
    cause = ValueError("bad value 42")
    err = exc.TaskError("my_task", "Traceback (most recent call last):\n  boom\n", cause,
                        pid=1234, node_id="ab" * 16).as_instanceof_cause()
    assert isinstance(err, exc.TaskError) and isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, exc.TaskError) and isinstance(back, ValueError)
    assert isinstance(back.cause, ValueError) and str(back.cause) == "bad value 42"
    assert "my_task" in str(back) and "boom" in str(back)


def test_remote_function_direct_call_is_type_error_without_a_cluster() -> None:
    @rtml.remote
    def f(x: int) -> int:
        return x

    with pytest.raises(TypeError, match=r"\.remote\("):
        f(1)


def test_not_initialized_by_default_in_unit_tests() -> None:
    assert rtml.is_initialized() is False


def test_a_failed_connect_reports_its_own_error_and_leaves_nothing_running(tmp_path) -> None:
    import threading

    import pytest

    from rtml.core.runtime import ClientConfig, ClientRuntime
    from rtml.exceptions import RtmlSystemError

    before = set(threading.enumerate())
    with pytest.raises(RtmlSystemError, match="cannot connect"):
        ClientRuntime(ClientConfig("driver", "t" * 32, f"unix:{tmp_path}/no-such.sock",
                                   "127.0.0.1:9", str(tmp_path)))
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


def test_a_head_that_cannot_be_reached_fails_construction_after_the_node_manager(
        tmp_path) -> None:
    import threading

    import pytest

    from rtml.core.runtime import ClientConfig, ClientRuntime
    from rtml.exceptions import RtmlSystemError
    from tests.unit.test_references import stand_ins

    nm_address, _, connections = stand_ins(tmp_path, "t" * 32)
    before = set(threading.enumerate())
    with pytest.raises(RtmlSystemError, match="no-head.sock"):
        ClientRuntime(ClientConfig("driver", "t" * 32, nm_address,
                                   f"unix:{tmp_path}/no-head.sock", str(tmp_path)))
    nm_end = connections()[0]
    nm_end.settimeout(5)
    assert nm_end.recv(1) == b""  # the runtime closed its node-manager connection
    assert [t.name for t in set(threading.enumerate()) - before
            if t.is_alive() and t.name.startswith("rtml")] == []
