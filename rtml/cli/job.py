"""``rtml job``: submit a job to the cluster's head and follow it, as ``ray job``.

::

    rtml job submit [--working-dir DIR] [--no-wait] -- python script.py ARGS
        -> JobSubmissionClient.submit_job --SubmitJob (authenticated)--> head
        -> "Job 'ID' submitted", then its logs as printed (tail_job_logs) until it ends
        -> exit 0 if it SUCCEEDED, else 1
    rtml job status | logs [--follow] | stop | delete ID,  rtml job list

The head is ``--address``, else RTML_ADDRESS, else the one recorded in this machine's
session (``--session-dir``); the token ``--token-file``, else RTML_TOKEN, else the
session's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rtml.cli.options import CliError, add_session_dir
from rtml.job_submission import JobDetails, JobStatus, JobSubmissionClient

SUBMIT_HELP = "run a shell command (a driver script) as a job on the cluster's head node"


def add_job_commands(sub: Any) -> None:
    """The ``rtml job ...`` subcommands."""
    job = sub.add_parser("job", help="submit, follow and stop jobs (as `ray job`)",
                         description="Submit, follow and stop jobs run by the cluster's head.")
    commands = job.add_subparsers(title="job commands")
    submit = _command(commands, "submit", cmd_submit, SUBMIT_HELP)
    submit.add_argument("--working-dir", default=None, metavar="DIR",
                        help="upload this directory (a zip, at most 100 MiB) and run the "
                             "entrypoint in it")
    submit.add_argument("--submission-id", default=None, metavar="ID")
    submit.add_argument("--runtime-env-json", default=None, metavar="JSON",
                        help='e.g. \'{"env_vars": {"K": "V"}, "excludes": ["data/*"]}\'')
    submit.add_argument("--metadata-json", default=None, metavar="JSON")
    submit.add_argument("--entrypoint-num-cpus", type=float, default=None, metavar="N",
                        help="recorded with the job (rtml reserves nothing for it)")
    submit.add_argument("--no-wait", action="store_true",
                        help="print the submission id and return; do not follow the logs")
    submit.add_argument("entrypoint", nargs=argparse.REMAINDER,
                        help="-- then the command, e.g. -- python script.py --arg 1")
    _command(commands, "status", cmd_status, "a job's status").add_argument("submission_id")
    logs = _command(commands, "logs", cmd_logs, "what a job printed (stdout and stderr)")
    logs.add_argument("submission_id")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="then what it prints, until it ends")
    stop = _command(commands, "stop", cmd_stop, "stop a job: SIGTERM, SIGKILL after 3 s")
    stop.add_argument("submission_id")
    stop.add_argument("--no-wait", action="store_true", help="do not wait for it to end")
    delete = _command(commands, "delete", cmd_delete, "forget an ended job and its files")
    delete.add_argument("submission_id")
    lst = _command(commands, "list", cmd_list, "every job the head knows")
    lst.add_argument("--format", choices=("table", "json"), default="table")


def _command(sub: Any, name: str, run: Any, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                     description=help_text)
    parser.set_defaults(run=run)
    parser.add_argument("--address", default=None, metavar="HOST:PORT",
                        help="the head (default: $RTML_ADDRESS, else this machine's session)")
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help="the cluster token's file (default: $RTML_TOKEN, else the "
                             "session's)")
    add_session_dir(parser)
    return parser


def _client(args: argparse.Namespace) -> JobSubmissionClient:
    token = None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"--token-file {args.token_file}: {exc.strerror}") from None
    try:
        return JobSubmissionClient(args.address, token=token, session_dir=args.session_dir)
    except ConnectionError as exc:
        raise CliError(str(exc)) from None


def _json_arg(flag: str, text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object")
    return value


# -- the commands ------------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace) -> int:
    words = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if not words:
        raise CliError("give the command to run after --, e.g. "
                       "`rtml job submit --working-dir . -- python script.py`")
    runtime_env = _json_arg("--runtime-env-json", args.runtime_env_json)
    if args.working_dir:
        runtime_env["working_dir"] = args.working_dir
    client = _client(args)
    try:
        submission_id = client.submit_job(
            entrypoint=shlex.join(words), submission_id=args.submission_id,
            runtime_env=runtime_env or None,
            metadata=_json_arg("--metadata-json", args.metadata_json),
            entrypoint_num_cpus=args.entrypoint_num_cpus)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    print(f"Job '{submission_id}' submitted successfully", flush=True)
    if args.no_wait:
        print(f"Follow it: rtml job logs {submission_id} --follow; stop it: rtml job stop "
              f"{submission_id}")
        return 0
    print("Tailing logs until the job exits (disable with --no-wait):", flush=True)
    _follow(client, submission_id, echo=True)
    details = _details(client, submission_id)
    print(_verdict(details), flush=True)
    return 0 if details.status is JobStatus.SUCCEEDED else 1


def cmd_status(args: argparse.Namespace) -> int:
    details = _details(_client(args), args.submission_id)
    print(f"Status for job '{details.submission_id}': {details.status}")
    print(f"Status message: {details.message}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        _follow(client, args.submission_id, echo=True)
        return 0
    try:
        sys.stdout.write(client.get_job_logs(args.submission_id))
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    sys.stdout.flush()
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = _client(args)
    try:
        stopping = client.stop_job(args.submission_id)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    if not stopping:
        print(f"Job '{args.submission_id}' had already ended: "
              f"{_details(client, args.submission_id).status}")
        return 0
    print(f"Attempting to stop job '{args.submission_id}'", flush=True)
    if not args.no_wait:
        _follow(client, args.submission_id, echo=False)  # returns once it ended
        print(_verdict(_details(client, args.submission_id)))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    try:
        _client(args).delete_job(args.submission_id)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    print(f"Job '{args.submission_id}' deleted")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _client(args).list_jobs()
    if args.format == "json":
        print(json.dumps([_row(job) for job in jobs], indent=2))
        return 0
    if not jobs:
        print("No jobs.")
        return 0
    header = ("SUBMISSION_ID", "STATUS", "START", "END", "ENTRYPOINT")
    rows = [(j.submission_id, str(j.status), _clock(j.start_time), _clock(j.end_time),
             j.entrypoint) for j in jobs]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return 0


# -- helpers -----------------------------------------------------------------------------------

def _follow(client: JobSubmissionClient, submission_id: str, echo: bool) -> None:
    """Print (``echo``) what the job prints until it ends."""
    async def follow() -> None:
        async for text in client.tail_job_logs(submission_id):
            if echo:
                sys.stdout.write(text)
                sys.stdout.flush()

    try:
        asyncio.run(follow())
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    except (ConnectionError, OSError) as exc:
        raise CliError(f"lost the head at {client.address} while following job "
                       f"{submission_id!r}: {exc}") from None


def _details(client: JobSubmissionClient, submission_id: str) -> JobDetails:
    try:
        return client.get_job_info(submission_id)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None


def _verdict(details: JobDetails) -> str:
    name = f"Job '{details.submission_id}'"
    if details.status is JobStatus.SUCCEEDED:
        return f"{name} succeeded"
    if details.status is JobStatus.STOPPED:
        return f"{name} was stopped"
    if details.driver_exit_code is not None:
        return f"{name} failed (its entrypoint exited with {details.driver_exit_code})"
    return f"{name} failed: {details.message}"


def _clock(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _row(job: JobDetails) -> dict[str, Any]:
    return {"submission_id": job.submission_id, "status": str(job.status),
            "entrypoint": job.entrypoint, "message": job.message,
            "start_time": job.start_time, "end_time": job.end_time,
            "metadata": job.metadata, "runtime_env": job.runtime_env,
            "entrypoint_num_cpus": job.entrypoint_num_cpus,
            "driver_exit_code": job.driver_exit_code}
