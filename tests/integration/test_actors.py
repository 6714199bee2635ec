"""Actors on an embedded 2-CPU node: ordering, handles, concurrency, names, kill, restarts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import cloudpickle
import psutil
import pytest

import rtml
from rtml.core import current
from rtml.exceptions import ActorDiedError, TaskCancelledError, TaskError

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote
class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    def get(self) -> int:
        return self.value

    def pid(self) -> int:
        return os.getpid()

    def actor_id(self) -> str | None:
        return rtml.get_runtime_context().get_actor_id()

    def pair(self) -> tuple[int, int]:
        return self.value, -self.value

    def fail(self, message: str) -> None:
        raise KeyError(message)

    def crash(self) -> None:
        os._exit(1)

    def nap(self, seconds: float) -> None:
        time.sleep(seconds)


@rtml.remote
class Sleeper:
    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        return os.getpid()

    def nap(self, seconds: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time()


@rtml.remote
class AsyncSleeper:
    async def ping(self) -> str:
        return "pong"

    async def nap(self, seconds: float) -> tuple[float, float]:
        start = time.time()
        await asyncio.sleep(seconds)
        return start, time.time()


@rtml.remote
class Relay:
    """Holds another actor's handle and calls it."""

    def __init__(self, target) -> None:
        self.target = target

    def forward(self, by: int) -> int:
        return rtml.get(self.target.incr.remote(by))

    def pid(self) -> int:
        return os.getpid()


@rtml.remote
class BrokenInit:
    def __init__(self) -> None:
        raise ValueError("constructor exploded: code 7731")

    def method(self) -> int:
        return 1


@rtml.remote
def bump_via_handle(counter, times: int) -> int:
    last = 0
    for _ in range(times):
        last = rtml.get(counter.incr.remote())
    return last


