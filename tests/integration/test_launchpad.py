"""rtml.launchpad semantics under every launch type: failures, restarts, stop, handles.

Nodes check what they see with asserts (a failed assert fails the program, and
``wait()`` re-raises it) or leave a file in ``tmp_path`` for the test to read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rtml
import rtml.launchpad as lp

WAIT_S = 60.0


@pytest.fixture(params=["local_mt", "local_mp", "rtml"])
def launch_type(request: pytest.FixtureRequest) -> str:
    if request.param == "rtml":
        request.getfixturevalue("cluster")
    return str(request.param)


# -- node classes (module level: local_mp and rtml nodes import them by name) -----------------


class Server:
    def __init__(self, delay: float = 0.0) -> None:
        time.sleep(delay)
        self.pid = os.getpid()

    def ping(self, x: Any) -> Any:
        return x

    def getpid(self) -> int:
        return self.pid


class Failing:
    def __init__(self) -> None:
        raise ValueError("bad constructor argument")


def crash_soon() -> None:
    time.sleep(0.3)
    raise ValueError("boom from a node")


def call_missing_method(server: Any) -> None:
    try:
        server.no_such_method(1)
    except AttributeError as exc:
        assert "'server/0'" in str(exc) and "['getpid', 'ping']" in str(exc), str(exc)
    else:
        raise AssertionError("calling a missing method did not raise")
    lp.stop()


class Ping:
    """One half of a cycle: holds the other's handle."""

    def __init__(self, name: str, peer: Any = None) -> None:
        self.name, self.peer = name, peer

    def hello(self) -> str:
        return self.name

    def ask_peer(self) -> str:
        return self.peer.hello()


def check_cycle(a: Any, b: Any) -> None:
    assert a.ask_peer() == "b" and b.ask_peer() == "a"
    lp.stop()


def call_early(server: Any, out: str) -> None:
    started = time.monotonic()
    assert server.ping(7) == 7
    Path(out).write_text(f"{time.monotonic() - started:.3f}")
    lp.stop()


def call_never_up(server: Any) -> None:
    try:
        server.ping(1)
    except lp.NodeNotUp as exc:
        assert "'slow/0'" in str(exc), str(exc)
    else:
        raise AssertionError("a call to a node that never came up did not raise")
    lp.stop()


class Flaky:
    """Fails its first run; runs until stopped the second time."""

    def __init__(self, marker: str) -> None:
        self.marker = Path(marker)
        self.starts = len(self.marker.read_text()) if self.marker.exists() else 0
        self.starts += 1
        self.marker.write_text("x" * self.starts)

    def count(self) -> int:
        return self.starts

    def run(self) -> None:
        if self.starts == 1:
            raise RuntimeError("first run fails")
        lp.wait_for_stop()


def wait_for_restart(flaky: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if flaky.count() == 2:
                lp.stop()
                return
        except ConnectionError:
            pass  # the node is between its two lives
        time.sleep(0.05)
    raise AssertionError("the restarted node never answered")


def stop_after(seconds: float) -> None:
    time.sleep(seconds)
    lp.stop()


def record_stop(out: str) -> None:
    lp.register_stop_handler(lambda: Path(out).write_text("handler ran"))
    assert lp.wait_for_stop(30)
    assert lp.stop_event().is_set()


def ignore_stop() -> None:
    while True:
        time.sleep(0.02)


def collect_pids(a: Any, b: Any, out: str) -> None:
    Path(out).write_text(f"{a.getpid()} {b.getpid()} {os.getpid()}")
    lp.stop()


def gpu_env(out: str) -> None:
    Path(out).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))


# -- program definition errors (no launch) ----------------------------------------------------


