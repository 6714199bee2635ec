"""The head's shell of the job table (``rtml.head.jobs``): it runs each submitted job's
entrypoint as a child process of the head service, keeps what it prints, and answers
the job requests (``rtml job``, ``JobSubmissionClient``).

    SubmitJob --JobTable.submit--> a task of the runner's group, per job:
        its working dir unpacked (in a thread) into <session>/jobs/<submission id>/
        /bin/sh -c ENTRYPOINT   in its own session and process group; RTML_ADDRESS (this
                                head), RTML_TOKEN, RTML_SESSION_DIR in its environment
                                (the token never on a command line), RTML_RUNTIME_ENV
                                (the job's runtime_env, for its init); SIGKILLed if the
                                head dies (it is the head's child)
            stdout + stderr --one pipe--> the head --> <session>/logs/job-driver-<id>.log
                                                   --> JobLogs to each follower
        its exit awaited on the event loop (asyncio), then what it left of its process
        group is killed --> JobTable.exited
    StopJob    --> Terminate: SIGTERM to its process group, SIGKILL after STOP_GRACE s
    GetJobLogs --> the log so far (read in a thread), then to a follower each chunk as it
                   comes, until the job ends
    the head stops --> its jobs' process groups are killed, and they are recorded FAILED

Records go to the control plane through the head's ordered writes (``PlaneWrites``),
never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rtml.config import DIE_WITH_PARENT_ENV, JOB_RUNTIME_ENV, REDIS_PASSWORD_ENV, TOKEN_ENV
from rtml.control_plane import ControlPlane
from rtml.daemon import die_with_parent
from rtml.exceptions import RtmlSystemError
from rtml.head import jobs
from rtml.head.writes import PlaneWrites
from rtml.job_submission import spec, working_dir
from rtml.rpc import messages as m
from rtml.rpc.server import Peer
from rtml.session import Session, private_dir, process_start_time

log = logging.getLogger(__name__)

STOP_GRACE = 3.0
"""Seconds a stopped job gets between SIGTERM and SIGKILL (Ray's default too)."""
DRAIN_TIMEOUT = 2.0
"""Seconds the head reads a job's output after its process group was killed: only a
process that left the group (its own session) can still hold the pipe open."""
LOG_CHUNK = 1 << 20
TAIL_BYTES = 4 * jobs.TAIL_CHARS
_HEAD_ONLY = (TOKEN_ENV, REDIS_PASSWORD_ENV, DIE_WITH_PARENT_ENV, JOB_RUNTIME_ENV)
"""The head's own environment that its jobs do not get (they get RTML_TOKEN, and their
own runtime_env)."""


class JobRunner:
    """Runs submitted jobs for the head service (module docstring)."""

    def __init__(self, session_dir: str, token: str, plane: ControlPlane,
                 writes: PlaneWrites) -> None:
        self.table = jobs.JobTable()
        self.session = Session(Path(session_dir))
        self.token = token
        self.plane = plane
        self.writes = writes
        self.address = ""  # this head's host:port, given to run()
        self._logs: dict[str, _JobLog] = {}  # of each job not yet ended
        self._grace: dict[str, asyncio.TimerHandle] = {}  # stopped jobs' SIGKILL timers
        self._uploads: dict[str, bytes] = {}  # zipped working dirs not yet unpacked
        self._starts: asyncio.Queue[Coroutine[Any, Any, None]] = asyncio.Queue()

    def recover(self) -> None:
        """Take over the jobs an earlier head recorded. Blocking: runs before serving."""
        self._carry_out(self.table.restore(self.plane.list_submissions()))

    async def run(self, address: str) -> None:
        """Run the jobs' tasks until cancelled (the head stops); then end every job."""
        self.address = address
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    group.create_task(await self._starts.get())
        finally:
            while not self._starts.empty():
                self._starts.get_nowait().close()
            self._carry_out(self.table.head_stopping())

    def _spawn(self, what: str, coro: Coroutine[Any, Any, None]) -> None:
        self._starts.put_nowait(_guarded(what, coro))

    # -- requests ----------------------------------------------------------------------------

    def on_message(self, peer: Peer, msg: Any) -> None:
        try:
            self._handlers[type(msg)](self, peer, msg)
        except jobs.JobRefused as exc:
            peer.send(_refusal(msg, str(exc)))

    def peer_gone(self, peer: Peer) -> None:
        for job_log in self._logs.values():
            job_log.followers = [f for f in job_log.followers if f.peer is not peer]

    def _submit(self, peer: Peer, msg: m.SubmitJob) -> None:
        job, commands = self.table.submit(msg)
        sid = job.submission_id
        self._logs[sid] = _JobLog(self.session.log_file(f"job-driver-{sid}"))
        self._carry_out(commands)
        if msg.working_dir:
            self._uploads[sid] = msg.working_dir
        self._spawn(f"job {sid}", self._run(job))
        log.info("job %s submitted: %s", sid, job.entrypoint)
        peer.send(m.JobAnswer(msg.req_id, True, sid))

    def _stop(self, peer: Peer, msg: m.StopJob) -> None:
        stopping, commands = self.table.stop(msg.submission_id)
        self._carry_out(commands)
        peer.send(m.JobAnswer(msg.req_id, stopping, msg.submission_id))

    def _delete(self, peer: Peer, msg: m.DeleteJob) -> None:
        self._carry_out(self.table.delete(msg.submission_id))
        peer.send(m.JobAnswer(msg.req_id, True, msg.submission_id))

    def _list(self, peer: Peer, msg: m.ListJobs) -> None:
        peer.send(m.JobList(msg.req_id, self.table.listing(msg.submission_id)))

    def _logs_asked(self, peer: Peer, msg: m.GetJobLogs) -> None:
        self.table.listing(msg.submission_id)  # JobRefused if there is none
        job_log = self._logs.get(msg.submission_id)
        path = self.session.log_file(f"job-driver-{msg.submission_id}")
        if not msg.follow or job_log is None:  # (None: it ended)
            self._spawn("sending a job's log", _send_log(peer, msg.req_id, path, None, None))
            return
        follower = _Follower(peer, msg.req_id)
        job_log.followers.append(follower)
        self._spawn("sending a job's log", _send_log(peer, msg.req_id, path,
                                                     job_log.written, follower))

    _handlers: dict[type, Callable[[JobRunner, Peer, Any], None]] = {
        m.SubmitJob: _submit, m.StopJob: _stop, m.DeleteJob: _delete, m.ListJobs: _list,
        m.GetJobLogs: _logs_asked,
    }

    # -- a job's life ------------------------------------------------------------------------

    async def _run(self, job: jobs.Job) -> None:
        sid = job.submission_id
        try:
            await self._run_entrypoint(job)
        except Exception as exc:
            log.exception("running job %s failed", sid)
            if not job.status.is_terminal():
                self._carry_out(self.table.failed(sid, f"the head could not run it: {exc!r}"))

    async def _run_entrypoint(self, job: jobs.Job) -> None:
        sid = job.submission_id
        cwd, unpacked = os.getcwd(), None
        if sid in self._uploads:  # (popped by _unpack: not kept while the job runs)
            try:
                cwd = unpacked = await asyncio.to_thread(self._unpack, sid)
            except (working_dir.WorkingDirError, OSError, RtmlSystemError) as exc:
                self._carry_out(self.table.failed_to_start(
                    sid, f"its working_dir could not be unpacked: {exc}"))
                return
        if not self._carry_out(self.table.prepared(sid)):
            return
        job_log = self._logs[sid]
        try:
            proc, pump = await self._launch(job, cwd, unpacked, job_log)
        except OSError as exc:
            self._carry_out(self.table.failed_to_start(sid, f"{job.entrypoint!r}: {exc}"))
            return
        self._carry_out(self.table.started(sid, proc.pid, process_start_time(proc.pid) or ""))
        code = await proc.wait()
        # The entrypoint's process group ends with it (as a task's processes end with its
        # worker); then its pipe closes, and what it printed last is in the log.
        signal_group(job.pid, job.pid_started, signal.SIGKILL)
        await asyncio.wait([pump.done], timeout=DRAIN_TIMEOUT)
        pump.close()
        self._carry_out(self.table.exited(sid, code, job_log.tail()))

    def _unpack(self, sid: str) -> str:
        """Unpack the job's working dir (in a thread); returns its path."""
        upload = self._uploads.pop(sid)
        target = self.session.root / "jobs" / sid
        private_dir(target, trusted_above=self.session.root)
        working_dir.unpack(upload, target)
        return str(target)

    async def _launch(self, job: jobs.Job, cwd: str, unpacked: str | None,
                      job_log: _JobLog) -> tuple[asyncio.subprocess.Process, _Pump]:
        """Start the entrypoint, its output on a pipe of ours (not asyncio's: a process
        that outlives the entrypoint and holds the pipe must not delay its end)."""
        read_fd, write_fd = os.pipe()
        try:
            job_log.open()
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", job.entrypoint, stdin=subprocess.DEVNULL, stdout=write_fd,
                stderr=write_fd, cwd=cwd, env=self._environment(job, unpacked), start_new_session=True,
                preexec_fn=_dies_with_us())
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        pump = _Pump(job_log.write)
        await asyncio.get_running_loop().connect_read_pipe(
            lambda: pump, os.fdopen(read_fd, "rb", buffering=0))
        log.info("job %s runs as pid %d in %s", job.submission_id, proc.pid, cwd)
        return proc, pump

    def _environment(self, job: jobs.Job, unpacked: str | None) -> dict[str, str]:
        """The head's environment, the job's env_vars, and what makes its driver join this
        cluster in the job's runtime_env (JOB_RUNTIME_ENV, which ``rtml.init`` reads)."""
        env = {k: v for k, v in os.environ.items() if k not in _HEAD_ONLY}
        runtime_env = spec.parse_runtime_env_json(job.runtime_env_json)
        env.update(runtime_env.get("env_vars", {}))
        driver_env = spec.driver_runtime_env(runtime_env, unpacked)
        if driver_env:
            env[JOB_RUNTIME_ENV] = json.dumps(driver_env)
        env.update({"RTML_ADDRESS": self.address, "RTML_TOKEN": self.token,
                    "RTML_SESSION_DIR": str(self.session.root),
                    "RTML_JOB_SUBMISSION_ID": job.submission_id, "PYTHONUNBUFFERED": "1"})
        return env

    # -- carrying out the table's commands -----------------------------------------------------

    def _carry_out(self, commands: list[jobs.Command]) -> bool:
        """Carry out ``commands``; True if one of them is a Launch (its task launches)."""
        launch = False
        for command in commands:
            if isinstance(command, jobs.Record):
                job = command.job
                self.writes.write(self.plane.put_submission, job.submission_id, job.record())
            elif isinstance(command, jobs.Launch):
                launch = True
            elif isinstance(command, jobs.Terminate):
                self._terminate(command)
            elif isinstance(command, jobs.KillGroup):
                signal_group(command.pid, command.pid_started, signal.SIGKILL)
            elif isinstance(command, jobs.Ended):
                self._ended(command.submission_id)
            else:
                self._forget(command.submission_id)
        return launch

    def _terminate(self, command: jobs.Terminate) -> None:
        log.info("stopping job %s (pid %d)", command.submission_id, command.pid)
        signal_group(command.pid, command.pid_started, signal.SIGTERM)
        self._grace[command.submission_id] = asyncio.get_running_loop().call_later(
            STOP_GRACE, signal_group, command.pid, command.pid_started, signal.SIGKILL)

    def _ended(self, sid: str) -> None:
        timer = self._grace.pop(sid, None)
        if timer is not None:
            timer.cancel()
        job_log = self._logs.pop(sid, None)
        if job_log is not None:
            job_log.end()
        job = self.table.jobs.get(sid)
        if job is not None:
            log.info("job %s ended %s: %s", sid, job.status, job.message.split("\n")[0])

    def _forget(self, sid: str) -> None:
        self.writes.write(self.plane.delete_submission, sid)
        paths = (self.session.log_file(f"job-driver-{sid}"), self.session.root / "jobs" / sid)
        self._spawn(f"removing job {sid}'s files", asyncio.to_thread(_remove, *paths))


