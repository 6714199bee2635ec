"""Redis that dies is started again on its port from its append-only file, and nothing
is lost meanwhile (issue 16, item 2): lineage, actor records and job ends wait for it;
a function exported during the outage reaches the workers at once (its owner sends it);
actors created, restarted or ended during it are. Embedded (the driver's keeper thread restarts Redis; the outage is
stretched to 3 s by delaying the restart) and under ``rtml start --head`` (the
supervisor daemon restarts it; ``rtml stop`` stops the new one). A Redis the user runs
(``--redis-address``) is used as it is: rtml starts, restarts and stops none."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import test_cli
from test_cli import Head

import rtml
from rtml import cluster, driver
from rtml.control_plane import ControlPlane, RedisProcess
from rtml.control_plane.resp import RespClient
from rtml.core import current

OUTAGE = 3.0

head = test_cli.head  # the fixture: a CLI-started head in a fresh session dir


@pytest.fixture
def slow_restart(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """An embedded cluster whose Redis, once killed, is started again OUTAGE s later;
    the event is set once it is back."""
    if rtml.is_initialized():
        rtml.shutdown()
    back = threading.Event()
    start = cluster.start_redis

    def late_start(**kwargs: Any) -> Any:
        time.sleep(OUTAGE)
        redis = start(**kwargs)
        back.set()
        return redis

    rtml.init(num_cpus=2)
    monkeypatch.setattr(cluster, "start_redis", late_start)
    try:
        yield back
    finally:
        rtml.shutdown()


@rtml.remote
def square(x: int) -> int:
    return x * x


@rtml.remote(max_restarts=1)
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n

    def pid(self) -> int:
        return os.getpid()


def _kill_redis() -> int:
    started = driver._embedded
    assert started is not None and started.keeper is not None
    pid = started.keeper.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def test_work_goes_on_through_a_redis_outage_and_nothing_is_lost(
        slow_restart: threading.Event) -> None:
    runtime = current.require_runtime()
    restarted = Counter.remote()
    first_pid = rtml.get(restarted.pid.remote())
    before = rtml.get([square.remote(i) for i in range(100)])
    killed = _kill_redis()
    start = time.monotonic()

    @rtml.remote
    def cube(x: int) -> int:  # exported while Redis is away: the workers still load it
        return x ** 3

    refs = [square.remote(i) for i in range(2000)]
    cubes = cube.remote(3)
    named = Counter.options(name="made-in-the-outage").remote()
    os.kill(first_pid, signal.SIGKILL)  # an actor restarts while Redis is away
    assert rtml.get(refs, timeout=60) == [i * i for i in range(2000)]
    # The new function's workers got it from its owner: Redis had not seen it yet.
    assert rtml.get(cubes, timeout=60) == 27
    assert not slow_restart.is_set()  # tasks ran on while Redis was away
    assert time.monotonic() - start < OUTAGE
    # The actors' fresh workers load their class once Redis is back.
    assert rtml.get(named.add.remote(), timeout=60) == 1
    assert rtml.get(restarted.add.remote(), timeout=60) == 1  # a fresh instance
    assert before == [i * i for i in range(100)]
    assert slow_restart.wait(30)
    assert driver._embedded is not None and driver._embedded.keeper is not None
    assert driver._embedded.keeper.pid != killed
    deadline = time.monotonic() + 30
    while True:  # the records kept meanwhile reach Redis
        runtime.writer.flush()
        tasks = runtime.plane.list_tasks()
        actors = {a["name"]: a for a in runtime.plane.list_actors() if a.get("name")}
        if len(tasks) >= 2101 + 3 and "made-in-the-outage" in actors:
            break
        assert time.monotonic() < deadline, (len(tasks), sorted(actors))
        time.sleep(0.2)
    assert sum(t["status"] == "FINISHED" for t in tasks) >= 2101
    assert actors["made-in-the-outage"]["state"] == "ALIVE"
    assert rtml.get(rtml.get_actor("made-in-the-outage").add.remote(), timeout=30) == 2


def test_the_supervisor_daemon_starts_redis_again_and_rtml_stop_stops_it(
        head: Head) -> None:
    record_file = head.session_dir / "session.json"

    def redis_pid() -> int:
        record = json.loads(record_file.read_text())
        (redis,) = [p for p in record["processes"] if p["name"] == "redis"]
        return int(redis["pid"])

    old = redis_pid()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while redis_pid() == old:
        assert time.monotonic() < deadline, "the supervisor did not start Redis again"
        time.sleep(0.1)
    new = psutil.Process(redis_pid())
    assert new.name() == "valkey-server"
    driver = head.driver("import rtml\nrtml.init(address='auto')\n"
                         "@rtml.remote\ndef f(x):\n    return x + 1\n"
                         "print(rtml.get(f.remote(41)))\nrtml.shutdown()\n")
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 0, err
    assert out.split() == ["42"]
    stopped = head.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    new.wait(10)
    assert not new.is_running()


@pytest.fixture
def users_redis(plain_redis: RedisProcess) -> tuple[RedisProcess, str]:
    """A Redis the user runs (not rtml's), with an ACL user for rtml; its URL."""
    client = RespClient(plain_redis.host, plain_redis.port, plain_redis.password)
    client.execute("ACL", "SETUSER", "rtml", "on", ">rtml-pw", "~*", "+@all")
    client.close()
    return plain_redis, f"redis://rtml:rtml-pw@{plain_redis.host}:{plain_redis.port}"


def test_a_head_on_the_users_own_redis_starts_none_and_leaves_it_running(
        users_redis: tuple[RedisProcess, str], tmp_path: Path) -> None:
    server, url = users_redis
    session_dir = tmp_path / "head"
    started = test_cli.rtml("start", "--head", "--port", str(test_cli._free_port()),
                            "--num-cpus", "2", "--session-dir", str(session_dir),
                            "--redis-address", url, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert f"Redis at {server.host}:{server.port} (yours" in started.stdout
    try:
        record = json.loads((session_dir / "session.json").read_text())
        assert "redis" not in {p["name"] for p in record["processes"]}
        values = dict(line.split("=", 1) for line in started.stdout.splitlines()
                      if line.startswith(("RTML_ADDRESS=", "RTML_TOKEN=")))
        head = Head(session_dir, tmp_path, values["RTML_ADDRESS"], values["RTML_TOKEN"],
                    started.stdout)
        run_driver_through_head_kill(head)
        plane = ControlPlane(server.host, server.port, "rtml-pw", user="rtml")
        deadline = time.monotonic() + 10  # the head records the job's end as it writes:
        while not any(job["IsDead"] for job in plane.list_jobs()):  # after the driver left
            assert time.monotonic() < deadline, plane.list_jobs()  # rtml wrote there
            time.sleep(0.05)
        plane.close()
    finally:
        test_cli._stop(session_dir, tmp_path)
    assert server.proc.poll() is None  # the user's Redis runs on


def test_a_bad_redis_address_is_refused_saying_why(users_redis: tuple[RedisProcess, str],
                                                    tmp_path: Path) -> None:
    server, url = users_redis
    hung = socket.create_server(("127.0.0.1", 0))  # takes connections, never answers
    try:
        for address, why in (
                (url.replace("rtml-pw", "wrong"), "rejected the login of user 'rtml'"),
                (f"redis://{server.host}", "names no port"),
                (f"rediss://{server.host}:{server.port}", "speaks TLS"),
                (f"redis://127.0.0.1:{hung.getsockname()[1]}", "did not answer in time")):
            refused = test_cli.rtml("start", "--head", "--port", str(test_cli._free_port()),
                                    "--session-dir", str(tmp_path / "refused"),
                                    "--redis-address", address, cwd=tmp_path)
            assert refused.returncode != 0 and why in refused.stderr, refused.stderr
            assert "--redis-address" in refused.stderr
            assert not (tmp_path / "refused" / "session.json").exists()
    finally:
        hung.close()


def run_driver_through_head_kill(head: Head) -> None:
    """A driver's task runs, the head service is SIGKILLed and comes back (reading the
    user's Redis), and the driver's next task and actor run."""
    from test_head_restart_daemon import head_service, run_driver_through

    old = head_service(head.session_dir)
    run_driver_through(head, lambda: old.send_signal(signal.SIGKILL))
