"""``JobSubmissionClient``: Ray's job SDK, served by the head over rtml's own protocol.

    JobSubmissionClient(address)   address, else RTML_ADDRESS, else this machine's session
        submit_job  --SubmitJob(the working_dir as a zip)-->  head  <--JobAnswer(id)
        stop_job / delete_job --StopJob / DeleteJob-->             <--JobAnswer
        get_job_status / get_job_info / list_jobs --ListJobs-->    <--JobList
        get_job_logs  --GetJobLogs-->                              <--JobLogs ... (end)
        tail_job_logs --GetJobLogs(follow)--> (async)              <--JobLogs ... as printed

Every call opens its own connection, and the handshake proves the cluster token (an
HMAC of both nonces, ``rtml.rpc.auth``) before the head reads a request: whoever lacks
the token runs nothing. Ray's HTTP job API asks for no proof (CVE-2023-48022); rtml's
token is the cluster's, from ``token=``, ``RTML_TOKEN``, or this machine's session.

Errors: ConnectionError (the head cannot be reached, or refused the token), RuntimeError
(the head refused the request: no such job, a duplicate id; as Ray's client), ValueError
and TypeError (arguments that cannot be sent: a working_dir too large, an unsupported
runtime_env key).
"""

from __future__ import annotations

import codecs
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rtml.exceptions import ProtocolError
from rtml.ids import new_client_id
from rtml.job_submission import spec, working_dir
from rtml.job_submission.spec import JobStatus
from rtml.rpc import messages as m
from rtml.rpc.client import FramedClient, connect_socket, handshake, make_hello
from rtml.rpc.framing import FrameDecoder, frame
from rtml.session import Session, default_session_dir

REQUEST_TIMEOUT = 30.0
"""Seconds a request waits for the head's answer (a submit carries its upload)."""

R = TypeVar("R", bound=m.Msg)


@dataclass(frozen=True)
class JobDetails:
    """A submitted job, in the fields of Ray's ``JobDetails`` (times in ms since the
    epoch; ``job_id``, the driver's, is not tracked: None)."""

    submission_id: str
    entrypoint: str
    status: JobStatus
    message: str
    start_time: int | None
    end_time: int | None
    metadata: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, Any] = field(default_factory=dict)
    entrypoint_num_cpus: float = 0.0
    driver_exit_code: int | None = None
    type: str = "SUBMISSION"
    job_id: str | None = None
    error_type: str | None = None

    @classmethod
    def of(cls, record: m.JobRecord) -> JobDetails:
        return cls(record.submission_id, record.entrypoint, JobStatus(record.status),
                   record.message, record.start_time or None, record.end_time or None,
                   dict(record.metadata), spec.parse_runtime_env_json(record.runtime_env_json),
                   record.entrypoint_num_cpus, record.exit_code)


def resolve(address: str | None = None, token: str | None = None,
            session_dir: str | None = None) -> tuple[str, str]:
    """The head's ``host:port`` and the token to prove: ``address`` (``"auto"``: this
    machine's session), else RTML_ADDRESS, else this machine's session; ``token``, else
    RTML_TOKEN, else the session's. Raises ConnectionError saying what to pass."""
    session = Session(Path(session_dir or default_session_dir()).absolute())
    address = address or os.environ.get("RTML_ADDRESS") or "auto"
    if address == "auto":
        record = session.check().read_record()
        if record is None or not record.get("head_address"):
            raise ConnectionError(
                f"no rtml cluster is recorded on this machine (no {session.record_file}); "
                f"pass the head's HOST:PORT (address=..., --address or RTML_ADDRESS), or "
                f"start one with `rtml start --head`")
        address = str(record["head_address"])
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not host or not port.isdigit():
        raise ConnectionError(
            f"the job address must be the head's HOST:PORT, as `rtml start --head` printed "
            f"it (RTML_ADDRESS=...), got {address!r}: rtml serves jobs on its "
            f"authenticated protocol, not over HTTP")
    token = token or os.environ.get("RTML_TOKEN") or session.check().read_token()
    if not token:
        raise ConnectionError("no cluster token: pass token=..., set RTML_TOKEN, or run on "
                              "the head's machine (its session holds the token)")
    return address, token


