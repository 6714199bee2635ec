"""``rtml start --head`` runs the head under the ``rtml.head.supervisor`` daemon: a head
service SIGKILLed is started again, the node manager and a connected driver carry on, and
``rtml stop`` stops the supervisor with the head it runs now."""

from __future__ import annotations

import json
import signal
import time

import psutil
import test_cli
from test_cli import Head

head = test_cli.head  # the fixture: a CLI-started head in a fresh session dir

DRIVER = """
import sys, rtml
rtml.init(address="auto")

@rtml.remote
def square(x):
    return x * x

@rtml.remote
class Counter:
    def __init__(self):
        self.n = 0
    def add(self):
        self.n += 1
        return self.n

counter = Counter.options(name="c", lifetime="detached").remote()
print(rtml.get(counter.add.remote()), flush=True)
sys.stdin.readline()  # the head is killed now
print(sum(rtml.get([square.remote(i) for i in range(100)])), flush=True)
print(rtml.get(rtml.get_actor("c").add.remote()), flush=True)
print(len([n for n in rtml.nodes() if n["Alive"]]), flush=True)
rtml.kill(counter)
rtml.shutdown()
"""


def head_service(session_dir) -> psutil.Process:
    record = json.loads((session_dir / "session.json").read_text())
    (supervisor,) = [p for p in record["processes"] if p["name"] == "supervisor"]
    children = psutil.Process(supervisor["pid"]).children()  # the head and the dashboard
    (child,) = [c for c in children if "rtml.head.main" in c.cmdline()]
    return child


def run_driver_through(head: Head, fault) -> None:
    """Run DRIVER: it makes a named actor, ``fault()`` strikes, then it uses the cluster."""
    driver = head.driver(DRIVER, stdin=-1)
    try:
        assert driver.stdout.readline().strip() == "1"
        fault()
        driver.stdin.write("\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=90)
    finally:
        driver.kill()
    assert driver.returncode == 0, err
    assert out.split() == [str(sum(i * i for i in range(100))), "2", "1"]


def test_a_killed_head_service_is_started_again_and_the_cluster_carries_on(
        head: Head) -> None:
    old = head_service(head.session_dir)
    run_driver_through(head, lambda: old.send_signal(signal.SIGKILL))
    deadline = time.monotonic() + 10
    while head_service(head.session_dir).pid == old.pid:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = head.cli("status")
    assert status.returncode == 0, status.stderr
    assert head.address in status.stdout


def test_rtml_start_head_again_takes_over_when_the_supervisor_died_too(head: Head) -> None:
    def kill_supervisor_then_start_again() -> None:
        record = json.loads((head.session_dir / "session.json").read_text())
        (supervisor,) = [p for p in record["processes"] if p["name"] == "supervisor"]
        old = head_service(head.session_dir)
        psutil.Process(supervisor["pid"]).send_signal(signal.SIGKILL)  # its head dies too
        old.wait(timeout=10)
        again = head.cli("start", "--head")
        assert again.returncode == 0, again.stderr
        assert f"RTML_ADDRESS={head.address}" in again.stdout

    run_driver_through(head, kill_supervisor_then_start_again)
    # Once taken over, starting again is refused as usual.
    refused = head.cli("start", "--head")
    assert refused.returncode != 0 and "already running" in refused.stderr
