"""Errors: TaskError shape, propagation, worker crashes and retries, pickling, misuse."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import rtml
from rtml.exceptions import RtmlError, TaskError, WorkerCrashedError

pytestmark = pytest.mark.usefixtures("cluster")


class CustomError(Exception):
    pass


@rtml.remote
def raise_value_error(message: str) -> None:
    raise ValueError(message)


@rtml.remote
def raise_custom(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    helper_that_raises()


def helper_that_raises() -> None:
    raise CustomError("custom failure text")


@rtml.remote
def plus_one(x: int) -> int:
    return x + 1


@rtml.remote
def die() -> None:
    os._exit(1)


@rtml.remote
def crash_on_first_attempt(marker: str) -> str:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return "survived"


@rtml.remote
def flaky(counter: str, failures: int, exc_name: str) -> int:
    path = Path(counter)
    attempts = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(attempts))
    if attempts <= failures:
        raise {"ValueError": ValueError, "KeyError": KeyError}[exc_name](f"attempt {attempts}")
    return attempts


@rtml.remote
def return_unpicklable() -> threading.Lock:
    return threading.Lock()


@rtml.remote
def identity(x: object) -> object:
    return x


@rtml.remote
def three_values() -> tuple[int, int, int]:
    return 1, 2, 3


@rtml.remote
def sleep_then(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


# -- get of several refs fails fast (as Ray) -----------------------------------------------------


def test_get_of_a_list_raises_the_first_failure_without_waiting_for_earlier_refs() -> None:
    slow = sleep_then.remote(60, 1)
    started = time.monotonic()
    with pytest.raises(ValueError, match="fails at once"):
        rtml.get([slow, raise_value_error.remote("fails at once"), plus_one.remote(1)],
                 timeout=120)
    assert time.monotonic() - started < 30  # not behind the 60 s task
    rtml.cancel(slow, force=True)


def test_get_of_a_list_raises_a_failure_that_was_already_there() -> None:
    failed = raise_value_error.remote("already failed")
    with pytest.raises(ValueError):
        rtml.get(failed, timeout=60)
    slow = sleep_then.remote(60, 1)
    started = time.monotonic()
    with pytest.raises(ValueError, match="already failed"):
        rtml.get([slow, failed], timeout=120)
    assert time.monotonic() - started < 30
    rtml.cancel(slow, force=True)


def test_get_of_a_list_without_failures_returns_every_value_in_order() -> None:
    refs = [sleep_then.remote(0.2 * (3 - i), i) for i in range(3)] + [plus_one.remote(9)]
    assert rtml.get(refs, timeout=60) == [0, 1, 2, 10]


# -- TaskError ----------------------------------------------------------------------------------

def test_task_error_is_instance_of_user_exception() -> None:
    ref = raise_value_error.options(max_retries=0).remote("bad input 1234")
    with pytest.raises(ValueError) as info:
        rtml.get(ref)
    err = info.value
    assert isinstance(err, TaskError) and isinstance(err, RtmlError)
    assert isinstance(err.cause, ValueError)
    assert "bad input 1234" in str(err.cause)
    assert "bad input 1234" in str(err)
    try:
        rtml.get(ref)
    except ValueError:
        pass  # `except ValueError` works


def test_task_error_text_has_task_name_pid_and_traceback(tmp_path) -> None:
    pid_file = str(tmp_path / "pid")
    with pytest.raises(CustomError) as info:
        rtml.get(raise_custom.remote(pid_file))
    text = str(info.value)
    assert "raise_custom" in text  # the task's name
    assert "Traceback" in text
    assert "helper_that_raises" in text  # a frame of the remote traceback
    assert "custom failure text" in text
    assert Path(pid_file).read_text() in text  # the worker's pid
    assert isinstance(info.value, TaskError)


def test_a_remote_traceback_names_the_file_and_line_of_a_function_shipped_by_value() -> None:
    # Defined inside the test, so it travels by value (cloudpickle), not by module name.
    @rtml.remote
    def divide(x: int) -> float:
        return 1 / x

    line = divide._target.__code__.co_firstlineno + 2  # its ``return`` line
    with pytest.raises(ZeroDivisionError) as info:
        rtml.get(divide.remote(0))
    text = str(info.value)
    assert f'File "{__file__}", line {line}, in divide' in text
    assert "return 1 / x" in text  # the source line, read from the file
    assert "<dynamic-code>" not in text


def test_failure_propagates_to_downstream_tasks() -> None:
    failed = raise_value_error.options(max_retries=0).remote("upstream broke 99")
    downstream = plus_one.remote(failed)
    further = plus_one.remote(downstream)
    for ref in (downstream, further):
        with pytest.raises(ValueError) as info:
            rtml.get(ref, timeout=30)
        assert isinstance(info.value, TaskError)
        assert "upstream broke 99" in str(info.value)


def test_user_exception_is_not_retried_by_default(tmp_path) -> None:
    counter = str(tmp_path / "count")
    with pytest.raises(ValueError):
        rtml.get(flaky.options(max_retries=3).remote(counter, 5, "ValueError"), timeout=30)
    assert Path(counter).read_text() == "1"


# -- crashes and retries ------------------------------------------------------------------------

def test_worker_crash_without_retries_is_worker_crashed_error() -> None:
    with pytest.raises(WorkerCrashedError):
        rtml.get(die.options(max_retries=0).remote(), timeout=60)
    assert rtml.get(plus_one.remote(1), timeout=60) == 2  # the node recovers


def test_worker_crash_is_retried(tmp_path) -> None:
    marker = str(tmp_path / "crashed-once")
    ref = crash_on_first_attempt.options(max_retries=2).remote(marker)
    assert rtml.get(ref, timeout=60) == "survived"
    assert os.path.exists(marker)


def test_retry_exceptions_list_retries_a_flaky_task(tmp_path) -> None:
    counter = str(tmp_path / "count")
    ref = flaky.options(max_retries=3, retry_exceptions=[ValueError]).remote(
        counter, 2, "ValueError")
    assert rtml.get(ref, timeout=60) == 3


def test_retry_exceptions_true_retries(tmp_path) -> None:
    counter = str(tmp_path / "count")
    ref = flaky.options(max_retries=2, retry_exceptions=True).remote(counter, 1, "KeyError")
    assert rtml.get(ref, timeout=60) == 2


def test_retry_exceptions_list_does_not_retry_other_exceptions(tmp_path) -> None:
    counter = str(tmp_path / "count")
    ref = flaky.options(max_retries=3, retry_exceptions=[ValueError]).remote(
        counter, 1, "KeyError")
    with pytest.raises(KeyError):
        rtml.get(ref, timeout=60)
    assert Path(counter).read_text() == "1"


def test_retry_exceptions_draw_on_max_retries_budget(tmp_path) -> None:
    counter = str(tmp_path / "count")
    ref = flaky.options(max_retries=1, retry_exceptions=[ValueError]).remote(
        counter, 5, "ValueError")
    with pytest.raises(ValueError):
        rtml.get(ref, timeout=60)
    assert Path(counter).read_text() == "2"  # first attempt + one retry


# -- serialization ------------------------------------------------------------------------------

def test_unpicklable_argument_is_type_error_at_call_site() -> None:
    with pytest.raises(TypeError):
        identity.remote(threading.Lock())
    with pytest.raises(TypeError):
        identity.remote(x=threading.Lock())


def test_unpicklable_put_is_type_error() -> None:
    with pytest.raises(TypeError):
        rtml.put(threading.Lock())
    with pytest.raises(TypeError):
        rtml.put({"nested": [threading.Lock()]})


def test_unpicklable_return_is_task_error_and_worker_keeps_serving() -> None:
    with pytest.raises(TaskError):
        rtml.get(return_unpicklable.options(max_retries=0).remote(), timeout=60)
    assert rtml.get([plus_one.remote(i) for i in range(4)], timeout=60) == [1, 2, 3, 4]


def test_wrong_number_of_returns_fails_every_return_ref() -> None:
    a, b = three_values.options(num_returns=2, max_retries=0).remote()
    with pytest.raises(RtmlError):
        rtml.get(a, timeout=30)
    with pytest.raises(RtmlError):
        rtml.get(b, timeout=30)


# -- misuse -------------------------------------------------------------------------------------

def test_calling_remote_function_directly_is_type_error() -> None:
    with pytest.raises(TypeError) as info:
        plus_one(1)
    assert ".remote(" in str(info.value)


def test_get_of_non_ref_is_type_error() -> None:
    with pytest.raises(TypeError):
        rtml.get(123)
    with pytest.raises(TypeError):
        rtml.get("ref")


def test_second_init_is_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        rtml.init(num_cpus=2)
    assert rtml.is_initialized()
    assert rtml.get(plus_one.remote(1), timeout=30) == 2


def test_reinit_with_ignore_reinit_error_is_ok() -> None:
    ctx = rtml.init(ignore_reinit_error=True)
    assert ctx is not None
    assert rtml.is_initialized()
    assert rtml.get(plus_one.remote(2), timeout=30) == 3


def test_unknown_option_is_rejected() -> None:
    with pytest.raises((ValueError, TypeError)):
        plus_one.options(no_such_option=1)


def test_get_after_failed_get_timeout_still_works() -> None:
    @rtml.remote
    def slowish() -> str:
        time.sleep(0.5)
        return "done"

    ref = slowish.remote()
    with pytest.raises(TimeoutError):
        rtml.get(ref, timeout=0.05)
    assert rtml.get(ref, timeout=30) == "done"


# -- arguments checked at the call site (as Ray) ------------------------------------------------


@rtml.remote
class Holder:
    def __init__(self, value: int) -> None:
        self.value = value

    def get(self) -> int:
        return self.value


def test_a_call_that_does_not_match_the_signature_fails_at_remote() -> None:
    with pytest.raises(TypeError, match=r"remote function plus_one\(x\) cannot take these "
                                        r"arguments: too many positional arguments"):
        plus_one.remote(1, 2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        plus_one.options(name="renamed").remote(1, y=1)
    with pytest.raises(TypeError, match=r"actor class Holder\(value\) cannot take these "
                                        r"arguments: missing a required argument: 'value'"):
        Holder.remote()
    assert rtml.get(plus_one.remote(x=1), timeout=60) == 2  # a good call still runs
    holder = Holder.options(name=None).remote(value=5)
    assert rtml.get(holder.get.remote(), timeout=60) == 5
    rtml.kill(holder)


def test_an_actor_method_call_that_does_not_match_fails_at_remote_also_on_a_passed_handle() -> None:
    holder = Holder.remote(3)
    with pytest.raises(TypeError, match=r"actor method Holder.get\(\) cannot take these "
                                        r"arguments: too many positional arguments"):
        holder.get.remote(1)
    assert rtml.get(call_get_wrongly.remote(holder), timeout=60) == "TypeError at remote"
    by_name = Holder.options(name="holder-by-name").remote(4)
    found = rtml.get_actor("holder-by-name")
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        found.get.remote(z=1)
    assert rtml.get(found.get.remote(), timeout=60) == 4
    rtml.kill(holder)
    rtml.kill(by_name)


@rtml.remote
def call_get_wrongly(holder: object) -> str:
    try:
        holder.get.remote("extra")  # type: ignore[attr-defined]
    except TypeError:
        return "TypeError at remote"
    return "accepted"


def test_an_async_def_remote_function_is_a_value_error_at_once() -> None:
    async def fetch() -> int:
        return 1

    with pytest.raises(ValueError, match="'async def' cannot be a remote function"):
        rtml.remote(fetch)


@pytest.mark.parametrize(("options", "error", "names"), [
    ({"max_restarts": "3"}, ValueError, "max_restarts"),
    ({"max_restarts": -2}, ValueError, "max_restarts"),
    ({"max_task_retries": 1.5}, ValueError, "max_task_retries"),
    ({"max_concurrency": 0}, ValueError, "max_concurrency"),
    ({"namespace": 7}, TypeError, "namespace"),
    ({"namespace": ""}, ValueError, "namespace"),
    ({"get_if_exists": True}, ValueError, "get_if_exists"),
    ({"resources": {"CPU": 1}}, ValueError, "num_cpu"),
    ({"resources": {"foo": -1}}, ValueError, "'foo'"),
    ({"resources": {1: 1}}, TypeError, "resource names"),
    ({"lifetime": "forever"}, ValueError, "lifetime"),
])
def test_invalid_actor_options_are_refused_at_once_naming_the_option(
        options: dict, error: type, names: str) -> None:
    @rtml.remote
    class Plain:
        pass

    with pytest.raises(error, match=names):
        Plain.options(**options)


@pytest.mark.parametrize(("options", "error", "names"), [
    ({"retry_exceptions": "yes"}, TypeError, "retry_exceptions"),
    ({"retry_exceptions": [KeyError, "ValueError"]}, TypeError, "retry_exceptions"),
    ({"num_returns": -1}, ValueError, "num_returns"),
    ({"max_retries": -2}, ValueError, "max_retries"),
    ({"num_gpus": "1"}, ValueError, "num_gpus"),
])
def test_invalid_task_options_are_refused_at_once_naming_the_option(
        options: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        plus_one.options(**options)
    assert rtml.get(plus_one.options(retry_exceptions=[KeyError]).remote(1)) == 2


def test_a_bad_namespace_for_init_is_refused_before_anything_starts() -> None:
    for namespace, error in ((5, TypeError), ("", ValueError)):
        with pytest.raises(error, match="namespace"):
            rtml.init(namespace=namespace, ignore_reinit_error=False)  # type: ignore[arg-type]
    assert rtml.get(plus_one.remote(1)) == 2  # the running driver is untouched
