"""Launchpad programs run unchanged: absl flags, waiting at exit, node logging, test launches.

Scripts written as Launchpad's examples are (absl's ``app.run(main)``, the launch
type from ``--lp_launch_type``, no ``wait()``) run as subprocesses in their own
session, killed whole if they outlive their timeout; what they print is the check.
The test launches (``test_case=``, ``serialize_py_nodes=False``, ``test_mt``'s grace
period) run in this process and share plain Python objects with their nodes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest
from pathlib import Path
from typing import Any

import pytest

import rtml.launchpad as lp

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO_ROOT / "examples" / "launchpad"
if str(REPO_ROOT) not in sys.path:  # the examples import as examples.launchpad.<name>
    sys.path.insert(0, str(REPO_ROOT))

SCRIPT_TIMEOUT = 30.0
WAIT_S = 10.0
PID_PREFIX = re.compile(r"^\(pid=\d+\) ", re.MULTILINE)  # an rtml actor's output, at its driver

needs_absl = pytest.mark.skipif(
    importlib.util.find_spec("absl") is None,
    reason="absl-py is not installed (pip install absl-py, or the project's test extras)")


def run_script(script: Path | str, *args: str,
               timeout: float = SCRIPT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``python script args`` from the repository root; kill its whole session (nodes,
    an embedded cluster) if it runs past ``timeout``."""
    env = {k: v for k, v in os.environ.items() if k != "RTML_ADDRESS"}
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO_ROOT), env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{script} {args} ran past {timeout:g} s:\n{stdout}\n"
                             f"{stderr}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def output_lines(text: str) -> list[str]:
    """The lines a script printed, an rtml actor's ``(pid=N)`` prefix removed."""
    return PID_PREFIX.sub("", text).splitlines()


def absl_lines(text: str, message: str) -> list[str]:
    """What follows ``message`` on the absl log lines (``I1204 12:00:00.000 ... file:N] ...``)."""
    pattern = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \S+:\d+\] " + re.escape(message) + "(.*)$")
    return [m.group(1) for line in output_lines(text) if (m := pattern.match(line))]


# -- the examples, written as Launchpad's are, as scripts ---------------------------------------

SCRIPT_TYPES = ["local_mt", "local_mp", "rtml"]
CONSUMER_RESULTS = [[(2 * s) ** 2, (2 * s + 1) ** 2] for s in range(10)]


@needs_absl
@pytest.mark.parametrize("launch_type", SCRIPT_TYPES)
def test_launchpad_style_hello_prints_before_the_script_exits(launch_type: str) -> None:
    proc = run_script(EXAMPLES_DIR / "launchpad_style_hello.py", f"--lp_launch_type={launch_type}")
    assert proc.returncode == 0, proc.stderr
    assert output_lines(proc.stdout) == ["Hello World!!!"], proc.stdout


@needs_absl
def test_launchpad_style_hello_takes_its_own_and_launchpads_flags() -> None:
    proc = run_script(EXAMPLES_DIR / "launchpad_style_hello.py", "--lp_launch_type", "local_mp",
                      "--greeting=Bonjour", "--lp_terminal=current_terminal",
                      "--nolp_worker_manager_v2", "--lp_worker_manager_registers_signals",
                      "--tmux_session_name=x", "--lp_termination_notice_secs=3")
    assert proc.returncode == 0, proc.stderr
    assert output_lines(proc.stdout) == ["Bonjour"], proc.stdout


@needs_absl
@pytest.mark.parametrize("launch_type", SCRIPT_TYPES)
def test_launchpad_style_consumer_producers_runs_every_step(launch_type: str) -> None:
    proc = run_script(EXAMPLES_DIR / "launchpad_style_consumer_producers.py",
                      f"--lp_launch_type={launch_type}")
    assert proc.returncode == 0, proc.stderr
    everything = proc.stdout + proc.stderr  # under rtml, an actor's stderr reaches stdout
    assert [eval(r) for r in absl_lines(everything, "Results: ")] == CONSUMER_RESULTS, \
        everything
    total = sum(map(sum, CONSUMER_RESULTS))
    assert [line for line in output_lines(proc.stdout) if line.startswith("consumer:")] == \
        [f"consumer: 10 steps, total {total}"], proc.stdout


