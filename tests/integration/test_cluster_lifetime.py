"""What outlives a driver on a CLI-started cluster, and what does not.

Each test starts ``rtml start --head`` in its own session directory (the ``head``
fixture of test_cli.py, reused) and runs drivers as subprocesses with
``RTML_SESSION_DIR`` set, so every driver is a separate job.
"""

from __future__ import annotations

import json
import subprocess
import time

import test_cli
from test_cli import CLI_TIMEOUT, Head

head = test_cli.head  # the fixture: a CLI-started head in a fresh session dir

PRELUDE = """
import sys
import time
import rtml

@rtml.remote
class Keeper:
    def __init__(self):
        self.items = []

    def add(self, item):
        self.items.append(item)
        return list(self.items)

    def items_(self):
        return list(self.items)

    def pid(self):
        import os
        return os.getpid()


def gone_within(name, seconds, namespace=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            rtml.get_actor(name, namespace=namespace)
        except ValueError:
            return True
        time.sleep(0.1)
    return False
"""


def _run(head: Head, body: str) -> list[str]:
    """Run a driver (PRELUDE + ``body``) to completion; its stdout lines."""
    driver = head.driver(PRELUDE + body)
    out, err = driver.communicate(timeout=CLI_TIMEOUT)
    assert driver.returncode == 0, f"driver failed:\n{err}"
    return out.split()


def test_detached_actor_outlives_its_driver_and_keeps_state(head: Head) -> None:
    first = _run(head, """
rtml.init(address="auto", namespace="kept")
keeper = Keeper.options(name="keeper", lifetime="detached").remote()
print(len(rtml.get(keeper.add.remote("kept"))))
temp = Keeper.options(name="temp").remote()
print(len(rtml.get(temp.add.remote("lost"))))
rtml.shutdown()
""")
    assert first == ["1", "1"]
    second = _run(head, """
rtml.init(address="auto", namespace="kept")
keeper = rtml.get_actor("keeper")
print(",".join(rtml.get(keeper.items_.remote())))
print("temp-gone" if gone_within("temp", 5.0) else "temp-alive")
rtml.shutdown()
""")
    assert second == ["kept", "temp-gone"]

    actors = {a["name"]: a for a in json.loads(
        head.cli("list", "actors", "--detail", "--format", "json").stdout)}
    assert actors["keeper"]["state"] == "ALIVE" and actors["keeper"]["is_detached"] is True
    assert actors["temp"]["state"] == "DEAD"
    # Its driver's exit ends it twice over (its job ended; its handles, held by the
    # driver, are gone): whichever the head hears first is the reason recorded.
    why = actors["temp"]["death_cause"]["actor_died_error_context"]["error_message"]
    assert any(reason in why for reason in ("driver exited", "out of scope"))


def test_named_actors_are_per_namespace_and_get_if_exists_reuses(head: Head) -> None:
    in_a = _run(head, """
rtml.init(address="auto", namespace="a")
same = Keeper.options(name="same", lifetime="detached").remote()
print(len(rtml.get(same.add.remote("a"))))
rtml.shutdown()
""")
    assert in_a == ["1"]
    in_b = _run(head, """
rtml.init(address="auto", namespace="b")
try:
    rtml.get_actor("same")
    print("visible-in-b")
except ValueError:
    print("absent-in-b")
mine = Keeper.options(name="same", lifetime="detached").remote()
print(len(rtml.get(mine.add.remote("b"))))
again = Keeper.options(name="same", get_if_exists=True).remote()
print(len(rtml.get(again.add.remote("b2"))))
try:
    Keeper.options(name="same").remote()
    print("duplicate-accepted")
except ValueError:
    print("duplicate-refused")
theirs = rtml.get_actor("same", namespace="a")
print(",".join(rtml.get(theirs.items_.remote())))
rtml.shutdown()
""")
    assert in_b == ["absent-in-b", "1", "2", "duplicate-refused", "a"]


def test_a_job_without_a_namespace_gets_an_anonymous_one_of_its_own(head: Head) -> None:
    # As Ray: its named actors are found by its own tasks and actors, and by no other job.
    first = _run(head, """
rtml.init(address="auto")
ns = rtml.get_runtime_context().namespace
print(ns.startswith("anonymous-") and len(ns) > 20)
mine = Keeper.options(name="mine", lifetime="detached").remote()
rtml.get(mine.add.remote("x"))

@rtml.remote
def find():
    return len(rtml.get(rtml.get_actor("mine").add.remote("from a task")))

print(rtml.get(find.remote()))
print(ns)
""")
    assert first[:2] == ["True", "2"]
    second = _run(head, f"""
rtml.init(address="auto")
try:
    rtml.get_actor("mine")
    print("visible")
except ValueError:
    print("absent")
print(len(rtml.get(rtml.get_actor("mine", namespace={first[2]!r}).add.remote("y"))))
rtml.kill(rtml.get_actor("mine", namespace={first[2]!r}))
""")
    assert second == ["absent", "3"]


