"""Runtime environments, the worker's half: a worker is started for one env (its
``WorkerConfig.runtime_env``) and sets it up before it serves anything.

    node manager  RequestLease.runtime_env (a task's) / ActorSpec.runtime_env (an actor's)
                  --> LocalScheduler: an idle worker of that env, else StartWorker(env)
                  --> WorkerConfig.runtime_env --> the zygote forks --> rtml.worker.main
    worker        pip: ensure_venv(), once per node and requirements (flock): python -m
                       venv --system-site-packages, a .pth to the packages rtml runs from,
                       pip install, a check that rtml imports there; then exec into its
                       python (the same pid, so the node manager's watch holds)
                  connect, then apply(): each package fetched from the control plane once
                       per node, checked against its hash, unpacked under
                       <session>/runtime_resources/packages/<hash>; env_vars set (``${X}``
                       expanded); cwd = the working_dir; it and py_modules first on sys.path
                  a setup that fails: every task sent to it is answered with
                  RuntimeEnvSetupError and an actor's creation fails with it; the worker
                  idles out as any other

Why a worker per env (as Ray starts one per runtime env) rather than setting a task's env
around its run in shared workers and undoing it after: an env cannot be undone in full.
Libraries read environment variables when they are imported (``OMP_NUM_THREADS``,
``CUDA_VISIBLE_DEVICES``), a working_dir's modules stay in ``sys.modules`` and in the
objects made from them, threads a task started keep its cwd, and pip packages of another
version cannot be unloaded at all: the only process that has run nothing of another env
is one of its own. So nothing leaks: a worker without an env never ran a task with one,
and a task without one never lands in an env worker (the lease queue's key, and the
node's match of idle workers, carry the env). The cost is a fork per env and node (a
venv's python, ~0.5 s of imports, for a pip env), then nothing: the plain path is
unchanged, and env workers are reused by every task of the same env, whichever job.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rtml.core.runtime_env import expand, zip_digest
from rtml.exceptions import RtmlError, RuntimeEnvSetupError

if TYPE_CHECKING:
    from rtml.control_plane import ControlPlane

RESOURCES = "runtime_resources"
"""The cache under the session directory: ``packages/<hash>/``, ``pip/<hash>/``."""
CONFIG_ENV = "RTML_WORKER_CONFIG"
"""A worker that execs into a venv's python passes its config here (not on the command
line, where every local user reads it)."""
PIP_TIMEOUT = 600.0
"""Seconds a virtualenv's making and its pip install may take (Ray's setup timeout)."""
READY = ".rtml-ready"
_BOOT = "import sys\nfrom rtml.worker import main\nsys.exit(main.main(['worker_main']))\n"


def resources_dir(session_dir: str) -> Path:
    path = Path(session_dir) / RESOURCES
    path.mkdir(mode=0o700, exist_ok=True)
    return path


# -- pip: a virtualenv per requirements, per node ---------------------------------------------

def ensure_venv(session_dir: str, requirements: list[str]) -> Path:
    """The virtualenv with ``requirements`` installed, made if this node has none yet.
    Raises RuntimeEnvSetupError (the venv or the install failed)."""
    # The same under the venv's own python (which runs this again after the exec).
    base_python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    key = json.dumps([sys.version, base_python, _rtml_home(), requirements])
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    base = resources_dir(session_dir) / "pip"
    base.mkdir(mode=0o700, exist_ok=True)
    venv = base / digest
    with open(base / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker of the node makes it; others wait
        if (venv / READY).exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one (its maker died)
        try:
            _make_venv(venv, requirements)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / READY).write_text("\n".join(requirements) + "\n")
    return venv


def _make_venv(venv: Path, requirements: list[str]) -> None:
    has_pip = importlib.util.find_spec("pip") is not None
    _run([sys.executable, "-m", "venv", "--system-site-packages",
          *(["--without-pip"] if has_pip else []), str(venv)], "making a virtualenv")
    python = str(venv / "bin" / "python")
    site_dir = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    "reading the virtualenv's site-packages").strip()
    (Path(site_dir) / "_rtml_parent.pth").write_text(_parent_pth())
    (venv / "requirements.txt").write_text("\n".join(requirements) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python] if has_pip else [python, "-m",
                                                                              "pip"]
    _run([*pip, "install", "--no-input", "-r", str(venv / "requirements.txt")],
         f"pip install of {requirements}", hint="fix the requirement (a name and version "
         "the package index has), or leave 'pip' out")
    _run([python, "-c", "import rtml.worker.main"], "importing rtml in the new virtualenv",
         hint="a requirement replaced a package rtml needs; pin a compatible version")


def _parent_pth() -> str:
    """What makes the packages rtml runs from importable in the venv, after its own (a
    ``.pth`` line is added behind the venv's site-packages, so its pip packages win)."""
    lines = []
    if sys.prefix != sys.base_prefix:  # we run in a venv: its packages are rtml's
        lines += [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
    home = _rtml_home()
    if home not in site.getsitepackages():
        lines.append(home)
    return "\n".join(lines) + "\n"


def _rtml_home() -> str:
    """The directory rtml is imported from."""
    import rtml
    return str(Path(rtml.__file__).resolve().parent.parent)


def _run(command: list[str], what: str, hint: str = "") -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeEnvSetupError(f"{what} took more than {PIP_TIMEOUT:g} s") from None
    except OSError as exc:
        raise RuntimeEnvSetupError(f"{what} could not start: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        fix = f"; {hint}" if hint else ""
        raise RuntimeEnvSetupError(f"{what} failed (exit {done.returncode}){fix}:\n{tail}")
    return done.stdout


def in_venv(venv: Path) -> bool:
    return Path(sys.prefix).resolve() == venv.resolve()


def exec_in(venv: Path, config_json: str) -> NoReturn:
    """Become this worker again under the venv's python (same pid: the node manager's
    pidfd and the zygote's subreaping hold)."""
    python = str(venv / "bin" / "python")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(python, [python, "-u", "-c", _BOOT], {**os.environ, CONFIG_ENV: config_json})


# -- packages and the rest --------------------------------------------------------------------

def apply(env: dict[str, Any], session_dir: str, plane: ControlPlane) -> int:
    """Set ``env`` up in this process (the pip part is done by then); returns how many
    paths it put first on sys.path. Raises RuntimeEnvSetupError."""
    front = []
    try:
        working = env.get("working_dir")
        if working:
            front.append(_use(ensure_package(plane, session_dir, working["package"]),
                              working["root"]))
        for module in env.get("py_modules", ()):
            front.append(_use(ensure_package(plane, session_dir, module["package"]),
                              module["root"]))
        if working:
            os.chdir(front[0])
    except (OSError, RtmlError) as exc:
        if isinstance(exc, RuntimeEnvSetupError):
            raise
        raise RuntimeEnvSetupError(f"its packages could not be unpacked: {exc}") from None
    for name, value in env.get("env_vars", {}).items():
        os.environ[name] = expand(value)
    for path in reversed(front):
        sys.path.insert(0, path)
    return len(front)


def _use(unpacked: Path, root: str) -> str:
    return str(unpacked / root) if root else str(unpacked)


def ensure_package(plane: ControlPlane, session_dir: str, digest: str) -> Path:
    """The package ``digest`` unpacked on this node (fetched the first time). Raises
    RuntimeEnvSetupError: not in the control plane, or not what its name says."""
    base = resources_dir(session_dir) / "packages"
    target = base / digest
    if target.is_dir():
        return target
    base.mkdir(mode=0o700, exist_ok=True)
    data = plane.fetch_package(digest)
    if data is None:
        raise RuntimeEnvSetupError(
            f"package {digest[:16]} is not in the control plane (the driver uploads it "
            f"before its first task or actor; a control plane started afresh has lost "
            f"it): run the job again")
    if zip_digest(data)[0] != digest:
        raise RuntimeEnvSetupError(f"the control plane's package {digest[:16]} does not "
                                   f"hash to its name: not unpacked")
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=base))
    try:
        _extract(data, tmp)
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # (else another worker of the node unpacked it first)
            raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    return target


def _extract(data: bytes, into: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            path = archive.extract(info, into)  # (names outside ``into`` are made safe)
            if not info.is_dir() and (info.external_attr >> 16) & 0o111:
                os.chmod(path, 0o755)
