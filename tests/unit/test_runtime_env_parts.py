"""Runtime environments without processes: the checks, gitignore-style excludes, packages
named by their files' hash, merging, the node's match of workers to envs, and a worker's
unpacking of what the control plane holds."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest

from rtml.core import runtime_env as envs
from rtml.exceptions import RuntimeEnvSetupError
from rtml.scheduler.local import Grant, LocalScheduler, StartWorker
from rtml.worker import runtime_env as worker_env

ENV_A = envs.dumps({"env_vars": {"A": "1"}})
ENV_B = envs.dumps({"env_vars": {"B": "1"}})
OWNER = object()
ONE_CPU = {"CPU": 1.0}


def test_check_takes_ray_shaped_envs_and_returns_a_copy() -> None:
    given = {"env_vars": {"K": "v"}, "working_dir": ".", "py_modules": [Path(".")],
             "excludes": ["*.bin"], "pip": {"packages": ["x==1"], "pip_check": False}}
    checked = envs.check(given)
    assert checked == given and checked is not given
    assert envs.check(None) is None


@pytest.mark.parametrize(("env", "error", "match"), [
    ({"working_dri": "."}, ValueError, r"unknown runtime_env key\(s\) \['working_dri'\]; "
                                       r"valid keys are \['env_vars', 'excludes'"),
    ({"conda": "x", "uv": []}, ValueError, r"\['conda', 'uv'\] are not supported by rtml"),
    ({"env_vars": {"K": 1}}, TypeError, r"\['env_vars'\]\['K'\] must be a str, got 1"),
    ({"env_vars": {"A=B": "1"}}, TypeError, "names must be non-empty str without '='"),
    ({"env_vars": ["K"]}, TypeError, "must be a dict of str to str"),
    ({"working_dir": 3}, TypeError, r"\['working_dir'\] must be a path"),
    ({"working_dir": "gs://b/x.zip"}, ValueError, "local directories and .zip files only"),
    ({"py_modules": "mod"}, TypeError, "must be a list of paths or modules"),
    ({"excludes": "*.bin"}, TypeError, r"\['excludes'\] must be a list of str"),
    ({"pip": {"packages": [], "pip_version": "1"}}, ValueError, r"not \['pip_version'\]"),
    ({"pip": [1]}, TypeError, r"\['pip'\] must be a list of str"),
    ("env_vars", TypeError, "runtime_env must be a dict"),
])
def test_check_refuses_with_the_fix(env: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        envs.check(env)


@pytest.mark.parametrize(("pattern", "excluded", "kept"), [
    ("*.bin", ["a.bin", "d/e/f.bin"], ["a.bin.txt", "bin"]),
    ("logs/", ["logs", "d/logs"], []),  # (a directory: files named logs stay)
    ("/top.txt", ["top.txt"], ["d/top.txt"]),
    ("d/*.txt", ["d/x.txt"], ["d/e/x.txt", "x.txt"]),
    ("d/**/x.txt", ["d/x.txt", "d/e/f/x.txt"], ["x.txt"]),
    ("**/cache", ["cache", "a/b/cache"], ["cache2"]),
    ("file_[12].txt", ["file_1.txt", "a/file_2.txt"], ["file_3.txt"]),
    ("?.py", ["a.py"], ["ab.py"]),
])
def test_excludes_follow_gitignore(pattern: str, excluded: list[str], kept: list[str],
                                   tmp_path: Path) -> None:
    rules = envs.Excludes([pattern], tmp_path)
    for path in excluded:
        assert rules.excluded(path, is_dir=pattern.endswith("/")), path
    for path in kept:
        assert not rules.excluded(path, is_dir=False), path
    if pattern == "logs/":
        assert not rules.excluded("logs", is_dir=False)


def test_excludes_negation_comments_and_absolute_paths(tmp_path: Path) -> None:
    rules = envs.Excludes(["# a comment", "", "*.log", "!keep.log",
                           str(tmp_path / "secret" / "key"), "/elsewhere/x"], tmp_path)
    assert rules.excluded("a.log", False) and not rules.excluded("keep.log", False)
    assert rules.excluded("secret/key", False) and rules.excluded("elsewhere/x", False)
    assert not rules.excluded("other/secret/key", False)  # anchored where it was given


def make_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "data.bin").write_bytes(b"\1" * 100)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.pyc").write_bytes(b"stale")
    return root


def test_a_directory_is_named_by_its_files_and_zips_to_the_same_name(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "wd")
    prepared = envs.prepare({"working_dir": str(root), "env_vars": {"K": "v"}})
    (package,) = prepared.packages
    assert prepared.env == {"env_vars": {"K": "v"},
                            "working_dir": {"package": package.digest, "root": ""}}
    data = package.build()
    assert envs.zip_digest(data) == (package.digest, "")
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sorted(names) == ["data.bin", "pkg/__init__.py", "run.sh"]  # no __pycache__
    again = make_tree(tmp_path / "copy")  # the same files elsewhere: the same package
    assert envs.prepare({"working_dir": str(again)}).packages[0].digest == package.digest
    os.chmod(again / "run.sh", 0o644)  # an exec bit is part of what a package is
    assert envs.prepare({"working_dir": str(again)}).packages[0].digest != package.digest
    excluded = envs.prepare({"working_dir": str(root), "excludes": ["*.bin"]})
    assert excluded.packages[0].digest != package.digest


def test_modules_and_zips(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "mods")
    prepared = envs.prepare({"py_modules": [str(root / "pkg")]})
    names = zipfile.ZipFile(io.BytesIO(prepared.packages[0].build())).namelist()
    assert names == ["pkg/__init__.py"]  # the directory is the module: its name kept
    archive = tmp_path / "project.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("project/", "")
        zf.writestr("project/a.py", "A = 1\n")
    working = envs.prepare({"working_dir": str(archive)})
    assert working.env["working_dir"]["root"] == "project"
    assert envs.prepare({"py_modules": [str(archive)]}).env["py_modules"][0]["root"] == ""
    (tmp_path / "req.txt").write_text("# pinned\nx==1\n\n  y>2  \n")
    assert envs.prepare({"pip": str(tmp_path / "req.txt")}).env["pip"] == ["x==1", "y>2"]
    with pytest.raises(ValueError, match="cannot read this requirements file"):
        envs.prepare({"pip": str(tmp_path / "none.txt")})
    with pytest.raises(ValueError, match="is neither a directory nor a .zip"):
        envs.prepare({"working_dir": str(tmp_path / "req.txt")})


def test_merge_lets_the_call_win_per_key_and_merges_env_vars() -> None:
    job = {"env_vars": {"A": "job", "B": "job"}, "working_dir": {"package": "j", "root": ""},
           "pip": ["x"]}
    task = {"env_vars": {"B": "task"}, "working_dir": {"package": "t", "root": ""}}
    assert envs.merge(job, task) == {"env_vars": {"A": "job", "B": "task"}, "pip": ["x"],
                                     "working_dir": {"package": "t", "root": ""}}
    assert envs.dumps(envs.merge(job, task)) == envs.dumps(envs.merge(job, dict(task)))
    assert envs.dumps({}) == "" and envs.loads("") == {}


def test_expand_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RTENV_BASE", "/opt")
    monkeypatch.delenv("RTENV_NONE", raising=False)
    assert envs.expand("${RTENV_BASE}/lib:${RTENV_NONE}$HOME") == "/opt/lib:$HOME"


# -- the node: workers per env -------------------------------------------------------------

def test_a_lease_with_an_env_gets_a_worker_started_for_it_and_no_other() -> None:
    s = LocalScheduler(total={"CPU": 4.0}, pool_size=1)
    s.worker_ready(b"plain")
    commands = s.request_lease(OWNER, 1, ONE_CPU, runtime_env=ENV_A)
    assert commands == [StartWorker(runtime_env=ENV_A)]  # the idle plain worker is not it
    assert s.request_lease(OWNER, 2, ONE_CPU, runtime_env=ENV_A) == [
        StartWorker(runtime_env=ENV_A)]  # one start per waiting request, not more
    assert s.request_lease(OWNER, 3, ONE_CPU, runtime_env=ENV_B) == [
        StartWorker(runtime_env=ENV_B)]
    (grant,) = s.worker_ready(b"a1", ENV_A)
    assert isinstance(grant, Grant) and (grant.req_id, grant.worker_id) == (1, b"a1")
    (plain,) = s.request_lease(OWNER, 4, ONE_CPU)
    assert isinstance(plain, Grant) and plain.worker_id == b"plain"
    s.return_lease(grant.lease_id)  # a1 is idle again: the second ENV_A request takes it
    assert s.leases[max(s.leases)].worker_id == b"a1"
    assert s.env_starting == {ENV_A: 1, ENV_B: 1}
    assert s.worker_died(b"a2", was_starting=True, runtime_env=ENV_A) == []  # not wanted
    assert s.env_starting == {ENV_B: 1}
    assert s.request_lease(OWNER, 5, ONE_CPU, runtime_env=ENV_B) == [
        StartWorker(runtime_env=ENV_B)]
    assert s.worker_died(b"b1", was_starting=True, runtime_env=ENV_B) == [
        StartWorker(runtime_env=ENV_B)]  # two wait, one was left starting: one more


def test_idle_env_workers_are_reaped_beside_the_pool() -> None:
    s = LocalScheduler(total={"CPU": 4.0}, pool_size=1)
    s.worker_ready(b"plain")
    s.request_lease(OWNER, 1, ONE_CPU, runtime_env=ENV_A)
    (grant,) = s.worker_ready(b"a1", ENV_A)
    s.return_lease(grant.lease_id)
    assert s.reap_idle(2) == []
    assert s.reap_idle(2) == [b"a1"]  # the pool's one worker stays
    assert b"a1" not in s.worker_env and list(s.idle) == [b"plain"]


# -- the worker: unpacking ----------------------------------------------------------------

class FakePlane:
    def __init__(self, packages: dict[str, bytes]) -> None:
        self.packages = packages
        self.fetched = 0

    def fetch_package(self, digest: str) -> bytes | None:
        self.fetched += 1
        return self.packages.get(digest)


def test_a_package_is_fetched_once_per_node_checked_and_unpacked(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "wd")
    (package,) = envs.prepare({"working_dir": str(root)}).packages
    plane = FakePlane({package.digest: package.build(), "forged": package.build()})
    session = tmp_path / "session"
    session.mkdir()
    unpacked = worker_env.ensure_package(plane, str(session), package.digest)  # type: ignore[arg-type]
    assert unpacked == session / "runtime_resources" / "packages" / package.digest
    assert (unpacked / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert os.access(unpacked / "run.sh", os.X_OK)
    assert worker_env.ensure_package(plane, str(session), package.digest) == unpacked  # type: ignore[arg-type]
    assert plane.fetched == 1
    with pytest.raises(RuntimeEnvSetupError, match="does not hash to its name"):
        worker_env.ensure_package(plane, str(session), "forged")  # type: ignore[arg-type]
    with pytest.raises(RuntimeEnvSetupError, match="not in the control plane"):
        worker_env.ensure_package(plane, str(session), "f" * 64)  # type: ignore[arg-type]
    assert sorted(p.name for p in unpacked.parent.iterdir()) == [package.digest]