def test_pool_replaces_a_crashed_worker(head: Head) -> None:
    out = _run(head, """
import os
rtml.init(address="auto")

@rtml.remote(max_retries=0)
def crash():
    os._exit(1)

@rtml.remote
def ok():
    return 1

rtml.get([ok.remote() for _ in range(4)])
before = rtml.api._store_stats()["num_workers"]
try:
    rtml.get(crash.remote())
    print("no-error")
except rtml.exceptions.WorkerCrashedError:
    print("crashed")
deadline = time.monotonic() + 5.0
while rtml.api._store_stats()["num_workers"] != before and time.monotonic() < deadline:
    time.sleep(0.1)
print(before, rtml.api._store_stats()["num_workers"])
print(rtml.get(ok.remote()))
rtml.shutdown()
""")
    assert out[0] == "crashed"
    assert out[1] == out[2] and int(out[1]) >= 1
    assert out[3] == "1"


def test_pending_tasks_of_an_exited_driver_are_failed(head: Head) -> None:
    out = _run(head, """
rtml.init(address="auto")

@rtml.remote
def needs_nothing():
    return 1

ref = needs_nothing.options(resources={"nothing": 1}).remote()
ready, _ = rtml.wait([ref], timeout=0.3)
print(len(ready))
rtml.shutdown()
""")
    assert out == ["0"]
    failed = _tasks_named(head, "needs_nothing", "FAILED")
    assert [t["error_type"] for t in failed] == ["OWNER_DIED"]


def _tasks_named(head: Head, name: str, state: str) -> list[dict[str, object]]:
    """The tasks called ``name`` once they are in ``state`` (waits up to ~5 s)."""
    deadline = time.monotonic() + 5.0
    while True:
        listed = head.cli("list", "tasks", "--filter", f"name={name}", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        tasks = json.loads(listed.stdout)
        if (tasks and all(t["state"] == state for t in tasks)) \
                or time.monotonic() > deadline:
            assert tasks and all(t["state"] == state for t in tasks), tasks
            return tasks
        time.sleep(0.2)


def test_crashed_driver_subprocess_does_not_break_the_cluster(head: Head) -> None:
    driver = head.driver(PRELUDE + """
import os
rtml.init(address="auto")
print("up", flush=True)
os._exit(3)
""", stdin=subprocess.DEVNULL)
    out, _ = driver.communicate(timeout=CLI_TIMEOUT)
    assert driver.returncode == 3 and out.strip() == "up"
    assert _run(head, """
rtml.init(address="auto")
print(rtml.get(Keeper.remote().add.remote(1)))
rtml.shutdown()
""") == ["[1]"]


def test_an_actor_created_inside_a_task_ends_with_its_job(head: Head) -> None:
    (pid,) = _run(head, """
import os

@rtml.remote
def start_one():
    keeper = Keeper.options(name="made-in-a-task").remote()
    return rtml.get(keeper.pid.remote())

rtml.init(address="auto")
print(rtml.get(start_one.remote()))
rtml.shutdown()
""")
    import psutil

    deadline = time.monotonic() + 30
    while psutil.pid_exists(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(int(pid)), "the actor outlived the job that made it"


def test_a_job_whose_driver_exited_or_died_is_recorded_ended(head: Head) -> None:
    _run(head, 'rtml.init(address="auto")\nprint(rtml.get(rtml.put(1)))\n')  # exits
    killed = head.driver('import os, rtml\nrtml.init(address="auto")\nprint(1, flush=True)\n'
                         'os.kill(os.getpid(), 9)\n')
    killed.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while True:
        listed = head.cli("list", "jobs", "--detail", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        jobs = json.loads(listed.stdout)
        if len(jobs) == 2 and all(job["status"] == "SUCCEEDED" for job in jobs):
            break
        assert time.monotonic() < deadline, jobs
        time.sleep(0.1)
    for job in jobs:
        assert job["end_time"] >= job["start_time"]