@needs_absl
def test_an_unknown_lp_launch_type_gets_absls_error() -> None:
    proc = run_script(EXAMPLES_DIR / "launchpad_style_hello.py", "--lp_launch_type=carrier")
    assert proc.returncode == 1
    assert "flag --lp_launch_type=carrier: value should be one of " \
           "<local_mt|local_mp|test_mp|test_mt|local_docker|vertex_ai|rtml>" in proc.stderr, \
        proc.stderr
    assert proc.stdout == ""


def test_a_launchpad_type_rtml_does_not_run_says_so() -> None:
    program = lp.Program("cloud")
    program.add_node(lp.PyNode(print), label="node")
    with pytest.raises(ValueError, match=r"'vertex_ai' is one of Launchpad's that rtml does "
                                         r"not run; use one of \['local_mt', 'local_mp'"):
        lp.launch(program, launch_type="vertex_ai")


# -- scripts written for the test ---------------------------------------------------------------

WITHOUT_APP_RUN = """
    import os, sys
    import rtml.launchpad as lp

    def report(launcher_pid):
        print("node in the launcher's process:", os.getpid() == launcher_pid, flush=True)

    program = lp.Program("no_app_run")
    program.add_node(lp.PyNode(report, os.getpid()), label="node")
    handle = lp.launch(program)
    handle.wait()  # the node has printed its line
    print("launch type", handle.launch_type, "grace period", handle.grace_period, flush=True)
"""


@needs_absl
def test_launch_reads_the_lp_flags_without_app_run(tmp_path: Path) -> None:
    script = tmp_path / "no_app_run.py"
    script.write_text(textwrap.dedent(WITHOUT_APP_RUN))
    proc = run_script(script, "--lp_launch_type", "local_mp", "--lp_termination_notice_secs=1",
                      "other", "args")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["node in the launcher's process: False",
                                        "launch type local_mp grace period 1.0"], proc.stdout
    proc = run_script(script)  # absl's defaults: local_mt, and rtml's grace period
    assert proc.stdout.splitlines() == ["node in the launcher's process: True",
                                        "launch type local_mt grace period 5.0"], proc.stdout


WITHOUT_ABSL = """
    import sys
    sys.modules["absl"] = None  # as if absl-py were not installed: import absl fails
    import rtml.launchpad as lp

    def slow_hello():
        import time
        time.sleep(0.5)  # still running when the script's last line has run
        print("hello from a node", flush=True)

    program = lp.Program("no_absl")
    program.add_node(lp.PyNode(slow_hello), label="node")
    print("launched as", lp.launch(program).launch_type, flush=True)
"""


def test_rtml_launchpad_runs_without_absl(tmp_path: Path) -> None:
    script = tmp_path / "no_absl.py"
    script.write_text(textwrap.dedent(WITHOUT_ABSL))
    proc = run_script(script, "--lp_launch_type=local_mp")  # no absl: no flag to read
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["launched as local_mt", "hello from a node"]


FAILING_NODE = """
    import rtml.launchpad as lp

    def fail_later():
        import time
        time.sleep(0.3)
        raise ValueError("the node failed after main returned")

    program = lp.Program("failing")
    program.add_node(lp.PyNode(fail_later), label="node")
    lp.launch(program, launch_type="local_mp")
"""


def test_a_node_error_after_main_returned_is_printed_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "failing.py"
    script.write_text(textwrap.dedent(FAILING_NODE))
    proc = run_script(script)
    assert "rtml.launchpad: program 'failing' failed:" in proc.stderr, proc.stderr
    assert "ValueError: the node failed after main returned" in proc.stderr
    assert "PyNode(fail_later) 'node/0' failed" in proc.stderr  # the node's traceback note


NODE_LOGGING = """
    from absl import app, logging
    import rtml.launchpad as lp

    def log_from_node(value):
        logging.info("node info %d", value)
        logging.debug("node debug %d", value)
        logging.warning("node warning %d", value)

    def main(argv):
        program = lp.Program("logging")
        program.add_node(lp.PyNode(log_from_node, 42), label="node")
        lp.launch(program)

    if __name__ == "__main__":
        app.run(main)
"""