class JobSubmissionClient:
    """Submit jobs to a cluster and follow them, as Ray's ``JobSubmissionClient``.

    ``address``: the head's ``HOST:PORT`` or ``"auto"`` (None: RTML_ADDRESS, else this
    machine's session). ``metadata`` is merged into every job's. ``token``: the cluster
    token (None: RTML_TOKEN, else the session's). Raises ConnectionError if the head
    cannot be reached or refuses the token.
    """

    def __init__(self, address: str | None = None, metadata: dict[str, str] | None = None,
                 *, token: str | None = None, session_dir: str | None = None,
                 timeout: float = REQUEST_TIMEOUT) -> None:
        self.address, self._token = resolve(address, token, session_dir)
        self._metadata = dict(metadata or {})
        self._timeout = timeout
        self._ask(m.ListJobs(0, ""), m.JobList)  # a wrong token or address fails here

    def __repr__(self) -> str:
        return f"JobSubmissionClient({self.address!r})"

    def get_address(self) -> str:
        return self.address

    # -- requests ----------------------------------------------------------------------------

    def submit_job(self, *, entrypoint: str, submission_id: str | None = None,
                   runtime_env: dict[str, Any] | None = None,
                   metadata: dict[str, str] | None = None,
                   entrypoint_num_cpus: float | None = None,
                   entrypoint_num_gpus: float | None = None,
                   entrypoint_memory: int | None = None,
                   entrypoint_resources: dict[str, float] | None = None,
                   job_id: str | None = None) -> str:
        """Run the shell command ``entrypoint`` on the head's node; returns its submission
        id at once (the job is PENDING, then RUNNING). ``runtime_env``: ``working_dir``
        (a local directory, uploaded as a zip of at most 100 MiB), ``excludes``,
        ``env_vars``. ``entrypoint_num_cpus`` is recorded, not reserved. Raises
        RuntimeError (refused: a duplicate id...), ValueError / TypeError (arguments)."""
        for name, value in (("entrypoint_num_gpus", entrypoint_num_gpus),
                            ("entrypoint_memory", entrypoint_memory),
                            ("entrypoint_resources", entrypoint_resources)):
            if value:
                raise ValueError(f"{name} is not supported: an rtml job's entrypoint runs "
                                 f"on the head's node, reserving nothing")
        env = spec.check_runtime_env(runtime_env)
        upload = b""
        if env.get("working_dir"):
            upload = working_dir.pack(env["working_dir"], env.get("excludes", []))
        if submission_id or job_id:
            spec.check_submission_id(submission_id or job_id or "")
        msg = m.SubmitJob(0, submission_id or job_id or "", entrypoint, upload,
                          spec.runtime_env_json(env),
                          {**self._metadata, **(metadata or {})},
                          float(entrypoint_num_cpus or 0.0))
        return self._answered(msg)

    def stop_job(self, job_id: str) -> bool:
        """Stop the job (SIGTERM to its processes, SIGKILL after 3 s): True if it had
        not ended, False if it had. Raises RuntimeError if there is no such job."""
        return self._ask_ok(m.StopJob(0, job_id))

    def delete_job(self, job_id: str) -> bool:
        """Forget an ended job (its record, log and working dir); True. Raises
        RuntimeError if there is none, or it has not ended (stop it first)."""
        return self._ask_ok(m.DeleteJob(0, job_id))

    def get_job_info(self, job_id: str) -> JobDetails:
        """The job's details. Raises RuntimeError if there is no such job."""
        return JobDetails.of(self._listing(job_id)[0])

    def get_job_status(self, job_id: str) -> JobStatus:
        return self.get_job_info(job_id).status

    def list_jobs(self) -> list[JobDetails]:
        """Every job the head knows (also those of an earlier head), oldest first."""
        return [JobDetails.of(record) for record in self._listing("")]

    def get_job_logs(self, job_id: str) -> str:
        """Everything the job printed so far (stdout and stderr)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = "".join(decoder.decode(data) for data in self._log_chunks(job_id))
        return text + decoder.decode(b"", final=True)

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        """What the job prints, as it prints it (from the start), until it ends: an async
        iterator of text chunks, as Ray's."""
        client, _ = await FramedClient.connect(self.address, self._token, _hello(),
                                               timeout=self._timeout)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            client.send(m.GetJobLogs(0, job_id, follow=True))
            while True:
                msg = await client.receive()
                if not isinstance(msg, m.JobLogs):
                    continue
                if msg.error:
                    raise RuntimeError(msg.error)
                text = decoder.decode(msg.data, final=msg.end)
                if text:
                    yield text
                if msg.end:
                    return
        finally:
            client.close()

    # -- the wire ----------------------------------------------------------------------------

    def _listing(self, job_id: str) -> list[m.JobRecord]:
        reply = self._ask(m.ListJobs(0, job_id), m.JobList)
        if reply.error:
            raise RuntimeError(reply.error)
        return reply.jobs

    def _answered(self, msg: m.Msg) -> str:
        reply = self._ask(msg, m.JobAnswer)
        if not reply.ok:
            raise RuntimeError(reply.error or f"the head at {self.address} refused the job")
        return reply.submission_id

    def _ask_ok(self, msg: m.Msg) -> bool:
        reply = self._ask(msg, m.JobAnswer)
        if reply.error:
            raise RuntimeError(reply.error)
        return reply.ok

    def _ask(self, msg: m.Msg, reply_type: type[R]) -> R:
        for reply in self._exchange(msg, self._timeout):
            if isinstance(reply, reply_type):
                return reply
        raise ConnectionError(f"the head at {self.address} closed the connection before "
                              f"answering")

    def _log_chunks(self, job_id: str) -> Iterator[bytes]:
        for reply in self._exchange(m.GetJobLogs(0, job_id), self._timeout):
            if isinstance(reply, m.JobLogs):
                if reply.error:
                    raise RuntimeError(reply.error)
                yield reply.data
                if reply.end:
                    return

    def _exchange(self, msg: m.Msg, timeout: float) -> Iterator[Any]:
        """Connect, prove the token, send ``msg``; yield what the head answers."""
        try:
            sock = connect_socket(self.address, timeout)
        except OSError as exc:
            raise ConnectionError(f"cannot reach the rtml head at {self.address} "
                                  f"({exc or type(exc).__name__}); check the address and "
                                  f"that `rtml start --head` runs there") from None
        try:
            try:
                sock, _ = handshake(sock, self._token, _hello())
            except ProtocolError as exc:
                raise ConnectionError(f"the head at {self.address} refused this client "
                                      f"({exc}): give the cluster's token (token=..., "
                                      f"RTML_TOKEN, or a copy of the head's <session>/token)"
                                      ) from None
            sock.sendall(frame(m.encode(msg)))
            yield from _replies(sock, self.address)
        finally:
            sock.close()


def _hello() -> m.Hello:
    return make_hello("cli", new_client_id())


def _replies(sock: socket.socket, address: str) -> Iterator[Any]:
    decoder = FrameDecoder()
    while True:
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            raise ConnectionError(f"the head at {address} did not answer in time") from None
        if not data:
            return
        for payload in decoder.feed(data):
            yield m.decode(payload)

