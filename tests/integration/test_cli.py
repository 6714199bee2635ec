"""The ``rtml`` command line against real processes, one session directory per test."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

CLI_TIMEOUT = 60.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RTML_ADDRESS", "RTML_TOKEN", "RTML_SESSION_DIR")}
    return {**env, **extra}


def rtml(*args: str, cwd: Path, env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rtml.cli.main", *args], cwd=cwd,
                          env=env or _env(), capture_output=True, text=True,
                          timeout=CLI_TIMEOUT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop(session_dir: Path, cwd: Path) -> None:
    """``rtml stop`` and check that every recorded process (and its children) is gone."""
    record = json.loads((session_dir / "session.json").read_text()) \
        if (session_dir / "session.json").exists() else {"pids": []}
    children = []
    for pid in record["pids"]:
        try:
            children += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    result = rtml("stop", "--session-dir", str(session_dir), cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert [pid for pid in record["pids"] if _running(pid)] == []
    deadline = time.monotonic() + 5.0  # workers exit once their node manager is gone
    while any(_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in children if _running(pid)] == []
    assert not (session_dir / "session.json").exists()


@dataclass
class Head:
    session_dir: Path
    cwd: Path
    address: str
    token: str
    stdout: str

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return rtml(*args, "--session-dir", str(self.session_dir), cwd=self.cwd)

    def driver(self, code: str, **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", code], cwd=self.cwd, text=True,
                                env=_env(RTML_SESSION_DIR=str(self.session_dir)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                **kwargs)  # type: ignore[call-overload]


def started_head(started: subprocess.CompletedProcess[str], session_dir: Path,
                 cwd: Path) -> Head:
    """The head ``rtml start --head`` reported in ``started`` (which must have succeeded)."""
    assert started.returncode == 0, started.stderr
    values = dict(line.split("=", 1) for line in started.stdout.splitlines()
                  if line.startswith(("RTML_ADDRESS=", "RTML_TOKEN=")))
    return Head(session_dir, cwd, values["RTML_ADDRESS"], values["RTML_TOKEN"], started.stdout)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    session_dir = tmp_path / "head"
    result = rtml("start", "--head", "--port", str(_free_port()), "--num-cpus", "2",
                  "--session-dir", str(session_dir), cwd=tmp_path)
    try:
        yield started_head(result, session_dir, tmp_path)
    finally:
        _stop(session_dir, tmp_path)


DRIVER = """
import rtml
rtml.init(address="auto")

@rtml.remote
def add_one(x):
    return x + 1

print(rtml.get(add_one.remote(41)))
rtml.shutdown()
"""

ACCEL_DRIVER = """
import rtml
rtml.init(address="auto")

@rtml.remote(resources={"accel": 1})
def where(x):
    return rtml.get_runtime_context().get_node_id(), x + 1

node, value = rtml.get(where.remote(2))
print(node, value)
rtml.shutdown()
"""

PENDING_DRIVER = """
import sys
import rtml
rtml.init(address="auto")

@rtml.remote
def needs_nothing():
    return 1