def signal_group(pid: int, pid_started: str, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` leads, unless ``pid`` now names another
    process (its start time is not ``pid_started``). A leader that exited leaves its
    group's id in use while members remain, so no other group can have it."""
    if pid <= 0:
        return
    now = process_start_time(pid)
    if now is not None and pid_started and now != pid_started:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _dies_with_us() -> Callable[[], None] | None:
    """A ``preexec_fn``: the child is SIGKILLed when the head exits (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(die_with_parent, os.getpid())


def _refusal(msg: Any, error: str) -> m.Msg:
    if isinstance(msg, m.ListJobs):
        return m.JobList(msg.req_id, [], error)
    if isinstance(msg, m.GetJobLogs):
        return m.JobLogs(msg.req_id, b"", True, error)
    return m.JobAnswer(msg.req_id, False, getattr(msg, "submission_id", ""), error)


async def _guarded(what: str, coro: Coroutine[Any, Any, None]) -> None:
    """A task of the runner's group: its failure is logged, not the head's end."""
    try:
        await coro
    except Exception:
        log.exception("%s failed", what)


def _remove(log_path: Path, directory: Path) -> None:
    log_path.unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


# -- a job's output --------------------------------------------------------------------------

class _Follower:
    """A ``GetJobLogs(follow)`` asker: sent the log so far, then each chunk as it comes."""

    def __init__(self, peer: Peer, req_id: int) -> None:
        self.peer = peer
        self.req_id = req_id
        self.caught_up = False  # the log so far was sent: chunks go straight out
        self.queued: list[bytes] = []
        self.ended = False
        self.gone = False  # sent its end (an error): nothing more

    def feed(self, data: bytes) -> None:
        if self.gone:
            return
        if self.caught_up:
            self.peer.send(m.JobLogs(self.req_id, data))
        else:
            self.queued.append(data)

    def end(self) -> None:
        self.ended = True
        if self.caught_up and not self.gone:
            self.peer.send(m.JobLogs(self.req_id, b"", end=True))

    def catch_up(self) -> None:
        self.caught_up = True
        for data in self.queued:
            self.peer.send(m.JobLogs(self.req_id, data))
        self.queued.clear()
        if self.ended:
            self.peer.send(m.JobLogs(self.req_id, b"", end=True))


class _JobLog:
    """One job's log: the file, its size, its end (for a failure's message), followers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: Any = None
        self.written = 0
        self._tail = bytearray()
        self.followers: list[_Follower] = []

    def open(self) -> None:
        self.file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed by end()
        self.written = self.file.tell()

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.written += len(data)
        self._tail += data
        del self._tail[:-TAIL_BYTES]
        for follower in self.followers:
            follower.feed(data)

    def tail(self) -> str:
        return self._tail.decode(errors="replace")

    def end(self) -> None:
        if self.file is not None:
            self.file.close()
        for follower in self.followers:
            follower.end()
        self.followers.clear()


class _Pump(asyncio.Protocol):
    """Reads a job's output pipe; ``done`` once it closed."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self.write = write
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _send_log(peer: Peer, req_id: int, path: Path, size: int | None,
                    follower: _Follower | None) -> None:
    """The log's first ``size`` bytes (None: all), read in a thread; then the follower
    takes over, or the end is sent."""
    try:
        data = await asyncio.to_thread(_read, path, size)
    except OSError as exc:
        peer.send(m.JobLogs(req_id, b"", True, f"cannot read the job's log {path}: {exc}"))
        if follower is not None:
            follower.gone = True
        return
    for start in range(0, len(data), LOG_CHUNK):
        peer.send(m.JobLogs(req_id, data[start:start + LOG_CHUNK]))
    if follower is None:
        peer.send(m.JobLogs(req_id, b"", end=True))
    else:
        follower.catch_up()


def _read(path: Path, size: int | None) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read() if size is None else f.read(size)
    except FileNotFoundError:
        return b""

