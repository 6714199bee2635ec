"""Metrics, logs and job records of a real two-node cluster: ``rtml start --head`` and a
second node manager joined over TCP, each a separate process tree, with a driver that
runs tasks and an actor on the second node, fails one task, and has a 10 MB object
pulled across."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rtml import cluster as rtml_cluster
from tests.integration.test_cli import CLI_TIMEOUT, _env, _free_port, _stop, rtml

WORK = """
import sys
import numpy as np
import rtml

rtml.init(address="auto", log_to_driver=False)

@rtml.remote(resources={"other": 1})
def square(x):
    print(f"square-marker {x}", flush=True)
    return x * x

@rtml.remote(resources={"other": 1})
def fails():
    raise ValueError("meant to fail")

@rtml.remote(resources={"other": 1})
def total(arr):
    return int(arr.sum())

@rtml.remote(resources={"other": 1})
class Echo:
    def say(self, text):
        print(f"echo-marker {text}", flush=True)
        return text

assert rtml.get([square.remote(i) for i in range(20)]) == [i * i for i in range(20)]
try:
    rtml.get(fails.remote())
except Exception:
    pass
big = rtml.put(np.ones(10 * 1024 * 1024, dtype=np.uint8))  # on the head node
assert rtml.get(total.remote(big)) == 10 * 1024 * 1024
echo = Echo.remote()
print(rtml.get(echo.say.remote("first")), flush=True)
ref = square.remote(7)
print("task", ref.task_id().hex(), rtml.get(ref), flush=True)
print("actor", echo._actor_id.hex(), flush=True)
for line in sys.stdin:  # each line: said by the actor (the log test follows it)
    print(rtml.get(echo.say.remote(line.strip())), flush=True)
"""


@dataclass
class TwoNodes:
    cwd: Path
    head_dir: Path
    node_dir: Path
    token: str
    node_ip: str
    driver: subprocess.Popen[str]
    task_id: str
    actor_id: str

    def cli(self, *args: str, session: Path | None = None,
            ) -> subprocess.CompletedProcess[str]:
        return rtml(*args, "--session-dir", str(session or self.head_dir), cwd=self.cwd)

    def metrics_address(self, session: Path, process: str) -> str:
        record = json.loads((session / "session.json").read_text())
        return str(record["metrics"][process])

    def say(self, text: str) -> str:
        assert self.driver.stdin is not None and self.driver.stdout is not None
        self.driver.stdin.write(text + "\n")
        self.driver.stdin.flush()
        return self.driver.stdout.readline().strip()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    cwd = tmp_path_factory.mktemp("observability")
    head_dir, node_dir = cwd / "head", cwd / "node"
    node_ip = rtml_cluster.detect_node_ip()
    started = rtml("start", "--head", "--port", str(_free_port()), "--num-cpus", "1",
                   "--metrics-port", "0", "--session-dir", str(head_dir), cwd=cwd)
    assert started.returncode == 0, started.stderr
    assert "metrics (head): http://127.0.0.1:" in started.stdout
    values = dict(line.split("=", 1) for line in started.stdout.splitlines()
                  if line.startswith(("RTML_ADDRESS=", "RTML_TOKEN=")))
    driver = None
    try:
        joined = rtml("start", "--address", values["RTML_ADDRESS"], "--num-cpus", "2",
                      "--resources", '{"other": 2}', "--metrics-port", "0",
                      "--metrics-host", node_ip, "--session-dir", str(node_dir), cwd=cwd,
                      env=_env(RTML_TOKEN=values["RTML_TOKEN"]))
        assert joined.returncode == 0, joined.stderr
        assert f"metrics (node manager): http://{node_ip}:" in joined.stdout
        driver = subprocess.Popen([sys.executable, "-c", WORK], cwd=cwd, text=True,
                                  env=_env(RTML_SESSION_DIR=str(head_dir)),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "first", driver.stderr
        task = driver.stdout.readline().split()
        actor = driver.stdout.readline().split()
        assert task[0] == "task" and task[2] == "49" and actor[0] == "actor"
        yield TwoNodes(cwd, head_dir, node_dir, values["RTML_TOKEN"], node_ip, driver,
                       task[1], actor[1])
    finally:
        if driver is not None:
            driver.kill()
            driver.communicate(timeout=CLI_TIMEOUT)
        if (node_dir / "session.json").exists():
            _stop(node_dir, cwd)
        _stop(head_dir, cwd)


# -- metrics -----------------------------------------------------------------------------------

def _scrape(address: str, token: str = "") -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of ``http://address/metrics``, by sample name (parsed with
    prometheus_client's own parser)."""
    request = urllib.request.Request(f"http://{address}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
           **labels: str) -> float:
    matching = [v for got, v in samples.get(name, []) if labels.items() <= got.items()]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]