@needs_absl
@pytest.mark.parametrize("launch_type", ["local_mp", "rtml"])
def test_absl_logging_in_a_node_process_is_seen(launch_type: str, tmp_path: Path) -> None:
    script = tmp_path / "node_logging.py"
    script.write_text(textwrap.dedent(NODE_LOGGING))
    proc = run_script(script, f"--lp_launch_type={launch_type}")
    assert proc.returncode == 0, proc.stderr
    seen = proc.stdout + proc.stderr
    assert absl_lines(seen, "node info ") == ["42"], seen
    assert absl_lines(seen, "node warning ") == ["42"], seen
    assert absl_lines(seen, "node debug ") == [], seen
    if launch_type == "local_mp":
        assert absl_lines(proc.stderr, "node info ") == ["42"], proc.stderr
        proc = run_script(script, f"--lp_launch_type={launch_type}", "--verbosity=1")
        assert absl_lines(proc.stderr, "node debug ") == ["42"], proc.stderr  # -v travels


WAIT_FOR_STOP = """
    from absl import app
    import rtml.launchpad as lp

    def serve_until_stopped():
        print("up", flush=True)
        lp.wait_for_stop()
        print("stopped by the launcher", flush=True)

    def main(argv):
        program = lp.Program("interrupted")
        program.add_node(lp.PyNode(serve_until_stopped), label="node")
        lp.launch(program)

    if __name__ == "__main__":
        app.run(main)
"""


