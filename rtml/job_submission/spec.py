"""What a job submission is, shared by the client that makes one and the head that runs
it: the job's states (Ray's ``JobStatus``), the rules for a submission id, and which
``runtime_env`` keys a job may carry.

    client: check_submission_id, split_runtime_env (working_dir packed, the rest sent)
    head:   check_submission_id, check_runtime_env (again: a token holder's message is
            checked where it arrives), env_vars applied to the entrypoint's environment

``runtime_env`` takes ``working_dir`` (a local directory, uploaded), ``excludes``
(patterns left out of it) and ``env_vars`` (set for the entrypoint). The entrypoint is
a driver, so ``rtml.init()`` runs there with its defaults; rtml's ``init`` has no
``runtime_env`` of its own (yet), so other keys (pip, conda, py_modules, ...) are
refused with the reason rather than ignored.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from enum import StrEnum
from typing import Any


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

RUNTIME_ENV_KEYS = ("working_dir", "excludes", "env_vars")
"""The runtime_env keys a submitted job may carry (module docstring)."""


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
    """``runtime_env`` (None: none) if rtml can honour it for a job. Raises ValueError
    (TypeError for a value of the wrong type) naming what cannot be."""
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
    unknown = sorted(set(runtime_env) - set(RUNTIME_ENV_KEYS))
    if unknown:
        raise ValueError(f"runtime_env {', '.join(map(repr, unknown))} is not supported for "
                         f"rtml jobs: give only {', '.join(RUNTIME_ENV_KEYS)} (install "
                         f"packages on the cluster's machines instead)")
    env_vars = runtime_env.get("env_vars", {})
    if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k
            for k, v in env_vars.items()):
        raise TypeError("runtime_env['env_vars'] must be a dict of variable names "
                        "(without '=') to str values")
    excludes = runtime_env.get("excludes", [])
    if not isinstance(excludes, list) or not all(isinstance(p, str) for p in excludes):
        raise TypeError("runtime_env['excludes'] must be a list of str patterns")
    working_dir = runtime_env.get("working_dir")
    if working_dir is not None and not isinstance(working_dir, str):
        raise TypeError("runtime_env['working_dir'] must be a local directory path (str)")
    return dict(runtime_env)


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