def test_definition_errors_name_the_node_and_label() -> None:
    program = lp.Program("a")
    node = lp.CourierNode(Server)
    program.add_node(node, label="server")
    with pytest.raises(ValueError, match=r"CourierNode\(Server\) 'server/0' is already in"):
        lp.Program("b").add_node(node, label="x")
    with pytest.raises(ValueError, match="cannot be nested"):
        with program.group("outer"), program.group("inner"):
            pass
    with pytest.raises(ValueError, match="needs a label"):
        program.add_node(lp.PyNode(print))
    handle = lp.Program("c").add_node(lp.CourierNode(Server), label="svc")
    with pytest.raises(RuntimeError, match=r"CourierNode\(Server\) 'svc/0'.*outside"):
        handle.dereference()
    with program.group("workers"):
        handles = [program.add_node(lp.CourierNode(Server)) for _ in range(3)]
    assert [h.description.split()[-1] for h in handles] == \
        ["'workers/0'", "'workers/1'", "'workers/2'"]
    assert sorted(program.groups) == ["server", "workers"]
    with pytest.raises(ValueError, match="unknown launch_type"):
        lp.launch(program, launch_type="carrier-pigeon")
    with pytest.raises(ValueError, match="does not have"):
        lp.launch(program, max_restarts={"nope": 1})


def test_batched_handler_stacks_concurrent_calls() -> None:
    import concurrent.futures

    calls: list[int] = []

    @lp.batched_handler(batch_size=4, timeout=1.0)
    def double(x: np.ndarray, tag: list[str]) -> np.ndarray:
        calls.append(len(x))
        assert isinstance(tag, list)
        return x * 2

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(double, np.full(3, i), tag=str(i)) for i in range(4)]
        results = [f.result(timeout=10) for f in futures]
    assert calls == [4]
    for i, result in enumerate(results):
        assert result.tolist() == [2 * i] * 3
    assert double(np.ones(2), tag="alone").tolist() == [2.0, 2.0]  # times out alone
    assert calls == [4, 1]


# -- launched programs --------------------------------------------------------------------------


def _launch(program: lp.Program, launch_type: str, **options: Any) -> lp.ProgramHandle:
    return lp.launch(program, launch_type=launch_type, **options)


def _program(build: Callable[[lp.Program], None]) -> lp.Program:
    program = lp.Program("test")
    build(program)
    return program


def test_the_first_crash_stops_the_program_and_wait_reraises(launch_type: str) -> None:
    def build(p: lp.Program) -> None:
        p.add_node(lp.CourierNode(Server), label="server")
        p.add_node(lp.PyNode(crash_soon), label="crasher")

    handle = _launch(_program(build), launch_type, grace_period=2.0)
    with pytest.raises(ValueError, match="boom from a node") as info:
        handle.wait(WAIT_S)
    assert any("PyNode(crash_soon) 'crasher/0' failed" in note
               for note in info.value.__notes__)
    assert handle.done.is_set()


def test_a_failing_constructor_names_its_node(launch_type: str) -> None:
    handle = _launch(_program(lambda p: p.add_node(lp.CourierNode(Failing), label="bad")),
                     launch_type, grace_period=1.0)
    with pytest.raises(ValueError, match="bad constructor argument") as info:
        handle.wait(WAIT_S)
    assert any("in the constructor of CourierNode(Failing) 'bad/0'" in note
               for note in info.value.__notes__)


def test_calling_a_missing_method_names_the_node(launch_type: str) -> None:
    def build(p: lp.Program) -> None:
        server = p.add_node(lp.CourierNode(Server), label="server")
        p.add_node(lp.PyNode(call_missing_method, server), label="client")

    assert _launch(_program(build), launch_type).wait(WAIT_S)


def test_nodes_holding_each_others_handles(launch_type: str) -> None:
    def build(p: lp.Program) -> None:
        a_node, b_node = lp.CourierNode(Ping, "a"), lp.CourierNode(Ping, "b")
        a, b = a_node.create_handle(), b_node.create_handle()
        a_node.configure("a", peer=b)
        b_node.configure("b", peer=a)
        p.add_node(a_node, label="a")
        p.add_node(b_node, label="b")
        p.add_node(lp.PyNode(check_cycle, a, b), label="check")

    assert _launch(_program(build), launch_type).wait(WAIT_S)


