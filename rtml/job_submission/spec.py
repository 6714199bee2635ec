"""What a job submission is, shared by the client that makes one and the head that runs
it: the job's states (Ray's ``JobStatus``), the rules for a submission id, and which
``runtime_env`` a job may carry.

    client: check_submission_id, check_runtime_env; working_dir packed (working_dir.py)
    head:   the same checks again (a token holder's message is checked where it
            arrives); env_vars set for the entrypoint; driver_runtime_env -> the
            entrypoint's JOB_RUNTIME_ENV, which its ``rtml.init`` takes as the job's
            runtime_env (so its tasks and actors get the working dir, env_vars and pip
            packages on every node)

A job's ``runtime_env`` takes ``working_dir`` (a local directory, uploaded), ``excludes``
(left out of it), ``env_vars`` and ``pip`` (for the workers: the entrypoint itself runs
in the head node's Python). ``py_modules`` name paths on the submitting machine, which
the head cannot read: they are refused with that reason (give them to the script's own
``rtml.init(runtime_env=...)``, or put them in the working_dir).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
from enum import StrEnum
from typing import Any

from rtml.core import runtime_env as envs


class JobStatus(StrEnum):
    """The state of a submitted job, as Ray's ``ray.job_submission.JobStatus`` (a str:
    ``JobStatus.RUNNING == "RUNNING"``)."""

    PENDING = "PENDING"  # accepted; its working dir is being unpacked
    RUNNING = "RUNNING"  # its entrypoint runs
    STOPPED = "STOPPED"  # stopped by stop_job / ``rtml job stop``
    SUCCEEDED = "SUCCEEDED"  # its entrypoint exited with 0
    FAILED = "FAILED"  # its entrypoint exited otherwise, could not start, or its head died

    def is_terminal(self) -> bool:
        """Whether the job has ended (it will not change state again)."""
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED})

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_ALPHABET = string.ascii_letters + string.digits


def new_submission_id() -> str:
    """A fresh id, as Ray's ``raysubmit_<16 letters and digits>``."""
    return "rtmlsubmit_" + "".join(secrets.choice(_ALPHABET) for _ in range(16))


def check_submission_id(submission_id: str) -> str:
    """Return ``submission_id`` if it can name a job (and its files). Raises ValueError."""
    if not isinstance(submission_id, str) or not _ID.fullmatch(submission_id):
        raise ValueError(f"submission id {submission_id!r} must be 1-128 letters, digits, "
                         f"'_', '.' or '-', starting with a letter or digit")
    return submission_id


def check_runtime_env(runtime_env: Any) -> dict[str, Any]:
    """``runtime_env`` (None: none) if a job can honour it. Raises ValueError (TypeError
    for a value of the wrong type) naming what cannot be, and what to do."""
    if runtime_env is None:
        return {}
    if isinstance(runtime_env, dict) and "py_modules" in runtime_env:
        raise ValueError("runtime_env 'py_modules' is not supported for rtml jobs: its "
                         "paths are the submitting machine's; put the modules in the "
                         "working_dir, or pass py_modules to rtml.init(runtime_env=...) in "
                         "the script")
    env = envs.check(runtime_env) or {}
    if env.get("working_dir") is not None:
        env["working_dir"] = os.fspath(env["working_dir"])  # (checked: a str or a path)
    return env


def driver_runtime_env(runtime_env: dict[str, Any], working_dir: str | None) -> dict[str, Any]:
    """The runtime_env the entrypoint's ``rtml.init`` takes (JOB_RUNTIME_ENV): the job's,
    with its uploaded working dir where the head unpacked it (None: none uploaded)."""
    env = {k: v for k, v in runtime_env.items() if k in ("env_vars", "pip") and v}
    if working_dir is not None:
        env["working_dir"] = working_dir
    return env


def runtime_env_json(runtime_env: dict[str, Any]) -> str:
    """The runtime_env as it travels and is recorded ('' for none)."""
    return json.dumps(runtime_env, sort_keys=True) if runtime_env else ""


def parse_runtime_env_json(text: str) -> dict[str, Any]:
    """The checked runtime_env of its JSON text ('' -> {}). Raises ValueError / TypeError."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"runtime_env is not valid JSON: {exc}") from None
    return check_runtime_env(value)
