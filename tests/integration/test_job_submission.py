"""Job submission (``rtml job``, ``rtml.job_submission``) on a daemon cluster started with
``rtml start --head``: the head runs each entrypoint as its child process, over the
authenticated head protocol."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rtml.job_submission import JobStatus, JobSubmissionClient
from tests.integration.test_cli import _free_port, _running

CLI_TIMEOUT = 60.0

HELPER = """
def scale(x):
    return 10 * x + 1
"""

# Runs rtml tasks that use a module of its working dir (imported by the workers too).
DRIVER = """
import sys
import rtml
from helper import scale

@rtml.remote
def work(x):
    return scale(x)

rtml.init()
n = int(sys.argv[1])
print("result", sum(rtml.get([work.remote(i) for i in range(n)])), flush=True)
"""

# What its tasks get of the job's runtime_env: env_vars, and the working dir's modules.
PROBE = """
import os
import rtml

@rtml.remote
def probe():
    import helper
    return os.environ.get("GREETING"), helper.scale(1)

rtml.init()
print("worker", *rtml.get(probe.remote()), flush=True)
"""

FAILING = """
print("about to fail", flush=True)
raise ValueError("the job's own error")
"""

# Ignores SIGTERM (so only the SIGKILL after the grace ends it); its child does not.
STUBBORN = """
import os, signal, subprocess, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "300"])
print("pids", os.getpid(), child.pid, flush=True)
time.sleep(300)
"""

SLOW_PRINTER = """
import time
print("first", flush=True)
time.sleep(1.0)
print("second", flush=True)
"""

LONG = """
import os, subprocess, time
child = subprocess.Popen(["sleep", "300"])
print("pids", os.getpid(), child.pid, flush=True)
time.sleep(300)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RTML_ADDRESS", "RTML_TOKEN", "RTML_SESSION_DIR")}
    return {**env, **extra}