def test_a_call_waits_for_a_node_that_is_not_up_yet(launch_type: str, tmp_path: Path) -> None:
    out = tmp_path / "waited"

    def build(p: lp.Program) -> None:
        server = p.add_node(lp.CourierNode(Server, 1.0), label="server")
        p.add_node(lp.PyNode(call_early, server, str(out)), label="client")

    assert _launch(_program(build), launch_type).wait(WAIT_S)
    assert float(out.read_text()) >= 0.5


def test_a_call_to_a_node_that_never_comes_up_raises_at_the_deadline(
        launch_type: str) -> None:
    def build(p: lp.Program) -> None:
        server = p.add_node(lp.CourierNode(Server, 30.0), label="slow")
        p.add_node(lp.PyNode(call_never_up, server), label="client")

    started = time.monotonic()
    assert _launch(_program(build), launch_type, connect_timeout=1.0,
                   grace_period=0.5).wait(WAIT_S)
    assert time.monotonic() - started < 20


def test_max_restarts_restarts_a_node_and_its_handle_keeps_working(
        launch_type: str, tmp_path: Path) -> None:
    marker = tmp_path / "starts"

    def build(p: lp.Program) -> None:
        flaky = p.add_node(lp.CourierNode(Flaky, str(marker)), label="flaky")
        p.add_node(lp.PyNode(wait_for_restart, flaky), label="client")

    assert _launch(_program(build), launch_type, max_restarts={"flaky": 1}).wait(WAIT_S)
    assert marker.read_text() == "xx"


