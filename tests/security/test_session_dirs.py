"""Session directories nobody else can have changed (issue 17, item 2): per user by
default (``$TMPDIR/rtml-<uid>/``), and refused, with the directory named and the fix,
when it or one rtml makes above it is someone else's, a symlink, or writable by others.

Each victim is a fresh rtml process whose ``TMPDIR`` is a sticky, world-writable
directory (a private /tmp); the attacker runs as uid 65534 (nobody), which needs root,
so those tests are skipped elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtml.session import process_start_time

NOBODY = 65534
as_another_user = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="needs root (to run the attacker as uid 65534) and /usr/bin/python3")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp (mode 1777) that uid 65534 can reach."""
    path = Path(tempfile.mkdtemp(prefix="rtml-test-tmp-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _rtml(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``rtml ARGS`` as a fresh process of this user whose temporary directory is ``tmp``."""
    return subprocess.run([sys.executable, "-m", "rtml.cli.main", *args],
                          env=_env(tmp), capture_output=True, text=True, timeout=60,
                          cwd=tmp)


def _python(tmp: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=_env(tmp), capture_output=True,
                          text=True, timeout=60, cwd=tmp)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTML_")}
    return {**env, "TMPDIR": str(tmp), "PYTHONPATH": str(Path(__file__).parents[2])}


def _as_nobody(code: str) -> None:
    subprocess.run(["/usr/bin/python3", "-c", code], user=NOBODY, group=NOBODY, check=True,
                   timeout=60, cwd="/")


INIT = ("import rtml\ntry:\n    rtml.init({})\nexcept Exception as exc:\n"
        "    print(type(exc).__name__, exc)\nelse:\n    print('joined')\n    rtml.shutdown()")


@as_another_user
def test_a_session_directory_another_user_made_first_is_refused(shared_tmp: Path) -> None:
    base = shared_tmp / f"rtml-{os.geteuid()}"
    sleeper = subprocess.Popen(["sleep", "60"])  # what the planted session.json lists
    try:
        _as_nobody(
            "import json, os, socket\n"
            f"root = {str(base / 'session_latest')!r}\n"
            "os.makedirs(root + '/sockets', 0o777)\n"
            "for d in (root, root + '/sockets', os.path.dirname(root)):\n"
            "    os.chmod(d, 0o777)\n"
            "socket.socket(socket.AF_UNIX).bind(root + '/sockets/nm.sock')\n"
            f"record = {{'head_address': '127.0.0.1:1', 'nm_address': 'unix:' + root + "
            f"'/sockets/nm.sock', 'processes': [{{'pid': {sleeper.pid}, 'name': 'head', "
            f"'start_time': {process_start_time(sleeper.pid)!r}}}]}}\n"
            "json.dump(record, open(root + '/session.json', 'w'))\n"
            "open(root + '/token', 'w').write('a' * 32)\n")
        for args in (["stop"], ["status"], ["start", "--head", "--port", "0"]):
            done = _rtml(shared_tmp, *args)
            assert done.returncode == 1, (args, done.stdout, done.stderr)
            assert f"refusing the session directory {base}" in done.stderr, done.stderr
            assert "belongs to uid 65534" in done.stderr and "--session-dir" in done.stderr
        for how in ("", "address='auto'"):
            done = _python(shared_tmp, INIT.format(how))
            assert done.stdout.startswith("RtmlSystemError refusing the session directory "
                                          f"{base}"), (how, done.stdout, done.stderr)
        assert sleeper.poll() is None  # rtml stop signalled nothing
        assert sorted(os.listdir(base)) == ["session_latest"]  # nothing made in theirs
    finally:
        sleeper.kill()
        sleeper.wait()


@as_another_user
def test_a_symlink_in_place_of_the_users_directory_is_refused(shared_tmp: Path) -> None:
    theirs = shared_tmp / "theirs"
    _as_nobody(f"import os; os.mkdir({str(theirs)!r}, 0o777); os.chmod({str(theirs)!r}, "
               f"0o777); os.symlink({str(theirs)!r}, "
               f"{str(shared_tmp / f'rtml-{os.geteuid()}')!r})")
    done = _python(shared_tmp, INIT.format(""))
    assert "RtmlSystemError refusing the session directory" in done.stdout, done.stdout
    assert "it is a symlink" in done.stdout
    done = _rtml(shared_tmp, "start", "--head", "--port", "0")
    assert done.returncode == 1 and "it is a symlink" in done.stderr, done.stderr
    assert os.listdir(theirs) == []


def test_directories_others_may_write_are_refused(shared_tmp: Path) -> None:
    open_dir = shared_tmp / "open"
    open_dir.mkdir(mode=0o700)
    open_dir.chmod(0o775)  # ours, but the group may write it
    loose = shared_tmp / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # world-writable and not sticky: anyone may rename what is inside
    inner = loose / "session"
    try:
        done = _rtml(shared_tmp, "start", "--head", "--port", "0", "--session-dir",
                     str(open_dir))
        assert done.returncode == 1, done.stderr
        assert f"refusing the session directory {open_dir}: it can be written by others " \
               "(mode 775)" in done.stderr
        done = _rtml(shared_tmp, "start", "--head", "--port", "0", "--session-dir",
                     str(inner))
        assert done.returncode == 1, done.stderr
        assert f"refusing the session directory {loose}: it can be written by others and " \
               "is not sticky" in done.stderr
        assert not inner.exists()
    finally:  # (a start that was not refused must not outlive the test)
        for session in (open_dir, inner):
            if (session / "session.json").exists():
                _rtml(shared_tmp, "stop", "--session-dir", str(session))


def test_the_default_session_is_per_user_and_shadows_nothing(shared_tmp: Path) -> None:
    started = _rtml(shared_tmp, "start", "--head", "--port", "0", "--num-cpus", "1")
    assert started.returncode == 0, started.stderr
    try:
        base = shared_tmp / f"rtml-{os.geteuid()}"
        root = base / "session_latest"
        for path in (base, root, root / "sockets", root / "logs", root / "spill"):
            st = os.lstat(path)
            assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700), path
        assert sorted(p.name for p in shared_tmp.iterdir()) == [base.name]  # no "rtml"
        joined = _python(shared_tmp, "import rtml; rtml.init(address='auto'); "
                         "print(rtml.get(rtml.put(41)) + 1, rtml.__file__); rtml.shutdown()")
        assert joined.stdout.split()[0] == "42", joined.stderr
        assert joined.stdout.split()[1] == str(Path(__file__).parents[2] / "rtml" /
                                               "__init__.py")
        record = json.loads((root / "session.json").read_text())
        assert record["head_address"]
    finally:
        stopped = _rtml(shared_tmp, "stop")
        assert stopped.returncode == 0, stopped.stderr