def rtml(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rtml.cli.main", *args], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=CLI_TIMEOUT)


def _gone(pids: list[int], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_running(pid) for pid in pids)


@dataclass
class Head:
    session_dir: Path
    cwd: Path
    address: str
    token: str

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return rtml(*args, "--session-dir", str(self.session_dir), cwd=self.cwd)

    def job(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``rtml job COMMAND --session-dir DIR ARGS`` (its flags before an entrypoint)."""
        return rtml("job", command, "--session-dir", str(self.session_dir), *args,
                    cwd=self.cwd)

    def client(self) -> JobSubmissionClient:
        return JobSubmissionClient(self.address, token=self.token)

    def descendants(self) -> list[int]:
        record = json.loads((self.session_dir / "session.json").read_text())
        pids = []
        for pid in record["pids"]:
            try:
                pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return pids


def _start_head(root: Path) -> Head:
    session_dir = root / "head"
    result = rtml("start", "--head", "--port", str(_free_port()), "--num-cpus", "2",
                  "--session-dir", str(session_dir), cwd=root)
    assert result.returncode == 0, result.stderr
    values = dict(line.split("=", 1) for line in result.stdout.splitlines()
                  if line.startswith(("RTML_ADDRESS=", "RTML_TOKEN=")))
    return Head(session_dir, root, values["RTML_ADDRESS"], values["RTML_TOKEN"])


def _stop(head: Head) -> None:
    """``rtml stop``; every recorded process and each descendant (jobs too) is gone."""
    record = json.loads((head.session_dir / "session.json").read_text())
    children = head.descendants()
    result = head.cli("stop")
    assert result.returncode == 0, result.stderr
    assert [pid for pid in record["pids"] if _running(pid)] == []
    assert _gone(children), [pid for pid in children if _running(pid)]


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    root = tmp_path_factory.mktemp("jobs")
    started = _start_head(root)
    try:
        yield started
    finally:
        _stop(started)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A working dir: the driver, a module it imports, and the other scripts."""
    wd = tmp_path / "project"
    wd.mkdir()
    for name, text in (("helper.py", HELPER), ("driver.py", DRIVER), ("probe.py", PROBE),
                       ("failing.py", FAILING),
                       ("stubborn.py", STUBBORN), ("slow.py", SLOW_PRINTER),
                       ("long.py", LONG)):
        (wd / name).write_text(text)
    return wd


def _submitted_id(stdout: str) -> str:
    found = re.search(r"Job '(\S+)' submitted successfully", stdout)
    assert found, stdout
    return found.group(1)


def _first_line(client: JobSubmissionClient, job_id: str, prefix: str) -> str:
    """Follow the job's log until a line starting with ``prefix`` is printed."""
    async def follow() -> str:
        seen = ""
        async for text in client.tail_job_logs(job_id):
            seen += text
            for line in seen.splitlines(keepends=True):
                if line.startswith(prefix) and line.endswith("\n"):
                    return line.strip()
        raise AssertionError(f"the job ended without printing {prefix!r}: {seen!r}")
    return asyncio.run(asyncio.wait_for(follow(), 30))


# -- the command line ------------------------------------------------------------------------

def test_submit_runs_a_driver_in_its_working_dir_follows_it_and_exits_0(
        head: Head, project: Path) -> None:
    result = head.job("submit", "--working-dir", str(project), "--", "python",
                      "driver.py", "4")
    assert result.returncode == 0, result.stderr
    job_id = _submitted_id(result.stdout)
    lines = result.stdout.splitlines()
    assert "result 64" in lines  # sum(10 * i + 1 for i in range(4)): helper.py on workers
    assert lines[-1] == f"Job '{job_id}' succeeded"
    assert lines.index("result 64") < len(lines) - 1  # the log came before the verdict

    status = head.job("status", job_id)
    assert status.returncode == 0, status.stderr
    assert f"Status for job '{job_id}': SUCCEEDED" in status.stdout
    logs = head.job("logs", job_id)
    assert logs.returncode == 0 and logs.stdout == "result 64\n", logs
    unpacked = head.session_dir / "jobs" / job_id
    assert (unpacked / "helper.py").read_text() == HELPER
    log_file = head.session_dir / "logs" / f"job-driver-{job_id}.log"
    assert log_file.read_text() == "result 64\n"


def test_a_failing_script_is_failed_with_its_error_and_exits_1(
        head: Head, project: Path) -> None:
    result = head.job("submit", "--working-dir", str(project), "--",
                      "python", "failing.py")
    assert result.returncode == 1, result.stderr
    job_id = _submitted_id(result.stdout)
    assert "about to fail" in result.stdout
    assert "ValueError: the job's own error" in result.stdout  # its stderr is logged too
    assert result.stdout.splitlines()[-1] == (
        f"Job '{job_id}' failed (its entrypoint exited with 1)")
    info = head.client().get_job_info(job_id)
    assert info.status is JobStatus.FAILED and info.driver_exit_code == 1
    assert info.message.startswith("Job entrypoint command failed with exit code 1")
    assert "ValueError: the job's own error" in info.message  # the log's tail


def test_stop_kills_the_whole_process_tree(head: Head, project: Path) -> None:
    result = head.job("submit", "--no-wait", "--working-dir", str(project),
                      "--submission-id", "stubborn-1", "--", "exec", "python", "stubborn.py")
    assert result.returncode == 0, result.stderr
    assert _submitted_id(result.stdout) == "stubborn-1"
    client = head.client()
    pids = [int(p) for p in _first_line(client, "stubborn-1", "pids").split()[1:]]
    assert all(_running(pid) for pid in pids)
    assert client.get_job_status("stubborn-1") is JobStatus.RUNNING

    started = time.monotonic()
    stop = head.job("stop", "stubborn-1")  # waits for the end
    took = time.monotonic() - started
    assert stop.returncode == 0, stop.stderr
    assert "Job 'stubborn-1' was stopped" in stop.stdout
    assert _gone(pids, timeout=1.0)
    assert 2.5 < took < 15  # SIGTERM was ignored: SIGKILL came after the 3 s grace
    info = client.get_job_info("stubborn-1")
    assert info.status is JobStatus.STOPPED and info.message == "Job was intentionally stopped."
    assert client.stop_job("stubborn-1") is False  # it has ended
    again = head.job("stop", "stubborn-1")
    assert again.returncode == 0 and "had already ended: STOPPED" in again.stdout


def test_logs_follow_returns_when_the_job_ends(head: Head, project: Path) -> None:
    result = head.job("submit", "--no-wait", "--working-dir", str(project), "--",
                      "python", "slow.py")
    job_id = _submitted_id(result.stdout)
    follow = head.job("logs", job_id, "--follow")
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout == "first\nsecond\n"
    assert head.client().get_job_status(job_id) is JobStatus.SUCCEEDED
    again = head.job("logs", job_id, "-f")  # an ended job: its whole log, at once
    assert again.returncode == 0 and again.stdout == "first\nsecond\n"


def test_list_shows_every_job(head: Head, project: Path) -> None:
    ids = []
    for command in (["true"], ["false"]):
        result = head.job("submit", "--", *command)
        assert result.returncode == (0 if command == ["true"] else 1), result.stderr
        ids.append(_submitted_id(result.stdout))
    listed = head.job("list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["submission_id"]: row for row in json.loads(listed.stdout)}
    assert rows[ids[0]]["status"] == "SUCCEEDED" and rows[ids[0]]["entrypoint"] == "true"
    assert rows[ids[1]]["status"] == "FAILED" and rows[ids[1]]["driver_exit_code"] == 1
    assert set(rows) == {job.submission_id for job in head.client().list_jobs()}
    table = head.job("list")
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == ["SUBMISSION_ID", "STATUS", "START", "END",
                                                   "ENTRYPOINT"]
    assert all(job_id in table.stdout for job_id in rows)


def test_a_wrong_token_is_refused_and_starts_nothing(head: Head, tmp_path: Path) -> None:
    before = len(head.client().list_jobs())
    marker = tmp_path / "ran"
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token")
    result = rtml("job", "submit", "--address", head.address, "--token-file", str(wrong),
                  "--", "touch", str(marker), cwd=tmp_path)
    assert result.returncode == 1
    assert "wrong cluster token" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ConnectionError, match="wrong cluster token"):
        JobSubmissionClient(head.address, token="not-the-token")
    assert not marker.exists()
    assert len(head.client().list_jobs()) == before


# -- the Python client ------------------------------------------------------------------------

def test_python_client_end_to_end(head: Head, project: Path) -> None:
    client = head.client()
    job_id = client.submit_job(
        entrypoint="python driver.py 3 && python probe.py && echo greeting=$GREETING",
        runtime_env={"working_dir": str(project), "env_vars": {"GREETING": "hello"},
                     "excludes": ["long.py"]},
        metadata={"owner": "test"}, entrypoint_num_cpus=1)
    assert job_id.startswith("rtmlsubmit_")

    async def tail() -> str:
        return "".join([text async for text in client.tail_job_logs(job_id)])
    logged = asyncio.run(asyncio.wait_for(tail(), 30))
    assert logged == "result 33\nworker hello 11\ngreeting=hello\n"  # 1 + 11 + 21
    assert client.get_job_status(job_id) is JobStatus.SUCCEEDED
    assert client.get_job_status(job_id).is_terminal()
    info = client.get_job_info(job_id)
    assert info.entrypoint == "python driver.py 3 && python probe.py && echo greeting=$GREETING"
    assert info.metadata == {"owner": "test"} and info.entrypoint_num_cpus == 1.0
    assert info.runtime_env["env_vars"] == {"GREETING": "hello"}
    assert info.message == "Job finished successfully." and info.driver_exit_code == 0
    assert info.start_time is not None and info.end_time is not None
    assert 0 <= info.end_time - info.start_time < 30_000
    assert client.get_job_logs(job_id) == logged
    assert job_id in {job.submission_id for job in client.list_jobs()}
    unpacked = head.session_dir / "jobs" / job_id
    assert (unpacked / "driver.py").exists() and not (unpacked / "long.py").exists()

    with pytest.raises(RuntimeError, match="already exists"):
        client.submit_job(entrypoint="true", submission_id=job_id)
    with pytest.raises(ValueError, match="'py_modules' is not supported for rtml jobs"):
        client.submit_job(entrypoint="true", runtime_env={"py_modules": ["."]})
    with pytest.raises(ValueError, match=r"\['conda'\] are not supported by rtml"):
        client.submit_job(entrypoint="true", runtime_env={"conda": "env"})
    assert client.stop_job(job_id) is False
    assert client.delete_job(job_id) is True
    with pytest.raises(RuntimeError, match="no job with submission id"):
        client.get_job_status(job_id)
    assert not unpacked.exists()
    assert not (head.session_dir / "logs" / f"job-driver-{job_id}.log").exists()


def test_a_running_job_cannot_be_deleted_and_stop_then_delete(head: Head, project: Path) -> None:
    client = head.client()
    job_id = client.submit_job(entrypoint="python long.py",
                               runtime_env={"working_dir": str(project)})
    pids = [int(p) for p in _first_line(client, job_id, "pids").split()[1:]]
    with pytest.raises(RuntimeError, match="non-terminal state RUNNING"):
        client.delete_job(job_id)
    assert client.stop_job(job_id) is True
    assert _gone(pids)
    assert asyncio.run(_ended(client, job_id)) is JobStatus.STOPPED
    assert client.delete_job(job_id) is True


async def _ended(client: JobSubmissionClient, job_id: str) -> JobStatus:
    async for _ in client.tail_job_logs(job_id):
        pass
    return client.get_job_status(job_id)


# -- the head restarts -------------------------------------------------------------------------

def test_a_job_whose_head_died_is_failed_when_it_comes_back(tmp_path: Path,
                                                            project: Path) -> None:
    head = _start_head(tmp_path)
    try:
        client = head.client()
        done = client.submit_job(entrypoint="true")
        assert asyncio.run(_ended(client, done)) is JobStatus.SUCCEEDED
        job_id = client.submit_job(entrypoint="python long.py",
                                   runtime_env={"working_dir": str(project)})
        pids = [int(p) for p in _first_line(client, job_id, "pids").split()[1:]]
        service = psutil.Process(pids[0]).parent()
        while service is not None and "rtml.head.main" not in " ".join(service.cmdline()):
            service = service.parent()
        assert service is not None  # the job is the head service's child (or grandchild)
        os.kill(service.pid, signal.SIGKILL)  # our own head service; its supervisor restarts it

        assert _gone(pids, timeout=10)  # died with their head
        info = client.get_job_info(job_id)  # answered by the new head
        assert info.status is JobStatus.FAILED
        assert "the head service that ran it died" in info.message
        assert "child process of the head service" in info.message
        assert client.get_job_status(done) is JobStatus.SUCCEEDED  # recorded: kept
        assert _running(service.pid) is False
    finally:
        _stop(head)
