"""Replaying past tasks from the control plane's lineage: ``rtml.debug.replay`` in this
process (an embedded cluster), and ``rtml debug TASK_ID`` under pdb in a terminal that
reads its commands from stdin (a daemon cluster)."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import numpy as np
import pytest

import rtml
from rtml.core.kept_calls import CALL_ARGS_KEPT
from rtml.debug import replay
from rtml.exceptions import ReplayError
from tests.integration.test_cli import CLI_TIMEOUT, Head, _env, head  # noqa: F401 - fixture


@rtml.remote
def scaled_sum(values, scale=1, *, offset=0):
    return sum(values) * scale + offset


@rtml.remote
def raises_on(x):
    raise KeyError(f"no key {x}")


@rtml.remote
def array_total(arr):
    return int(arr.sum())


@rtml.remote
class Counter:
    def incr(self, by):
        return by


def test_replay_returns_the_value_of_the_call(cluster: None) -> None:
    ref = scaled_sum.remote([1, 2, 3], scale=10, offset=4)
    assert rtml.get(ref) == 64
    assert replay(ref, debugger=False) == 64
    assert replay(ref.task_id().hex(), pdb=False) == 64


def test_replay_raises_what_the_task_raised(cluster: None) -> None:
    ref = raises_on.remote("k")
    with pytest.raises(rtml.exceptions.TaskError):
        rtml.get(ref)
    with pytest.raises(KeyError, match="no key k"):
        replay(ref, debugger=False)


def test_replay_reads_a_store_argument_while_it_lives(cluster: None) -> None:
    arr = rtml.put(np.arange(300_000, dtype=np.int64))  # in the object store
    ref = array_total.remote(arr)
    expected = int(np.arange(300_000, dtype=np.int64).sum())
    assert rtml.get(ref) == expected
    assert replay(ref, debugger=False) == expected
    del arr
    with pytest.raises(ReplayError, match="no longer exists: it was freed"):
        for _ in range(50):  # the node's object table forgets it at its next heartbeat
            replay(ref, debugger=False)
            time.sleep(0.1)


def test_replay_refuses_what_it_cannot_rebuild(cluster: None) -> None:
    big = scaled_sum.remote(list(range(CALL_ARGS_KEPT)))  # inline, over the cap
    rtml.get(big)
    with pytest.raises(ReplayError, match="over the .* bytes a task record keeps"):
        replay(big, debugger=False)
    counter = Counter.remote()
    call = counter.incr.remote(1)
    assert rtml.get(call) == 1
    with pytest.raises(ReplayError, match="actor's method"):
        replay(call, debugger=False)
    calls = [e for e in rtml.timeline() if e.get("cat") == "actor_call"]
    assert any("incr" in e["name"] for e in calls)  # marked as an actor call, not a task
    with pytest.raises(ReplayError, match="no task"):
        replay("00" * 16, debugger=False)
    with pytest.raises(ReplayError, match="not a task id"):
        replay("not-hex", debugger=False)


def test_replay_under_pdb_reads_its_commands(cluster: None) -> None:
    ref = scaled_sum.remote([5], scale=2)
    rtml.get(ref)
    out = io.StringIO()
    assert replay(ref, stdin=io.StringIO("p values\nc\n"), stdout=out) == 10
    text = out.getvalue()
    assert "Replaying task 'scaled_sum'" in text and "[5]" in text
    assert "return sum(values) * scale + offset" in text  # pdb stopped at its first line


DRIVER = """
import rtml
rtml.init(address="auto", log_to_driver=False)

@rtml.remote
def divide(a, b):
    quotient = a / b
    return quotient

ok, bad = divide.remote(84, 2), divide.remote(1, 0)
rtml.wait([bad])  # it ran (and failed): its record has its call
print(ok.task_id().hex(), bad.task_id().hex(), rtml.get(ok), flush=True)
"""


def test_rtml_debug_runs_a_task_under_pdb_in_the_terminal(head: Head) -> None:  # noqa: F811
    script = head.cwd / "divide.py"  # a file: pdb shows the function's source
    script.write_text(DRIVER)
    driver = subprocess.run([sys.executable, str(script)], cwd=head.cwd, text=True,
                            env=_env(RTML_SESSION_DIR=str(head.session_dir)),
                            capture_output=True, timeout=CLI_TIMEOUT)
    assert driver.returncode == 0, driver.stderr
    ok, bad, value = driver.stdout.split()
    assert value == "42.0"

    def debug(task_id: str, commands: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rtml.cli.main", "debug", task_id,
                               "--session-dir", str(head.session_dir)], cwd=head.cwd,
                              input=commands, env=_env(), capture_output=True, text=True,
                              timeout=CLI_TIMEOUT)

    result = debug(ok, "n\np quotient\nc\n")
    assert result.returncode == 0, result.stderr
    assert "-> quotient = a / b" in result.stdout  # stopped at its first line
    assert "(Pdb) 42.0" in result.stdout.replace("(Pdb) (Pdb)", "(Pdb)")  # `p quotient`
    assert result.stdout.rstrip().endswith("result: 42.0")
    failed = debug(bad, "c\nq\n")
    assert failed.returncode == 1
    assert "raised ZeroDivisionError: division by zero; post-mortem" in failed.stdout
    assert "task raised ZeroDivisionError" in failed.stdout
    assert "ZeroDivisionError" in failed.stderr  # its traceback
    unknown = debug("ab" * 16, "")
    assert unknown.returncode == 1 and "no task" in unknown.stderr
    assert "Traceback" not in unknown.stderr
