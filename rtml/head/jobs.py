"""Submitted jobs (``rtml job submit``, ``JobSubmissionClient``): their lives, decided
without I/O. The head's shell (``rtml.head.job_runner``) runs the processes.

    SubmitJob --submit()--> PENDING --Record--> the shell unpacks the working dir
        prepared()            --> Launch (STOPPED instead if stopped meanwhile)
        failed_to_start(why)  --> FAILED --Record, Ended
        failed(why)           --> FAILED (the head could not follow it) --KillGroup, ...
        started(pid)          --> RUNNING --Record (and Terminate, if stopped meanwhile)
        exited(code, tail)    --> SUCCEEDED (0) | STOPPED (it was stopped) | FAILED
                                  --Record, Ended (the shell has killed what it left)
    StopJob   --stop()-->   Terminate: its process group, SIGTERM then SIGKILL
    DeleteJob --delete()--> Forget: its record, log and working dir (ended jobs only)
    a head that starts --restore(records)--> what its predecessor left PENDING or RUNNING
        is FAILED: its entrypoint was that head's child process and died with it
        (KillGroup: whatever of its process group outlived it)
    the head stops --head_stopping()--> the same, for the jobs it runs

Each record is written to the control plane (``Record``), so the jobs are listed after
a head restart. Times are ms since the epoch, as Ray's.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rtml.job_submission import JobStatus, spec
from rtml.rpc import messages as m
from rtml.scheduler.resources import bad_amount

PENDING_MESSAGE = "Job has not started yet."
RUNNING_MESSAGE = "Job is currently running."
SUCCEEDED_MESSAGE = "Job finished successfully."
STOPPED_MESSAGE = "Job was intentionally stopped."
HEAD_DIED = ("Job failed: the head service that ran it {why} (a job's entrypoint is a "
             "child process of the head service, and ends with it); submit it again")
TAIL_CHARS = 20_000
"""Characters of the log's end a failed job's message carries (Ray's figure)."""


class JobRefused(Exception):
    """A job request the head does not carry out; the message says why (and what to do)."""


@dataclass
class Job:
    submission_id: str
    entrypoint: str
    start_time: int
    metadata: dict[str, str] = field(default_factory=dict)
    runtime_env_json: str = ""
    entrypoint_num_cpus: float = 0.0
    status: JobStatus = JobStatus.PENDING
    message: str = PENDING_MESSAGE
    end_time: int = 0
    exit_code: int | None = None
    pid: int = 0  # its entrypoint's (the leader of its process group), once started
    pid_started: str = ""  # that process's start time: a reused pid is not signalled
    stopping: bool = False

    def record(self) -> dict[str, Any]:
        """The control plane's record of it (a snapshot: the write happens later)."""
        return {"submission_id": self.submission_id, "entrypoint": self.entrypoint,
                "start_time": self.start_time, "metadata": dict(self.metadata),
                "runtime_env_json": self.runtime_env_json,
                "entrypoint_num_cpus": self.entrypoint_num_cpus,
                "status": self.status.value, "message": self.message,
                "end_time": self.end_time, "exit_code": self.exit_code, "pid": self.pid,
                "pid_started": self.pid_started}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Job:
        return cls(str(record["submission_id"]), str(record.get("entrypoint", "")),
                   int(record.get("start_time") or 0), dict(record.get("metadata") or {}),
                   str(record.get("runtime_env_json", "")),
                   float(record.get("entrypoint_num_cpus") or 0.0),
                   JobStatus(record.get("status", JobStatus.FAILED.value)),
                   str(record.get("message", "")), int(record.get("end_time") or 0),
                   record.get("exit_code"), int(record.get("pid") or 0),
                   str(record.get("pid_started") or ""))

    def info(self) -> m.JobRecord:
        return m.JobRecord(self.submission_id, self.entrypoint, self.status.value,
                           self.message, self.start_time, self.end_time,
                           dict(self.metadata), self.runtime_env_json,
                           self.entrypoint_num_cpus, self.exit_code,
                           self.pid if self.status is JobStatus.RUNNING else 0)


@dataclass(frozen=True)
class Record:
    """Write the job's record to the control plane."""
    job: Job


@dataclass(frozen=True)
class Launch:
    """Start the job's entrypoint (its working dir is ready)."""
    job: Job


@dataclass(frozen=True)
class Terminate:
    """SIGTERM the job's process group; SIGKILL it if it still runs after the grace."""
    submission_id: str
    pid: int
    pid_started: str


@dataclass(frozen=True)
class KillGroup:
    """SIGKILL what is left of the process group ``pid`` led, unless ``pid`` now names
    another process (its start time differs)."""
    pid: int
    pid_started: str


@dataclass(frozen=True)
class Ended:
    """The job ended: those following its log get the end of it."""
    submission_id: str


@dataclass(frozen=True)
class Forget:
    """Delete the job's record, log file and working dir."""
    submission_id: str


Command = Record | Launch | Terminate | KillGroup | Ended | Forget


class JobTable:
    """Every submitted job the head knows, and the decisions on them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.jobs: dict[str, Job] = {}
        self._clock = clock

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def listing(self, submission_id: str = "") -> list[m.JobRecord]:
        """Every job, oldest first; or the one named (JobRefused if there is none)."""
        if submission_id:
            return [self._job(submission_id).info()]
        return [job.info() for job in sorted(self.jobs.values(),
                                             key=lambda j: (j.start_time, j.submission_id))]

    def _job(self, submission_id: str) -> Job:
        job = self.jobs.get(submission_id)
        if job is None:
            raise JobRefused(f"there is no job with submission id {submission_id!r} (see "
                             f"`rtml job list`)")
        return job

    # -- a job's life ------------------------------------------------------------------------

    def submit(self, msg: m.SubmitJob) -> tuple[Job, list[Command]]:
        """Accept a submission (PENDING). Raises JobRefused naming what is wrong."""
        submission_id = msg.submission_id or spec.new_submission_id()
        try:
            spec.check_submission_id(submission_id)
            spec.parse_runtime_env_json(msg.runtime_env_json)
        except (ValueError, TypeError) as exc:
            raise JobRefused(str(exc)) from None
        if not msg.entrypoint.strip():
            raise JobRefused("the entrypoint is empty: give the shell command to run, e.g. "
                             "`rtml job submit -- python script.py`")
        bad = bad_amount({"entrypoint_num_cpus": msg.entrypoint_num_cpus})
        if bad:
            raise JobRefused(bad)
        if submission_id in self.jobs:
            raise JobRefused(f"Job with submission_id {submission_id} already exists. "
                             f"Please use a different submission_id.")
        job = Job(submission_id, msg.entrypoint, self._now(), dict(msg.metadata),
                  msg.runtime_env_json, msg.entrypoint_num_cpus)
        self.jobs[submission_id] = job
        return job, [Record(job)]

    def prepared(self, submission_id: str) -> list[Command]:
        """Its working dir is ready: start it, unless it was stopped meanwhile."""
        job = self.jobs[submission_id]
        if job.stopping:
            return self._end(job, JobStatus.STOPPED, STOPPED_MESSAGE)
        return [Launch(job)]

    def failed_to_start(self, submission_id: str, why: str) -> list[Command]:
        job = self.jobs[submission_id]
        if job.stopping:
            return self._end(job, JobStatus.STOPPED, STOPPED_MESSAGE)
        return self._end(job, JobStatus.FAILED, f"Job failed to start: {why}")

    def failed(self, submission_id: str, why: str) -> list[Command]:
        """The head could not run or follow it: FAILED, and its processes killed."""
        job = self.jobs[submission_id]
        commands: list[Command] = [KillGroup(job.pid, job.pid_started)] if job.pid else []
        return commands + self._end(job, JobStatus.FAILED, f"Job failed: {why}")

    def started(self, submission_id: str, pid: int, pid_started: str) -> list[Command]:
        job = self.jobs[submission_id]
        job.status, job.message = JobStatus.RUNNING, RUNNING_MESSAGE
        job.pid, job.pid_started = pid, pid_started
        commands: list[Command] = [Record(job)]
        if job.stopping:
            commands.append(Terminate(submission_id, pid, pid_started))
        return commands

    def exited(self, submission_id: str, returncode: int, tail: str = "") -> list[Command]:
        """Its entrypoint exited with ``returncode`` (-N: killed by signal N); ``tail``:
        the end of its log, for a failure's message."""
        job = self.jobs[submission_id]
        job.exit_code = returncode
        if job.stopping:
            return self._end(job, JobStatus.STOPPED, STOPPED_MESSAGE)
        if returncode == 0:
            return self._end(job, JobStatus.SUCCEEDED, SUCCEEDED_MESSAGE)
        return self._end(job, JobStatus.FAILED, _failure(returncode, tail))

    def _end(self, job: Job, status: JobStatus, message: str) -> list[Command]:
        job.status, job.message, job.end_time = status, message, self._now()
        return [Record(job), Ended(job.submission_id)]

    # -- requests ----------------------------------------------------------------------------

    def stop(self, submission_id: str) -> tuple[bool, list[Command]]:
        """Stop the job: True if it had not ended (it will be STOPPED), False if it had.
        Raises JobRefused for an unknown id."""
        job = self._job(submission_id)
        if job.status.is_terminal():
            return False, []
        if job.stopping:
            return True, []
        job.stopping = True
        if job.status is JobStatus.RUNNING:
            return True, [Terminate(submission_id, job.pid, job.pid_started)]
        return True, []  # PENDING: it is not launched (prepared / failed_to_start say so)

    def delete(self, submission_id: str) -> list[Command]:
        """Forget an ended job. Raises JobRefused for an unknown or unended one."""
        job = self._job(submission_id)
        if not job.status.is_terminal():
            raise JobRefused(f"Attempted to delete job '{submission_id}', but it is in a "
                             f"non-terminal state {job.status}: stop it first "
                             f"(`rtml job stop {submission_id}`)")
        del self.jobs[submission_id]
        return [Forget(submission_id)]

    # -- the head's own life ---------------------------------------------------------------

    def restore(self, records: list[dict[str, Any]]) -> list[Command]:
        """Take over what an earlier head recorded; its unended jobs died with it."""
        commands: list[Command] = []
        for record in records:
            job = Job.from_record(record)
            self.jobs[job.submission_id] = job
            if not job.status.is_terminal():
                commands += self._died(job, "died, and a new one took over")
        return commands

    def head_stopping(self) -> list[Command]:
        """The head is stopping: its jobs end with it."""
        commands: list[Command] = []
        for job in self.jobs.values():
            if not job.status.is_terminal():
                commands += self._died(job, "was stopped")
        return commands

    def _died(self, job: Job, why: str) -> list[Command]:
        commands: list[Command] = []
        if job.pid:
            commands.append(KillGroup(job.pid, job.pid_started))
        return commands + self._end(job, JobStatus.FAILED, HEAD_DIED.format(why=why))


def _failure(returncode: int, tail: str) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        what = f"Job entrypoint command was killed by {name}"
    else:
        what = f"Job entrypoint command failed with exit code {returncode}"
    tail = tail[-TAIL_CHARS:]
    if not tail:
        return what + "; it printed nothing."
    return f"{what}, last available logs (truncated to {TAIL_CHARS:,} chars):\n{tail}"