def _eventually(scrape: object, check: object, timeout: float = 10.0) -> dict:  # type: ignore[type-arg]
    """Scrape until ``check(samples)`` holds (counters reach the node manager with its
    next heartbeat); returns those samples."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape()  # type: ignore[operator]
        try:
            check(samples)  # type: ignore[operator]
            return samples  # type: ignore[no-any-return]
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def test_node_metrics_count_what_ran_there(two_nodes: TwoNodes) -> None:
    address = two_nodes.metrics_address(two_nodes.node_dir, "node_manager")
    assert address.startswith(f"{two_nodes.node_ip}:")
    nodes = json.loads(two_nodes.cli("list", "nodes", "--format", "json").stdout)
    assert address in [node.get("metrics_address") for node in nodes]  # for discovery

    def check(samples: dict) -> None:  # type: ignore[type-arg]
        assert _value(samples, "rtml_tasks_total", state="finished") >= 22  # 20 + 2 + actor
        assert _value(samples, "rtml_tasks_total", state="failed") >= 1
        assert _value(samples, "rtml_tasks_total", state="submitted") >= 23

    samples = _eventually(lambda: _scrape(address, two_nodes.token), check)
    assert _value(samples, "rtml_tasks_running") == 0
    ten_mb = 10 * 1024 * 1024
    assert _value(samples, "rtml_object_pulls_total") >= 1
    assert _value(samples, "rtml_object_pulled_bytes_total") >= ten_mb
    assert _value(samples, "rtml_object_pull_seconds_count") >= 1
    assert _value(samples, "rtml_object_pull_seconds_sum") > 0
    assert _value(samples, "rtml_lease_wait_seconds_count") >= 1
    assert _value(samples, "rtml_leases_granted_total") >= 1
    assert _value(samples, "rtml_workers", state="actor") == 1
    assert _value(samples, "rtml_workers", state="idle") + _value(
        samples, "rtml_workers", state="busy") >= 1
    assert _value(samples, "rtml_object_store_bytes", kind="capacity") > 0
    assert _value(samples, "rtml_object_store_bytes", kind="used") >= ten_mb  # its copy
    assert _value(samples, "rtml_lease_requests", where="queued") == 0
    assert _value(samples, "rtml_heartbeats_sent_total") >= 1


def test_head_metrics_see_both_nodes_and_their_tasks(two_nodes: TwoNodes) -> None:
    address = two_nodes.metrics_address(two_nodes.head_dir, "head")
    assert address.startswith("127.0.0.1:")
    node_id = json.loads((two_nodes.node_dir / "session.json").read_text())["node_id"]

    def check(samples: dict) -> None:  # type: ignore[type-arg]
        assert _value(samples, "rtml_cluster_tasks_total", node=node_id,
                      state="finished") >= 22

    samples = _eventually(lambda: _scrape(address), check)  # loopback: no token needed
    alive = samples["rtml_node_alive"]
    assert len(alive) == 2 and all(value == 1 for _, value in alive)
    assert _value(samples, "rtml_heartbeats_received_total", node=node_id) >= 1
    assert 0 <= _value(samples, "rtml_node_heartbeat_age_seconds", node=node_id) < 5
    assert _value(samples, "rtml_actors", state="ALIVE") == 1
    assert _value(samples, "rtml_jobs_running") == 1
    assert _value(samples, "rtml_spilled_leases_placed_total") >= 1  # "other": the 2nd node


def test_status_names_each_metrics_endpoint(two_nodes: TwoNodes) -> None:
    head = two_nodes.metrics_address(two_nodes.head_dir, "head")
    served = {json.loads((session / "session.json").read_text())["node_id"]:
              two_nodes.metrics_address(session, "node_manager")
              for session in (two_nodes.head_dir, two_nodes.node_dir)}
    for session in (two_nodes.head_dir, two_nodes.node_dir):  # (read from either node)
        status = two_nodes.cli("status", session=session)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert f"Metrics (head): http://{head}/metrics" in lines
        for node_id, address in served.items():
            at = next(i for i, line in enumerate(lines) if line.startswith(f"  node {node_id}"))
            assert lines[at + 2] == f"    metrics: http://{address}/metrics", lines[at:at + 3]
    assert _value(_scrape(head), "rtml_jobs_running") >= 1  # (the address serves)


def test_embedded_init_serves_metrics_where_asked(start_cluster: Any) -> None:
    from rtml import driver, get, remote  # (``rtml`` here runs the command line)
    from rtml.core.current import require_runtime

    bad: Any
    for bad in (-1, 65535, True, "9100"):
        with pytest.raises(ValueError, match="takes a port number"):
            driver.init(_metrics_export_port=bad)
    ctx = start_cluster(num_cpus=1, include_dashboard=False, _metrics_export_port=0)
    port = ctx["metrics_export_port"]
    assert isinstance(port, int) and port > 0

    @remote
    def one() -> int:
        return 1

    assert get([one.remote() for _ in range(3)]) == [1, 1, 1]

    def check(samples: dict) -> None:  # type: ignore[type-arg]
        assert _value(samples, "rtml_tasks_total", state="finished") >= 3

    _eventually(lambda: _scrape(f"127.0.0.1:{port}"), check)
    plane = require_runtime().plane  # (an embedded session has no record for `rtml status`)
    assert [n["metrics_address"] for n in plane.list_nodes()] == [f"127.0.0.1:{port}"]
    deadline = time.monotonic() + 10  # (the head records it from its writes thread)
    while not plane.head_metrics_address() and time.monotonic() < deadline:
        time.sleep(0.1)
    head = plane.head_metrics_address()
    assert head.startswith("127.0.0.1:") and head != f"127.0.0.1:{port}"
    assert _value(_scrape(head), "rtml_jobs_running") == 1
    driver.shutdown()
    with pytest.raises(ValueError, match="rtml start --metrics-port"):
        driver.init(address="127.0.0.1:1", _metrics_export_port=0)
    assert not driver.is_initialized()


def test_metrics_on_a_node_address_require_the_token(two_nodes: TwoNodes) -> None:
    address = two_nodes.metrics_address(two_nodes.node_dir, "node_manager")
    for header in ("", "Bearer not-the-token", f"Basic {two_nodes.token}"):
        request = urllib.request.Request(f"http://{address}/metrics")
        if header:
            request.add_header("Authorization", header)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        assert "Bearer" in refused.value.headers["WWW-Authenticate"]
        assert "rtml_" not in refused.value.read().decode()


def test_metrics_flags_are_checked(tmp_path: Path) -> None:
    for flags, words in ((["--metrics-host", "127.0.0.1"], "--metrics-port"),
                         (["--metrics-port", "0", "--metrics-host", "203.0.113.9"],
                          "not an address of this machine"),
                         (["--metrics-port", "70000"], "port number")):
        result = rtml("start", "--head", "--port", "0", *flags, "--session-dir",
                      str(tmp_path / "head"), cwd=tmp_path)
        assert result.returncode == 1, result.stdout
        assert words in result.stderr and "Traceback" not in result.stderr


# -- logs --------------------------------------------------------------------------------------

def test_logs_of_a_task_an_actor_a_pid_and_the_daemons(two_nodes: TwoNodes) -> None:
    task = two_nodes.cli("logs", "--task", two_nodes.task_id)
    assert task.returncode == 0, task.stderr
    assert "square-marker 7" in task.stdout and "-out.log on node" in task.stdout
    actor = two_nodes.cli("logs", "--actor", two_nodes.actor_id)
    assert actor.returncode == 0, actor.stderr
    assert "echo-marker first" in actor.stdout and "square-marker" not in actor.stdout
    listing = two_nodes.cli("logs")
    assert listing.returncode == 0, listing.stderr
    node_id = json.loads((two_nodes.node_dir / "session.json").read_text())["node_id"]
    assert f"node {node_id}" in listing.stdout and "head.log" in listing.stdout
    pids = [line.split("pid ")[1] for line in listing.stdout.splitlines()
            if "-out.log" in line and "pid " in line]
    by_pid = two_nodes.cli("logs", "--pid", pids[0])
    assert by_pid.returncode == 0 and "-out.log on node" in by_pid.stdout, by_pid.stderr
    worker = listing.stdout.split("worker-", 1)[1][:12]
    assert two_nodes.cli("logs", "--worker", worker, "--err").returncode == 0
    head = two_nodes.cli("logs", "head", "--tail", "1")
    assert head.returncode == 0, head.stderr
    assert "head.log on node" in head.stdout and len(head.stdout.splitlines()) == 2
    remote = two_nodes.cli("logs", "node-manager", "--node", node_id[:8])
    assert remote.returncode == 0, remote.stderr
    assert f"node_manager.log on node {node_id[:12]}" in remote.stdout
    assert "registered" in remote.stdout or "INFO" in remote.stdout


def test_logs_follow_an_actor_as_it_prints(two_nodes: TwoNodes) -> None:
    follow = subprocess.Popen(
        [sys.executable, "-m", "rtml.cli.main", "logs", "--actor", two_nodes.actor_id,
         "--follow", "--session-dir", str(two_nodes.head_dir)], cwd=two_nodes.cwd,
        env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert follow.stdout is not None
        assert "-out.log on node" in follow.stdout.readline()
        assert two_nodes.say("followed-line") == "followed-line"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if "echo-marker followed-line" in follow.stdout.readline():
                break
        else:
            raise AssertionError("--follow did not print the new line")
    finally:
        follow.send_signal(signal.SIGINT)
        follow.communicate(timeout=CLI_TIMEOUT)
    assert follow.returncode == 130


def test_log_reads_stay_inside_the_logs_directory(two_nodes: TwoNodes) -> None:
    from rtml.control_plane import ControlPlane, RedisAddress
    from rtml.exceptions import LogNotFoundError, RtmlSystemError
    from rtml.logs import MAX_CHUNK, LogReader, LogSource

    record = json.loads((two_nodes.head_dir / "session.json").read_text())
    plane = ControlPlane.at(RedisAddress.from_info(record), two_nodes.token)
    logs = two_nodes.node_dir / "logs"
    os.symlink(two_nodes.node_dir / "token", logs / "planted.log")
    (logs / "big.log").write_bytes(b"x" * (3 * MAX_CHUNK))
    try:
        reader = LogReader(plane, two_nodes.token)
        (node,) = [n for n in reader.nodes() if n["session_dir"] == str(two_nodes.node_dir)]
        assert "planted.log" not in [f.name for f in reader.files(node)]
        source = LogSource(node["NodeID"], node["NodeManagerAddress"], "")
        for name in ("../token", "/etc/passwd", "..", ".", "", "sub/../../token",
                     "planted.log"):
            with pytest.raises(LogNotFoundError) as refused:
                reader.read(LogSource(source.node_id, source.address, name), 0)
            assert two_nodes.token not in str(refused.value)
        chunk = reader.read(LogSource(source.node_id, source.address, "big.log"), 0, 1 << 30)
        assert len(chunk.data) == MAX_CHUNK and chunk.size == 3 * MAX_CHUNK
        with pytest.raises(RtmlSystemError, match="token"):
            LogReader(plane, "wrong-token").files(node)
    finally:
        plane.close()
        (logs / "planted.log").unlink()
        (logs / "big.log").unlink()


# -- job records -------------------------------------------------------------------------------

def test_jobs_of_drivers_on_another_node_end_when_they_exit_or_die(two_nodes: TwoNodes) -> None:
    code = ('import os, sys, rtml\nrtml.init(address="auto")\nprint(os.getpid(), '
            'rtml.get(rtml.put(5)), flush=True)\nif sys.argv[1] == "kill":\n'
            '    os.kill(os.getpid(), 9)\n')
    pids = []
    for how in ("exit", "kill"):  # drivers of the second node's session
        driver = subprocess.run([sys.executable, "-c", code, how], cwd=two_nodes.cwd,
                                env=_env(RTML_SESSION_DIR=str(two_nodes.node_dir)),
                                capture_output=True, text=True, timeout=CLI_TIMEOUT)
        pid, value = driver.stdout.split()
        assert value == "5", driver.stderr
        assert driver.returncode == (0 if how == "exit" else -signal.SIGKILL)
        pids.append(int(pid))
    deadline = time.monotonic() + 10
    while True:  # (Ray's columns: a driver's pid in driver_info, as a string)
        jobs = json.loads(two_nodes.cli("list", "jobs", "--detail", "--format",
                                        "json").stdout)
        ours = [job for job in jobs if int(job["driver_info"]["pid"]) in pids]
        if len(ours) == 2 and all(job["status"] == "SUCCEEDED" for job in ours):
            break
        assert time.monotonic() < deadline, ours
        time.sleep(0.2)
    for job in ours:
        assert job["end_time"] >= job["start_time"] > 0
    running = [int(job["driver_info"]["pid"]) for job in jobs if job["status"] == "RUNNING"]
    assert running == [two_nodes.driver.pid]  # the fixture's driver, still connected
