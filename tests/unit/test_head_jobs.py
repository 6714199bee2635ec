"""The submitted jobs' table (rtml.head.jobs) and what the client and the head share
(rtml.job_submission: ids, runtime_env, the working dir's upload); no processes."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from rtml.head import jobs
from rtml.head.jobs import Ended, JobRefused, JobTable, KillGroup, Launch, Record, Terminate
from rtml.job_submission import JobStatus, spec, working_dir
from rtml.rpc import messages as m


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def submit(table: JobTable, sid: str = "job-1", entrypoint: str = "python x.py",
           **fields: object) -> jobs.Job:
    job, commands = table.submit(m.SubmitJob(1, sid, entrypoint, **fields))  # type: ignore[arg-type]
    assert commands == [Record(job)] and job.status is JobStatus.PENDING
    return job


def test_a_job_runs_from_pending_to_succeeded() -> None:
    clock = Clock()
    table = JobTable(clock)
    job = submit(table, metadata={"k": "v"}, entrypoint_num_cpus=1.0)
    assert job.start_time == 1_000_000 and job.message == jobs.PENDING_MESSAGE
    assert table.prepared("job-1") == [Launch(job)]
    assert table.started("job-1", 42, "777") == [Record(job)]
    assert job.status is JobStatus.RUNNING and job.info().pid == 42
    clock.now = 1002.5
    assert table.exited("job-1", 0) == [Record(job), Ended("job-1")]
    assert job.status is JobStatus.SUCCEEDED and job.exit_code == 0
    assert job.end_time == 1_002_500 and job.message == jobs.SUCCEEDED_MESSAGE
    (info,) = table.listing("job-1")
    assert (info.status, info.metadata, info.entrypoint_num_cpus, info.pid) == (
        "SUCCEEDED", {"k": "v"}, 1.0, 0)


def test_a_failure_names_the_exit_code_or_signal_and_carries_the_logs_end() -> None:
    table = JobTable(Clock())
    job = submit(table)
    table.prepared("job-1")
    table.started("job-1", 42, "777")
    table.exited("job-1", 3, "x" * 30_000 + "Traceback: boom\n")
    assert job.status is JobStatus.FAILED
    assert job.message.startswith("Job entrypoint command failed with exit code 3, last")
    assert job.message.endswith("Traceback: boom\n")
    assert len(job.message) < jobs.TAIL_CHARS + 200
    other = submit(table, "job-2")
    table.prepared("job-2")
    table.started("job-2", 43, "778")
    table.exited("job-2", -9)
    assert other.message == "Job entrypoint command was killed by SIGKILL; it printed nothing."


def test_stop_terminates_a_running_job_and_it_ends_stopped() -> None:
    table = JobTable(Clock())
    job = submit(table)
    table.prepared("job-1")
    table.started("job-1", 42, "777")
    assert table.stop("job-1") == (True, [Terminate("job-1", 42, "777")])
    assert table.stop("job-1") == (True, [])  # asked again: already on its way
    assert table.exited("job-1", -15) == [Record(job), Ended("job-1")]
    assert job.status is JobStatus.STOPPED and job.message == jobs.STOPPED_MESSAGE
    assert table.stop("job-1") == (False, [])  # ended


def test_a_job_stopped_before_it_started_never_launches() -> None:
    table = JobTable(Clock())
    job = submit(table)
    assert table.stop("job-1") == (True, [])
    assert table.prepared("job-1") == [Record(job), Ended("job-1")]
    assert job.status is JobStatus.STOPPED
    job2 = submit(table, "job-2")
    table.stop("job-2")
    assert table.failed_to_start("job-2", "bad zip") == [Record(job2), Ended("job-2")]
    assert job2.status is JobStatus.STOPPED


def test_a_job_stopped_while_launching_is_terminated_once_started() -> None:
    table = JobTable(Clock())
    job = submit(table)
    assert table.prepared("job-1") == [Launch(job)]
    table.stop("job-1")  # between the Launch and its process starting
    assert table.started("job-1", 42, "777") == [Record(job), Terminate("job-1", 42, "777")]


def test_a_job_that_cannot_start_is_failed_saying_why() -> None:
    table = JobTable(Clock())
    job = submit(table)
    table.failed_to_start("job-1", "its working_dir could not be unpacked: not a zip")
    assert job.status is JobStatus.FAILED
    assert job.message == "Job failed to start: its working_dir could not be unpacked: not a zip"


@pytest.mark.parametrize("fields,error", [
    ({"submission_id": "a/b"}, "submission id 'a/b' must be"),
    ({"entrypoint": "  "}, "the entrypoint is empty"),
    ({"runtime_env_json": '{"py_modules": ["."]}'}, "'py_modules' is not supported"),
    ({"runtime_env_json": "{nope"}, "not valid JSON"),
    ({"entrypoint_num_cpus": float("nan")}, "must be a finite number >= 0"),
])
def test_bad_submissions_are_refused_naming_what_is_wrong(fields: dict[str, object],
                                                         error: str) -> None:
    msg = {"req_id": 1, "submission_id": "ok", "entrypoint": "true", **fields}
    with pytest.raises(JobRefused, match=error):
        JobTable(Clock()).submit(m.SubmitJob(**msg))  # type: ignore[arg-type]


def test_ids_are_unique_and_made_when_not_given() -> None:
    table = JobTable(Clock())
    submit(table, "mine")
    with pytest.raises(JobRefused, match="already exists"):
        table.submit(m.SubmitJob(1, "mine", "true"))
    job, _ = table.submit(m.SubmitJob(1, "", "true"))
    assert job.submission_id.startswith("rtmlsubmit_") and len(job.submission_id) == 27
    with pytest.raises(JobRefused, match="no job with submission id 'nope'"):
        table.stop("nope")
    assert [r.submission_id for r in table.listing()] == ["mine", job.submission_id]


def test_only_an_ended_job_is_deleted() -> None:
    table = JobTable(Clock())
    submit(table)
    with pytest.raises(JobRefused, match="non-terminal state PENDING"):
        table.delete("job-1")
    table.failed_to_start("job-1", "x")
    assert table.delete("job-1") == [jobs.Forget("job-1")]
    assert table.listing() == []


def test_a_new_head_fails_the_jobs_its_predecessor_ran_and_kills_what_is_left() -> None:
    old = JobTable(Clock())
    done = submit(old, "done")
    old.failed_to_start("done", "x")
    running = submit(old, "running")
    old.prepared("running")
    old.started("running", 42, "777")
    pending = submit(old, "pending")
    records = [job.record() for job in (done, running, pending)]

    new = JobTable(Clock())
    commands = new.restore(records)
    assert commands[0] == KillGroup(42, "777")
    assert {c.job.submission_id for c in commands if isinstance(c, Record)} == {
        "running", "pending"}
    assert new.jobs["done"].status is JobStatus.FAILED
    assert new.jobs["done"].message == "Job failed to start: x"  # as recorded
    for sid in ("running", "pending"):
        assert new.jobs[sid].status is JobStatus.FAILED
        assert "the head service that ran it died" in new.jobs[sid].message
        assert "child process of the head service" in new.jobs[sid].message


def test_a_head_that_stops_ends_its_jobs() -> None:
    table = JobTable(Clock())
    submit(table)
    table.prepared("job-1")
    table.started("job-1", 42, "777")
    commands = table.head_stopping()
    assert commands[0] == KillGroup(42, "777") and Ended("job-1") in commands
    assert "was stopped" in table.jobs["job-1"].message
    assert table.head_stopping() == []


def test_job_status_is_rays() -> None:
    assert [s.value for s in JobStatus] == ["PENDING", "RUNNING", "STOPPED", "SUCCEEDED",
                                            "FAILED"]
    assert JobStatus.RUNNING == "RUNNING" and str(JobStatus.FAILED) == "FAILED"
    assert [s.is_terminal() for s in JobStatus] == [False, False, True, True, True]


def test_runtime_env_takes_only_what_a_job_can_honour() -> None:
    assert spec.check_runtime_env(None) == {}
    env = {"working_dir": ".", "env_vars": {"A": "1"}, "excludes": ["*.bin"], "pip": ["x"]}
    assert spec.parse_runtime_env_json(spec.runtime_env_json(env)) == env
    with pytest.raises(TypeError, match="env_vars"):
        spec.check_runtime_env({"env_vars": {"A": 1}})
    with pytest.raises(ValueError, match="'py_modules' is not supported for rtml jobs"):
        spec.check_runtime_env({"py_modules": ["."]})
    with pytest.raises(ValueError, match=r"\['conda'\] are not supported"):
        spec.check_runtime_env({"conda": {}})


def test_the_driver_gets_the_jobs_runtime_env_with_its_unpacked_working_dir() -> None:
    env = {"working_dir": "./here", "excludes": ["*.bin"], "env_vars": {"A": "1"},
           "pip": ["x"]}
    assert spec.driver_runtime_env(env, "/s/jobs/j") == {
        "working_dir": "/s/jobs/j", "env_vars": {"A": "1"}, "pip": ["x"]}
    assert spec.driver_runtime_env({"env_vars": {}}, None) == {}


# -- the working dir's upload ------------------------------------------------------------------

def test_a_working_dir_packs_and_unpacks_leaving_out_caches_and_excludes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "main.py").write_text("import pkg.mod\n")
    (src / "data.bin").write_bytes(b"\0" * 100)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "main.pyc").write_bytes(b"x")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref\n")
    (src / "inside").symlink_to(src / "main.py")
    (src / "outside").symlink_to(tmp_path)
    data = working_dir.pack(src, excludes=["*.bin"])
    names = sorted(zipfile.ZipFile(io.BytesIO(data)).namelist())
    assert names == ["inside", "main.py", "pkg/mod.py"]
    target = tmp_path / "target"
    target.mkdir()
    working_dir.unpack(data, target)
    assert (target / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert (target / "inside").read_text() == "import pkg.mod\n"


def test_a_working_dir_over_the_cap_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "big.npy").write_bytes(bytes(range(256)) * 4096)  # 1 MiB, barely compressible
    with pytest.raises(working_dir.WorkingDirError, match=r"packs to more than [0-9.e-]+ MiB .*"
                                                          r"big.npy .*excludes"):
        working_dir.pack(tmp_path, limit=1000)
    with pytest.raises(working_dir.WorkingDirError, match="is not a directory"):
        working_dir.pack(tmp_path / "big.npy")


def test_unpack_refuses_what_is_not_a_safe_small_zip(tmp_path: Path) -> None:
    with pytest.raises(working_dir.WorkingDirError, match="not a zip file"):
        working_dir.unpack(b"nope", tmp_path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../escape.py", "x")
    with pytest.raises(working_dir.WorkingDirError, match="outside its directory"):
        working_dir.unpack(buffer.getvalue(), tmp_path)
    assert not (tmp_path.parent / "escape.py").exists()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb", b"\0" * 10_000)
    with pytest.raises(working_dir.WorkingDirError, match="unpacks to"):
        working_dir.unpack(buffer.getvalue(), tmp_path, limit=1000)