ref = needs_nothing.options(resources={"nothing": 1}).remote()
ready, _ = rtml.wait([ref], timeout=0.5)
print("submitted", len(ready), flush=True)
sys.stdin.readline()  # stay connected (the demand is this driver's) until the test is done
"""


def _lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_start_head_status_driver_and_list(head: Head) -> None:
    assert len(_lines(head.stdout, "RTML_ADDRESS=")) == 1
    assert len(_lines(head.stdout, "RTML_TOKEN=")) == 1
    assert 'rtml.init(address="auto")' in head.stdout
    assert f"rtml start --address {head.address}" in head.stdout
    assert stat.S_IMODE(head.session_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((head.session_dir / "token").stat().st_mode) == 0o600
    assert (head.session_dir / "token").read_text().strip() == head.token

    status = head.cli("status")
    assert status.returncode == 0, status.stderr
    assert "1 alive node(s)" in status.stdout
    assert "CPU 0/2" in status.stdout
    assert "metrics" not in status.stdout.lower()  # (none served without --metrics-port)

    driver = head.driver(DRIVER)
    out, err = driver.communicate(timeout=CLI_TIMEOUT)
    assert driver.returncode == 0, err
    assert out.strip() == "42"

    nodes = head.cli("list", "nodes", "--format", "json")
    assert nodes.returncode == 0, nodes.stderr
    parsed = json.loads(nodes.stdout)
    assert [n["state"] for n in parsed] == ["ALIVE"]
    assert parsed[0]["resources_total"]["CPU"] == 2.0

    tasks = head.cli("list", "tasks", "--filter", "state=FINISHED")
    assert tasks.returncode == 0, tasks.stderr
    assert "add_one" in tasks.stdout and "FINISHED" in tasks.stdout
    assert head.cli("list", "jobs").returncode == 0

    trace = head.cwd / "trace.json"
    assert head.cli("timeline", "-o", str(trace)).returncode == 0
    events = [e for e in json.loads(trace.read_text()) if e.get("cat") == "task"]
    assert [e["name"] for e in events] == ["add_one"]
    assert events[0]["ph"] == "X" and events[0]["dur"] >= 0


def test_second_start_in_a_running_session_is_refused(head: Head) -> None:
    again = rtml("start", "--head", "--port", "0", "--session-dir", str(head.session_dir),
                 cwd=head.cwd)
    assert again.returncode == 1
    assert "already running" in again.stderr and "rtml stop" in again.stderr
    assert "Traceback" not in again.stderr


def test_infeasible_task_shows_as_pending_demand(head: Head) -> None:
    driver = head.driver(PENDING_DRIVER, stdin=subprocess.PIPE)
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "submitted 0"
        deadline = time.monotonic() + 5.0
        status = head.cli("status")
        while "no node can run them yet" not in status.stdout and time.monotonic() < deadline:
            time.sleep(0.25)
            status = head.cli("status")
        assert "1 pending task(s) need" in status.stdout, status.stdout
        assert '"nothing": 1.0' in status.stdout
    finally:
        driver.communicate("\n", timeout=CLI_TIMEOUT)
    assert driver.returncode == 0


def test_join_a_second_node_then_stop_only_it(head: Head) -> None:
    node_dir = head.cwd / "node"
    joined = rtml("start", "--address", head.address, "--num-cpus", "3",
                  "--resources", '{"accel": 2}', "--session-dir", str(node_dir),
                  cwd=head.cwd, env=_env(RTML_TOKEN=head.token))
    try:
        assert joined.returncode == 0, joined.stderr
        record = json.loads((node_dir / "session.json").read_text())
        assert record["role"] == "node" and record["head_address"] == head.address
        status = rtml("status", "--session-dir", str(node_dir), cwd=head.cwd)
        assert "2 alive node(s)" in status.stdout, status.stderr
        assert "CPU 0/3" in status.stdout and "accel 0/2" in status.stdout
        driver = head.driver(ACCEL_DRIVER)  # on the head; its task needs the other node
        out, err = driver.communicate(timeout=CLI_TIMEOUT)
        assert driver.returncode == 0, err
        assert out.split() == [record["node_id"], "3"]
    finally:
        _stop(node_dir, head.cwd)
    after = head.cli("status").stdout
    assert "1 alive node(s), 1 dead" in after, after
    driver = head.driver(DRIVER)  # the head node still serves
    out, err = driver.communicate(timeout=CLI_TIMEOUT)
    assert driver.returncode == 0, err
    assert out.strip() == "42"


def test_join_with_wrong_token_fails_naming_the_token(head: Head) -> None:
    node_dir = head.cwd / "node"
    result = rtml("start", "--address", head.address, "--token", "not-the-token",
                  "--session-dir", str(node_dir), cwd=head.cwd)
    assert result.returncode != 0
    assert "token" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (node_dir / "session.json").exists()


def test_join_unreachable_address_fails_naming_it(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_free_port()}"
    result = rtml("start", "--address", address, "--token", "t",
                  "--session-dir", str(tmp_path / "node"), cwd=tmp_path)
    assert result.returncode != 0
    assert address in result.stderr
    assert "Traceback" not in result.stderr


def test_join_without_token_names_both_ways_to_pass_it(tmp_path: Path) -> None:
    result = rtml("start", "--address", "127.0.0.1:6380",
                  "--session-dir", str(tmp_path / "node"), cwd=tmp_path)
    assert result.returncode == 1
    assert "--token" in result.stderr and "RTML_TOKEN" in result.stderr


def test_bad_resources_json_is_a_clear_error(tmp_path: Path) -> None:
    session_dir = tmp_path / "head"
    result = rtml("start", "--head", "--port", "0", "--resources", "{not json",
                  "--session-dir", str(session_dir), cwd=tmp_path)
    assert result.returncode == 1
    assert "--resources" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (session_dir / "session.json").exists()


def test_stop_with_nothing_running_succeeds(tmp_path: Path) -> None:
    result = rtml("stop", "--session-dir", str(tmp_path / "empty"), cwd=tmp_path)
    assert result.returncode == 0
    assert "Nothing" in result.stdout


def test_status_without_a_session_is_a_clear_error(tmp_path: Path) -> None:
    result = rtml("status", "--session-dir", str(tmp_path / "empty"), cwd=tmp_path)
    assert result.returncode == 1
    assert "rtml start --head" in result.stderr
    assert "Traceback" not in result.stderr