def _overlapping(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def test_actor_calls_run_in_order() -> None:
    c = Counter.remote()
    assert isinstance(c, rtml.ActorHandle)
    refs = [c.incr.remote() for _ in range(30)]
    assert rtml.get(refs, timeout=60) == list(range(1, 31))
    assert rtml.get(c.get.remote()) == 30


@rtml.remote
def later(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def test_a_ready_call_does_not_overtake_one_waiting_for_its_argument() -> None:
    # Once connected, a call with nothing ahead of it is sent at once; one submitted
    # after a call still waiting for its argument must wait behind it.
    c = Counter.remote()
    assert rtml.get(c.incr.remote(1), timeout=60) == 1
    first = c.incr.remote(later.remote(0.5, 10))
    second = c.incr.remote(100)
    assert rtml.get([first, second], timeout=60) == [11, 111]


def test_cancelling_a_queued_call_lets_the_calls_behind_it_go() -> None:
    c = Counter.remote()
    assert rtml.get(c.incr.remote(1), timeout=60) == 1
    first = c.incr.remote(later.remote(2.0, 10))  # queued: its argument is not made yet
    second = c.incr.remote(100)  # queued behind it
    rtml.cancel(first)
    assert rtml.get(second, timeout=1.0) == 101  # not held until the argument is made
    with pytest.raises(TaskCancelledError):
        rtml.get(first, timeout=10)


def test_actor_constructor_args_and_own_process() -> None:
    c = Counter.remote(100)
    assert rtml.get(c.incr.remote(5), timeout=60) == 105
    assert rtml.get(c.pid.remote()) != os.getpid()
    actor_id = rtml.get(c.actor_id.remote())
    assert isinstance(actor_id, str) and actor_id


def test_method_options_num_returns() -> None:
    c = Counter.remote(3)
    a, b = c.pair.options(num_returns=2).remote()
    assert rtml.get([a, b], timeout=60) == [3, -3]


def test_method_error_is_task_error_and_actor_survives() -> None:
    c = Counter.remote()
    rtml.get(c.incr.remote(), timeout=60)
    with pytest.raises(KeyError) as info:
        rtml.get(c.fail.remote("bad key 55"))
    assert isinstance(info.value, TaskError)
    assert "bad key 55" in str(info.value)
    assert rtml.get(c.incr.remote()) == 2


def test_handle_passed_to_task() -> None:
    c = Counter.remote()
    assert rtml.get(bump_via_handle.remote(c, 5), timeout=60) == 5
    assert rtml.get(c.get.remote()) == 5


def test_handle_passed_to_another_actor() -> None:
    c = Counter.remote()
    relay = Relay.remote(c)
    assert rtml.get(relay.forward.remote(10), timeout=60) == 10
    assert rtml.get(relay.forward.remote(5)) == 15
    assert rtml.get(c.get.remote()) == 15


def test_sync_actor_runs_one_call_at_a_time() -> None:
    s = Sleeper.remote()
    assert rtml.get(s.ping.remote(), timeout=60) == "pong"
    spans = rtml.get([s.nap.remote(0.2) for _ in range(3)], timeout=30)
    assert _overlapping(spans) == 1, spans


def test_threaded_actor_runs_calls_concurrently() -> None:
    s = Sleeper.options(max_concurrency=4).remote()
    assert rtml.get(s.ping.remote(), timeout=60) == "pong"
    t0 = time.monotonic()
    spans = rtml.get([s.nap.remote(0.5) for _ in range(4)], timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5, f"4 x 0.5 s calls took {elapsed:.2f} s on max_concurrency=4"
    assert _overlapping(spans) >= 2, spans


def test_async_actor_overlaps_sleeps() -> None:
    s = AsyncSleeper.remote()
    assert rtml.get(s.ping.remote(), timeout=60) == "pong"
    t0 = time.monotonic()
    spans = rtml.get([s.nap.remote(0.5) for _ in range(4)], timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5, f"4 x 0.5 s async calls took {elapsed:.2f} s"
    assert _overlapping(spans) == 4, spans


def test_named_actor_and_get_actor() -> None:
    name = f"counter-{uuid.uuid4().hex[:8]}"
    c = Counter.options(name=name).remote(7)
    assert rtml.get(c.get.remote(), timeout=60) == 7
    same = rtml.get_actor(name)
    assert isinstance(same, rtml.ActorHandle)
    assert rtml.get(same.incr.remote()) == 8
    assert rtml.get(c.get.remote()) == 8


def test_get_actor_of_unknown_name_is_value_error() -> None:
    with pytest.raises(ValueError):
        rtml.get_actor(f"no-such-actor-{uuid.uuid4().hex[:8]}")


def test_get_if_exists_returns_the_existing_actor() -> None:
    name = f"gie-{uuid.uuid4().hex[:8]}"
    a = Counter.options(name=name, get_if_exists=True).remote(1)
    assert rtml.get(a.incr.remote(), timeout=60) == 2
    b = Counter.options(name=name, get_if_exists=True).remote(1000)
    assert rtml.get(b.incr.remote(), timeout=60) == 3


def test_detached_lifetime_is_accepted() -> None:
    name = f"detached-{uuid.uuid4().hex[:8]}"
    d = Counter.options(name=name, lifetime="detached").remote(1)
    assert rtml.get(d.incr.remote(), timeout=60) == 2
    assert rtml.get(rtml.get_actor(name).get.remote()) == 2
    rtml.kill(d)


def test_kill_makes_later_calls_raise_actor_died_error() -> None:
    c = Counter.remote()
    assert rtml.get(c.incr.remote(), timeout=60) == 1
    rtml.kill(c)
    t0 = time.monotonic()
    with pytest.raises(ActorDiedError):
        rtml.get(c.incr.remote(), timeout=10)
    assert time.monotonic() - t0 < 2.0


def test_kill_fails_in_flight_and_queued_calls() -> None:
    s = Sleeper.remote()
    assert rtml.get(s.ping.remote(), timeout=60) == "pong"
    running = s.nap.remote(30)
    queued = s.nap.remote(30)
    time.sleep(0.3)
    rtml.kill(s)
    t0 = time.monotonic()
    for ref in (running, queued):
        with pytest.raises(ActorDiedError):
            rtml.get(ref, timeout=10)
    assert time.monotonic() - t0 < 5.0


@rtml.remote
class FileLog:
    """Appends to a file, so a test can see calls run without calling get."""

    def __init__(self, path: str) -> None:
        self.path = path

    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    def append(self, i: int) -> int:
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        return i


def test_pipelined_calls_held_by_the_caller_still_run_without_a_get(tmp_path: Path) -> None:
    # With calls in flight on a one-at-a-time actor, new ones are held and written in
    # batches, the last batch when a result comes in: never waiting for a get.
    path = tmp_path / "log.txt"
    log = FileLog.remote(str(path))
    rtml.get(log.append.remote(-1), timeout=60)
    refs = [log.nap.remote(0.3)] + [log.append.remote(i) for i in range(20)]
    deadline = time.monotonic() + 20
    while path.read_text().split() != [str(i) for i in range(-1, 20)]:
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)
    assert rtml.get(refs[1:], timeout=10) == list(range(20))


def test_held_calls_fail_when_the_actor_is_killed() -> None:
    s = Sleeper.remote()
    assert rtml.get(s.ping.remote(), timeout=60) == "pong"
    refs = [s.nap.remote(30)] + [s.ping.remote() for _ in range(12)]  # most of them held
    time.sleep(0.3)
    rtml.kill(s)
    for ref in refs:
        with pytest.raises(ActorDiedError):
            rtml.get(ref, timeout=10)


def test_held_calls_are_retried_in_order_after_a_restart() -> None:
    c = Counter.options(max_restarts=1, max_task_retries=-1).remote()
    first_pid = rtml.get(c.pid.remote(), timeout=60)
    nap = c.nap.remote(2.0)  # the kill lands while this runs
    refs = [c.incr.remote() for _ in range(40)]  # in flight and held behind it
    time.sleep(0.2)
    rtml.kill(c, no_restart=False)
    rtml.get(nap, timeout=60)  # retried on the restarted actor
    assert rtml.get(refs, timeout=60) == list(range(1, 41))  # each once, in order, after it
    assert rtml.get(c.pid.remote(), timeout=30) != first_pid


def test_kill_named_actor_removes_the_name() -> None:
    name = f"killed-{uuid.uuid4().hex[:8]}"
    c = Counter.options(name=name).remote()
    rtml.get(c.incr.remote(), timeout=60)
    rtml.kill(c)
    deadline = time.monotonic() + 5
    while True:
        try:
            rtml.get_actor(name)
        except ValueError:
            break
        assert time.monotonic() < deadline, "killed actor's name still resolves"
        time.sleep(0.1)


def test_constructor_error_fails_method_calls_with_its_message() -> None:
    b = BrokenInit.remote()
    with pytest.raises(ActorDiedError) as info:
        rtml.get(b.method.remote(), timeout=60)
    assert "constructor exploded: code 7731" in str(info.value)
    with pytest.raises(ActorDiedError) as info:
        rtml.get(b.method.remote(), timeout=30)
    assert "constructor exploded: code 7731" in str(info.value)


def test_max_restarts_restarts_with_state_reset() -> None:
    c = Counter.options(max_restarts=1).remote(10)
    assert rtml.get(c.incr.remote(), timeout=60) == 11
    first_pid = rtml.get(c.pid.remote())
    with pytest.raises(ActorDiedError):
        rtml.get(c.crash.remote(), timeout=30)
    assert rtml.get(c.incr.remote(), timeout=60) == 11  # constructor ran again
    assert rtml.get(c.pid.remote()) != first_pid


def test_actor_without_restarts_dies_for_good() -> None:
    c = Counter.remote()
    rtml.get(c.incr.remote(), timeout=60)
    with pytest.raises(ActorDiedError):
        rtml.get(c.crash.remote(), timeout=30)
    with pytest.raises(ActorDiedError):
        rtml.get(c.incr.remote(), timeout=30)


def test_direct_instantiation_is_type_error() -> None:
    with pytest.raises(TypeError, match=r"\.remote\("):
        Counter()


# -- lifetime: the last handle ----------------------------------------------------------------

def _exits(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_dropping_the_last_handle_ends_the_actor() -> None:
    c = Counter.remote()
    pid = rtml.get(c.pid.remote(), timeout=60)
    copy = c
    del c
    assert not _exits(pid, timeout=1.0)  # one handle is left
    del copy
    assert _exits(pid)


def test_calls_made_before_the_last_handle_is_dropped_still_run() -> None:
    sleeper = Sleeper.remote()
    pid = rtml.get(sleeper.pid.remote(), timeout=60)
    naps = [sleeper.nap.remote(0.3) for _ in range(3)]
    del sleeper
    spans = rtml.get(naps, timeout=30)
    assert len(spans) == 3 and all(end - start >= 0.3 for start, end in spans)
    assert _exits(pid)
    assert rtml.get(Counter.remote(5).incr.remote(), timeout=60) == 6  # a handle never kept


def test_a_method_keeps_its_actor_alive_like_a_handle() -> None:
    c = Counter.remote()
    pid = rtml.get(c.pid.remote(), timeout=60)
    incr = c.incr  # as a bound method keeps its object: the actor lives while it does
    del c
    assert rtml.get(incr.remote(), timeout=60) == 1
    assert rtml.get(incr.options(name="named_incr").remote(2), timeout=60) == 3
    assert not _exits(pid, timeout=0.5)
    del incr
    assert _exits(pid)


def test_an_actor_lent_to_a_task_ends_when_the_task_and_the_creator_are_done() -> None:
    # Each actor holds one of the 2 CPUs while it lives: were any kept after its handles
    # were gone, the third would never be placed.
    for i in range(4):
        counter = Counter.options(num_cpus=1).remote(i)
        pid = rtml.get(counter.pid.remote(), timeout=60)
        assert rtml.get(bump_via_handle.remote(counter, 2), timeout=60) == i + 2
        del counter
        assert _exits(pid)


def test_a_borrowed_handle_keeps_its_actor_alive_until_the_borrower_is_gone() -> None:
    counter = Counter.remote()
    pid = rtml.get(counter.pid.remote(), timeout=60)
    relay = Relay.remote(counter)  # the relay actor keeps the handle
    relay_pid = rtml.get(relay.pid.remote(), timeout=60)
    del counter
    assert rtml.get(relay.forward.remote(3), timeout=60) == 3
    assert not _exits(pid, timeout=1.0)
    assert rtml.get(relay.forward.remote(4), timeout=60) == 7
    del relay  # the relay ends, and with it the last handle to the counter
    assert _exits(relay_pid)
    assert _exits(pid)


def test_a_handle_inside_a_put_value_keeps_its_actor_while_the_value_lives() -> None:
    counter = Counter.remote()
    pid = rtml.get(counter.pid.remote(), timeout=60)
    boxed = rtml.put({"counter": counter})
    del counter
    assert not _exits(pid, timeout=1.0)
    again = rtml.get(boxed)["counter"]
    assert rtml.get(again.incr.remote(5), timeout=60) == 5
    del again
    assert not _exits(pid, timeout=1.0)  # the put value still holds it
    del boxed
    assert _exits(pid)


def test_a_handle_pickled_outside_a_value_keeps_its_actor_to_the_job_end() -> None:
    # E.g. captured in a function's closure: nothing would let go of it, so it is kept.
    counter = Counter.remote()
    pid = rtml.get(counter.pid.remote(), timeout=60)
    blob = cloudpickle.dumps(counter)
    del counter
    assert not _exits(pid, timeout=1.0)
    assert rtml.get(cloudpickle.loads(blob).incr.remote(), timeout=60) == 1
    rtml.kill(cloudpickle.loads(blob))
    assert _exits(pid)


@rtml.remote
class Holder:
    def __init__(self, blob: bytes) -> None:
        self.size = len(blob)

    def pid(self) -> int:
        return os.getpid()

    def length(self) -> int:
        return self.size


@rtml.remote
def length_via_handle(holder) -> int:
    return rtml.get(holder.length.remote())


def test_the_creator_lets_go_of_the_constructor_arguments_when_the_actor_ends() -> None:
    # Its handle was shared, so its node manager ends it, not its creator: the head
    # tells the creator, which kept the arguments for a restart until then.
    blob = rtml.put(b"x" * 200_000)  # in shared memory, owned here
    blob_id = blob.id
    holder = Holder.remote(blob)
    del blob
    pid = rtml.get(holder.pid.remote(), timeout=60)
    assert rtml.get(length_via_handle.remote(holder), timeout=60) == 200_000
    owned = current.require_runtime().store.entries
    assert blob_id in owned
    del holder
    assert _exits(pid)
    deadline = time.monotonic() + 15
    while blob_id in owned and time.monotonic() < deadline:
        time.sleep(0.05)
    assert blob_id not in owned


@rtml.remote
def fails_first() -> int:
    raise ValueError("the argument's task failed")


@rtml.remote
def call_method(method, x: int) -> int:
    return rtml.get(method.remote(x))


def test_an_unreferenced_actor_ends_when_its_last_call_fails_or_is_cancelled() -> None:
    # Calls that leave without a result (their argument failed, or they were cancelled
    # while queued) end it too, not only answered ones.
    failed_arg = Counter.remote()
    pid = rtml.get(failed_arg.pid.remote(), timeout=60)
    call = failed_arg.incr.remote(fails_first.remote())
    del failed_arg
    with pytest.raises(TaskError):
        rtml.get(call, timeout=30)
    assert _exits(pid)
    cancelled = Sleeper.remote()
    pid = rtml.get(cancelled.pid.remote(), timeout=60)
    call = cancelled.nap.remote(Sleeper.remote().nap.remote(1.0))  # queued on its argument
    del cancelled
    rtml.cancel(call)
    assert _exits(pid)


def test_an_unreferenced_actor_that_crashed_is_not_restarted() -> None:
    c = Counter.options(max_restarts=1).remote()
    actor_id = c._actor_id.hex()
    rtml.get(c.pid.remote(), timeout=60)
    crash = c.crash.remote()
    del c
    with pytest.raises(ActorDiedError):
        rtml.get(crash, timeout=30)
    plane = rtml.core.current.require_runtime().plane
    deadline = time.monotonic() + 15
    while _state(plane, actor_id) != "DEAD" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _state(plane, actor_id) == "DEAD"  # not ALIVE again after a restart


def _state(plane, actor_id: str) -> str:
    return next(a["state"] for a in plane.list_actors() if a["actor_id"] == actor_id)


def test_a_bound_method_can_be_passed_to_a_task() -> None:
    c = Counter.remote(40)
    assert rtml.get(call_method.remote(c.incr, 2), timeout=60) == 42
    assert rtml.get(c.get.remote(), timeout=60) == 42


SCRIPT_ACTORS = """
import copy, rtml

@rtml.remote
class Counter:
    def __init__(self, start):
        self.n = start
    def add(self, k):
        self.n += k
        return self.n

@rtml.remote
def make_and_call(start):
    c = Counter.remote(start)  # the class travels with the task, by value
    return rtml.get(c.add.remote(1))

@rtml.remote
def given(cls):
    return rtml.get(cls.options(max_restarts=0).remote(10).add.remote(5))

rtml.init(num_cpus=2)
try:
    first = rtml.get(Counter.remote(0).add.remote(2))  # the class is exported here first
    print(first, rtml.get(make_and_call.remote(40)), rtml.get(given.remote(Counter)),
          copy.copy(Counter).__name__, copy.copy(Counter.options(name="c")).remote(1) is not None)
finally:
    rtml.shutdown()
"""


def test_a_task_creates_actors_of_a_class_defined_in_the_script() -> None:
    # Classes of __main__ are pickled by value with the task that uses them: the pickle
    # must not carry the driver's runtime, and must rebuild the class in the worker.
    out = subprocess.run([sys.executable, "-c", SCRIPT_ACTORS], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-5:] == ["2", "41", "15", "Counter", "True"]


@rtml.remote
class Shadowed:
    """An attribute named like a method (Ray looks methods up on the class)."""

    def __init__(self) -> None:
        self.called = False
        self.scale = 3

    def called(self) -> str:
        self.called = True
        return "method ran"

    def was_called(self) -> bool:
        return self.__dict__["called"]

    @staticmethod
    def double(x: int) -> int:
        return 2 * x

    @classmethod
    def kind(cls) -> str:
        return cls.__name__


def test_methods_are_the_class_functions_not_instance_attributes_of_the_same_name() -> None:
    actor = Shadowed.remote()
    assert rtml.get(actor.was_called.remote(), timeout=60) is False
    assert rtml.get(actor.called.remote(), timeout=60) == "method ran"
    assert rtml.get(actor.called.remote(), timeout=60) == "method ran"  # again, still the method
    assert rtml.get(actor.was_called.remote(), timeout=60) is True
    assert rtml.get(actor.double.remote(21), timeout=60) == 42
    assert rtml.get(actor.kind.remote(), timeout=60) == "Shadowed"
    rtml.kill(actor)


def test_a_killed_named_actor_frees_its_name_at_once() -> None:
    first = Counter.options(name="reused-name").remote(1)
    assert rtml.get(first.get.remote(), timeout=60) == 1
    rtml.kill(first)
    with pytest.raises(ValueError, match="no live actor named 'reused-name'"):
        rtml.get_actor("reused-name")
    second = Counter.options(name="reused-name").remote(2)
    assert rtml.get(rtml.get_actor("reused-name").get.remote(), timeout=60) == 2
    rtml.kill(second)


@pytest.mark.parametrize("name", [None, "", 7])
def test_get_actor_without_a_name_is_a_value_error_at_once(name: object) -> None:
    with pytest.raises(ValueError, match="needs the name the actor was created with"):
        rtml.get_actor(name)  # type: ignore[arg-type]
    assert rtml.get(Counter.remote(5).get.remote(), timeout=60) == 5  # the driver still works


def test_kill_without_no_restart_restarts_an_actor_with_restarts_left() -> None:
    actor = Counter.options(max_restarts=1).remote(10)
    assert rtml.get(actor.incr.remote(5), timeout=60) == 15
    first_pid = rtml.get(actor.pid.remote(), timeout=60)
    rtml.kill(actor, no_restart=False)
    deadline = time.monotonic() + 60
    pid = first_pid
    while pid == first_pid:  # the kill is asynchronous, as in Ray: the old process may
        try:                 # still answer a call or two; calls during the restart fail
            pid = rtml.get(actor.pid.remote(), timeout=30)
        except rtml.exceptions.ActorDiedError:
            pass
        assert time.monotonic() < deadline, "the actor did not come back in a new process"
        time.sleep(0.05)
    assert rtml.get(actor.get.remote(), timeout=60) == 10  # state reset by the constructor
    rtml.kill(actor)


@rtml.remote
class Parent:
    """Creates actors of its own (it owns them)."""

    def make(self, detached: bool) -> list:
        options = {"lifetime": "detached", "name": f"orphan-{uuid.uuid4().hex[:8]}"} \
            if detached else {}
        self.child = Counter.options(**options).remote(3)
        return [self.child]

    def pid(self) -> int:
        return os.getpid()

    def spawn(self) -> int:
        return subprocess.Popen(["sleep", "300"]).pid

    def make_waiting(self, seconds: float) -> list:
        """A child whose constructor argument is still being made."""
        self.child = Counter.remote(sleep_then.remote(seconds, 3))
        return [self.child]


@rtml.remote
def sleep_then(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def test_an_actor_whose_owner_died_before_its_arguments_were_ready_fails_its_callers() -> None:
    parent = Parent.remote()
    child = rtml.get(parent.make_waiting.remote(5.0), timeout=60)[0]
    os.kill(rtml.get(parent.pid.remote(), timeout=60), 9)
    started = time.monotonic()
    with pytest.raises(ActorDiedError, match="its owner"):
        rtml.get(child.incr.remote(), timeout=30)
    assert time.monotonic() - started < 4.0  # at once, not once the argument exists


def test_the_actors_an_actor_creates_end_when_it_dies_unless_detached() -> None:
    # Ray's fate sharing: an actor's owner is the process that created it. The driver
    # holds handles to both children here, and that does not keep the first alive.
    parent = Parent.remote()
    child = rtml.get(parent.make.remote(False), timeout=60)[0]
    orphan = rtml.get(parent.make.remote(True), timeout=60)[0]
    child_pid, orphan_pid = (rtml.get(a.pid.remote(), timeout=60) for a in (child, orphan))
    assert rtml.get(child.incr.remote(), timeout=60) == 4
    parent_pid = rtml.get(parent.pid.remote(), timeout=60)
    os.kill(parent_pid, 9)  # the owner dies for real
    assert _exits(child_pid)
    with pytest.raises(ActorDiedError, match="its owner"):
        rtml.get(child.incr.remote(), timeout=60)
    assert not _exits(orphan_pid, timeout=1.0)
    assert rtml.get(orphan.incr.remote(), timeout=60) == 4
    rtml.kill(orphan)
    assert _exits(orphan_pid)




@rtml.remote(max_retries=0)
def start_child_and_crash(pid_file: str) -> None:
    child = subprocess.Popen(["sleep", "300"])
    Path(pid_file).write_text(str(child.pid))
    os._exit(1)  # no cleanup of any kind runs in the worker


def test_processes_a_worker_started_die_with_it(tmp_path: Path) -> None:
    parent = Parent.remote()
    started = rtml.get(parent.spawn.remote(), timeout=60)
    assert not _exits(started, timeout=0.5)
    rtml.kill(parent)
    assert _exits(started)
    pid_file = tmp_path / "child"
    with pytest.raises(rtml.exceptions.WorkerCrashedError):
        rtml.get(start_child_and_crash.remote(str(pid_file)), timeout=60)
    assert _exits(int(pid_file.read_text()))


@rtml.remote
def incr_named(name: str) -> int:
    return rtml.get(rtml.get_actor(name).incr.remote(), timeout=60)


def test_a_named_actor_ends_when_its_last_handle_goes_unless_detached() -> None:
    # As in Ray: a name does not keep an actor alive; handles from get_actor do.
    name, kept = f"scoped-{uuid.uuid4().hex[:8]}", f"kept-{uuid.uuid4().hex[:8]}"
    actor = Counter.options(name=name).remote(1)
    pid = rtml.get(actor.pid.remote(), timeout=60)
    assert rtml.get(incr_named.remote(name), timeout=60) == 2  # found (and let go) in a task
    found = rtml.get_actor(name)
    del actor
    assert not _exits(pid, timeout=1.0)  # the handle get_actor gave holds it
    assert rtml.get(found.incr.remote(), timeout=60) == 3
    del found
    assert _exits(pid)
    with pytest.raises(ValueError, match="no live actor named"):
        rtml.get_actor(name)
    detached = Counter.options(name=kept, lifetime="detached").remote(5)
    detached_pid = rtml.get(detached.pid.remote(), timeout=60)
    del detached
    assert not _exits(detached_pid, timeout=1.0)
    rtml.kill(rtml.get_actor(kept))
    assert _exits(detached_pid)


@rtml.remote
class Cancellable:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def wait_long(self) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.seen.append("cancelled")
            raise
        return "finished"

    async def seen_so_far(self) -> list[str]:
        return self.seen


def test_cancelling_a_running_async_method_raises_cancelled_error_in_it() -> None:
    # As in Ray: the coroutine gets asyncio.CancelledError; the caller's get raises a
    # TaskError (the coroutine let the CancelledError out).
    actor = Cancellable.remote()
    ref = actor.wait_long.remote()
    rtml.get(actor.seen_so_far.remote(), timeout=60)  # the call is running by now
    time.sleep(0.2)
    started = time.monotonic()
    rtml.cancel(ref)
    with pytest.raises(TaskError, match="CancelledError"):
        rtml.get(ref, timeout=30)
    assert time.monotonic() - started < 5.0
    assert rtml.get(actor.seen_so_far.remote(), timeout=60) == ["cancelled"]


def test_a_cancelled_sync_actor_call_raises_task_cancelled_error() -> None:
    # Sent to the actor already (skipped there if the cancel arrives first).
    sleeper = Sleeper.remote()
    busy = sleeper.nap.remote(1.0)
    queued = sleeper.ping.remote()  # sent: waits at the actor behind the nap
    time.sleep(0.2)
    rtml.cancel(queued)
    with pytest.raises(TaskCancelledError):
        rtml.get(queued, timeout=30)
    assert len(rtml.get(busy, timeout=30)) == 2  # the running one ran to completion
    assert rtml.get(sleeper.ping.remote(), timeout=30) == "pong"