@needs_absl
@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp"])
def test_ctrl_c_while_waiting_at_exit_stops_the_program(launch_type: str,
                                                         tmp_path: Path) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(WAIT_FOR_STOP))
    proc = subprocess.Popen([sys.executable, str(script), f"--lp_launch_type={launch_type}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(REPO_ROOT), start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        time.sleep(0.2)  # main has returned: the interpreter is waiting for the program
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=SCRIPT_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert stdout == "stopped by the launcher\n", (stdout, stderr)
    assert "interrupted; stopping the launched programs" in stderr


# -- test launches ------------------------------------------------------------------------------


def run_test_case(case: type[unittest.TestCase], name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case(name).run(result)
    return result


def serve_until_stopped(stopped: threading.Event) -> None:
    lp.wait_for_stop()
    stopped.set()


def fail_soon() -> None:
    time.sleep(0.2)
    raise ValueError("a node of the test failed")


class SharesAnEvent(unittest.TestCase):
    """Launchpad's own test pattern: the node sets an Event the test waits for."""

    __test__ = False  # run by the tests below, which check what its cleanups did

    handles: list[lp.ProgramHandle] = []
    stopped = threading.Event()

    def test_node_sets_the_tests_event(self) -> None:
        has_run = threading.Event()
        program = lp.Program("test")
        program.add_node(lp.PyNode(has_run.set), label="run")
        program.add_node(lp.PyNode(serve_until_stopped, self.stopped), label="serve")
        self.handles.append(lp.launch(program, test_case=self))
        self.assertTrue(has_run.wait(WAIT_S))

    def test_node_fails(self) -> None:
        program = lp.Program("test")
        program.add_node(lp.PyNode(fail_soon), label="fail")
        self.handles.append(lp.launch(program, launch_type="test_mt", test_case=self))


def test_test_case_launches_test_mt_and_its_cleanup_ends_the_program() -> None:
    result = run_test_case(SharesAnEvent, "test_node_sets_the_tests_event")
    assert result.wasSuccessful(), result.errors + result.failures
    handle = SharesAnEvent.handles.pop()
    assert handle.launch_type == "test_mt"
    assert handle.grace_period == 2.0
    assert handle.done.is_set() and handle.error is None  # the cleanup stopped it and waited
    assert SharesAnEvent.stopped.is_set()


def test_test_case_cleanup_reraises_a_nodes_error() -> None:
    result = run_test_case(SharesAnEvent, "test_node_fails")
    assert len(result.errors) == 1, result.errors
    assert "ValueError: a node of the test failed" in result.errors[0][1]
    assert SharesAnEvent.handles.pop().done.is_set()


class Finalizers:
    """What ``lp.launch`` needs of pytest's ``request``: ``addfinalizer``."""

    def __init__(self) -> None:
        self.added: list[Any] = []

    def addfinalizer(self, finalizer: Any) -> None:
        self.added.append(finalizer)


def test_test_case_may_be_pytests_request() -> None:
    request = Finalizers()
    program = lp.Program("pytest")
    program.add_node(lp.PyNode(lp.wait_for_stop), label="serve")
    handle = lp.launch(program, launch_type="local_mp", test_case=request)
    assert handle.launch_type == "test_mp"
    assert not handle.done.wait(0.5)  # it serves until the test ends
    (finalizer,) = request.added
    finalizer()
    assert handle.done.is_set() and handle.error is None


def test_test_case_without_cleanups_is_refused() -> None:
    program = lp.Program("bad")
    program.add_node(lp.PyNode(lp.wait_for_stop), label="serve")
    with pytest.raises(TypeError, match="takes no cleanups; pass the unittest.TestCase"):
        lp.launch(program, test_case=object())


def test_serialize_py_nodes_false_runs_the_nodes_themselves() -> None:
    lock, seen = threading.Lock(), []  # a lock does not pickle; the list is the test's own

    def record() -> None:
        with lock:
            seen.append(threading.current_thread().name)

    def build() -> lp.Program:
        program = lp.Program("shared")
        program.add_node(lp.PyNode(record), label="record")
        return program

    with pytest.raises(TypeError, match=r"must pickle.*serialize_py_nodes=False"):
        lp.launch(build(), launch_type="local_mt")
    assert lp.launch(build(), launch_type="local_mt", serialize_py_nodes=False).wait(WAIT_S)
    assert seen == ["lp-record-0"]
    assert lp.launch(build(), launch_type="test_mt").wait(WAIT_S)  # test_mt's default
    assert seen == ["lp-record-0", "lp-record-0"]


def finish_after_stop(finished: threading.Event) -> None:
    lp.wait_for_stop()
    time.sleep(0.3)  # work that a stop without a grace period cuts short
    finished.set()


def ignore_stop() -> None:
    while True:
        time.sleep(0.02)


@pytest.mark.parametrize("grace_period", [None, 1.0])
def test_test_mt_stop_has_a_grace_period_then_wait_returns(grace_period: float | None) -> None:
    finished = threading.Event()  # test_mt runs the nodes themselves: they share it
    program = lp.Program("graceful")
    server = program.add_node(lp.CourierNode(Runner), label="server")
    program.add_node(lp.PyNode(finish_after_stop, finished), label="polite")
    program.add_node(lp.PyNode(ignore_stop), label="stubborn")
    handle = lp.launch(program, launch_type="test_mt", grace_period=grace_period)
    assert server.dereference().ping(3) == 3
    started = time.monotonic()
    handle.stop()
    assert handle.wait(WAIT_S)
    took = time.monotonic() - started
    expected = 2.0 if grace_period is None else grace_period
    assert handle.grace_period == expected
    assert expected - 0.2 < took < expected + 2.0, took  # the stubborn node was killed
    assert finished.is_set()


class Runner:
    def ping(self, x: Any) -> Any:
        return x


# -- the examples as Launchpad's tests launch them (test_mt) ------------------------------------


@needs_absl
def test_launchpad_style_hello_under_test_mt() -> None:
    from examples.launchpad import launchpad_style_hello as hello

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert lp.launch(hello.make_program(), launch_type="test_mt").wait(WAIT_S)
    assert out.getvalue() == "Hello World!!!\n"


class ConsumerSteps(unittest.TestCase):
    """Launchpad's consumer_producers launch_test, on the example here."""

    __test__ = False  # run by the test below

    results: list[list[int]] = []

    def test_consumer_steps(self) -> None:
        from examples.launchpad import launchpad_style_consumer_producers as example

        program = example.make_program(num_producers=2)
        (consumer_node,) = program.groups["consumer"]
        consumer_node.disable_run()
        lp.launch(program, launch_type="test_mt", test_case=self)
        consumer = consumer_node.create_handle().dereference()
        self.results.extend(consumer.step() for _ in range(10))


@needs_absl
def test_launchpad_style_consumer_producers_under_test_mt() -> None:
    result = run_test_case(ConsumerSteps, "test_consumer_steps")
    assert result.wasSuccessful(), result.errors + result.failures
    assert ConsumerSteps.results == CONSUMER_RESULTS