def test_stop_runs_handlers_and_kills_what_ignores_it(launch_type: str,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "stopped"

    def build(p: lp.Program) -> None:
        p.add_node(lp.PyNode(record_stop, str(out)), label="polite")
        p.add_node(lp.PyNode(ignore_stop), label="stubborn")
        p.add_node(lp.PyNode(stop_after, 0.5), label="stopper")

    started = time.monotonic()
    assert _launch(_program(build), launch_type, grace_period=1.0).wait(WAIT_S)
    assert out.read_text() == "handler ran"
    assert time.monotonic() - started < 15


def test_two_programs_stop_independently(launch_type: str) -> None:
    def build(p: lp.Program) -> None:
        p.add_node(lp.CourierNode(Server), label="server")

    quitter = _program(lambda p: (build(p), p.add_node(lp.PyNode(stop_after, 0.2),
                                                       label="stopper")))
    keeper = _program(build)
    first, second = _launch(quitter, launch_type), _launch(keeper, launch_type)
    assert first.wait(WAIT_S)
    assert not second.done.wait(1.0)  # the other program is untouched
    second.stop()
    assert second.wait(WAIT_S)


def test_colocated_nodes_share_a_process(launch_type: str, tmp_path: Path) -> None:
    out = tmp_path / "pids"

    def build(p: lp.Program) -> None:
        a_node, b_node = lp.CourierNode(Server), lp.CourierNode(Server)
        a, b = a_node.create_handle(), b_node.create_handle()
        p.add_node(lp.MultiThreadingColocation([a_node, b_node]), label="pair")
        p.add_node(lp.PyNode(collect_pids, a, b, str(out)), label="client")

    assert _launch(_program(build), launch_type).wait(WAIT_S)
    a_pid, b_pid, client_pid = out.read_text().split()
    assert a_pid == b_pid
    if launch_type != "local_mt":
        assert a_pid != client_pid


def test_test_mt_fails_fast() -> None:
    def build(p: lp.Program) -> None:
        p.add_node(lp.PyNode(ignore_stop), label="forever")
        p.add_node(lp.PyNode(crash_soon), label="crasher")

    started = time.monotonic()
    with pytest.raises(ValueError, match="boom"):
        lp.launch(_program(build), launch_type="test_mt").wait(WAIT_S)
    assert time.monotonic() - started < 5


def test_rtml_places_groups_with_their_resources(start_cluster: Any, tmp_path: Path) -> None:
    start_cluster(num_cpus=2, num_gpus=1)
    out = tmp_path / "gpus"
    program = lp.Program("gpu")
    program.add_node(lp.PyNode(gpu_env, str(out)), label="learner")
    lp.launch(program, launch_type="rtml", resources={"learner": {"num_gpus": 1}}).wait(WAIT_S)
    assert out.read_text() == "0"
    deadline = time.monotonic() + 10  # the node's actor is gone: its GPU comes back
    while rtml.available_resources().get("GPU") != 1.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rtml.available_resources().get("GPU") == 1.0


class Model:
    """A batched method (the decorator on the class) with per-instance batches."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.batches: list[int] = []

    @lp.batched_handler(batch_size=3, timeout=2.0)
    def infer(self, x: np.ndarray) -> np.ndarray:
        self.batches.append(len(x))
        return x * self.scale

    def sizes(self) -> list[int]:
        return self.batches


def test_a_node_is_callable_from_the_launching_process(launch_type: str) -> None:
    program = lp.Program("driver-calls")
    model = program.add_node(lp.CourierNode(Model, 2.0, courier_kwargs={
        "thread_pool_size": 4}), label="model")
    handle = lp.launch(program, launch_type=launch_type)
    try:
        client = model.dereference()
        futures = [client.futures.infer(np.full(2, float(i))) for i in range(3)]
        assert [f.result(timeout=WAIT_S).tolist() for f in futures] == \
            [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]
        assert client.sizes() == [3]
    finally:
        handle.stop()
    assert handle.wait(WAIT_S)


def test_an_unpicklable_argument_names_its_node_and_starts_nothing() -> None:
    import threading

    program = lp.Program("bad-args")
    program.add_node(lp.CourierNode(Server), label="server")
    program.add_node(lp.PyNode(print, threading.Lock()), label="client")
    before = set(threading.enumerate())
    with pytest.raises(TypeError, match=r"PyNode\(print\) 'client/0' cannot be sent"):
        lp.launch(program, launch_type="local_mt")
    # Threads of earlier tests may end meanwhile; none may have been started.
    assert set(threading.enumerate()) <= before


def test_a_node_process_exits_when_its_launcher_dies(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    script = tmp_path / "launcher.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import rtml.launchpad as lp\n"
        "from test_launchpad import Server\n"
        "p = lp.Program('orphan')\n"
        "p.add_node(lp.CourierNode(Server), label='server')\n"
        "h = lp.launch(p, launch_type='local_mp')\n"
        "print(h.procs[next(iter(h.procs))].pid, flush=True)\n"
        "time.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                text=True)
    assert launcher.stdout is not None
    node_pid = int(launcher.stdout.readline())
    time.sleep(1.0)  # the node is up and serving
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(node_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(node_pid, signal.SIGKILL)
    raise AssertionError("the node process outlived its launcher")


class Runner:
    def __init__(self, out: str) -> None:
        self.out = out

    def run(self) -> None:
        Path(self.out).write_text("ran")

    def ping(self, x: Any) -> Any:
        return x


def ping_then_stop(server: Any) -> None:
    assert server.ping(5) == 5
    lp.stop()


def test_disable_run_serves_without_running(tmp_path: Path) -> None:
    out = tmp_path / "ran"
    program = lp.Program("disabled")
    node = lp.CourierNode(Runner, str(out))
    node.disable_run()  # it only serves
    handle = program.add_node(node, label="server")
    program.add_node(lp.PyNode(ping_then_stop, handle), label="client")
    assert lp.launch(program, launch_type="local_mt").wait(WAIT_S)
    assert not out.exists()


def test_a_colocation_can_end_with_its_first_node() -> None:
    program = lp.Program("first")
    program.add_node(lp.MultiThreadingColocation(
        [lp.PyNode(time.sleep, 0.1), lp.PyNode(lp.wait_for_stop)],
        return_on_first_completed=True), label="pair")
    started = time.monotonic()
    assert lp.launch(program, launch_type="local_mt", grace_period=0.5).wait(WAIT_S)
    assert time.monotonic() - started < 10
