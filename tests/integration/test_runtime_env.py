"""Runtime environments on real clusters: env_vars, working_dir (excludes, zips, cached
uploads, a second node), py_modules, pip, job-level envs merged with a call's, and bad
envs' errors; nothing of an env is seen by a plain task that runs after it."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import rtml
from rtml.core import runtime_env as envs
from rtml.exceptions import ActorDiedError, RuntimeEnvSetupError

PIP_PACKAGE = "inflection==0.5.1"
"""A tiny pure-Python wheel (10 kB, no dependencies) that nothing here has installed."""


@rtml.remote
def env_of(*names: str) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


@rtml.remote
def where() -> dict[str, Any]:
    """What a task sees of the process it runs in."""
    return {"cwd": os.getcwd(), "pid": os.getpid(), "prefix": sys.prefix,
            "node": rtml.get_runtime_context().get_node_id(),
            "finds": {name: importlib.util.find_spec(name) is not None
                      for name in ("rtenv_wd_mod", "rtenv_pkg", "rtenv_single", "inflection")}}


@rtml.remote
def use_working_dir() -> dict[str, Any]:
    import rtenv_wd_mod
    return {"value": rtenv_wd_mod.VALUE, "data": Path("data/input.txt").read_text(),
            "cwd": os.getcwd(), "files": sorted(str(p) for p in Path(".").rglob("*")
                                                if "__pycache__" not in p.parts)}


@rtml.remote
def use_py_modules() -> tuple[str, str, str]:
    import rtenv_pkg
    import rtenv_single
    import rtenv_zipped
    return rtenv_pkg.NAME, rtenv_single.NAME, rtenv_zipped.NAME


@rtml.remote
def use_pip() -> tuple[str, str]:
    import inflection
    return inflection.camelize("runtime_env"), sys.prefix


@rtml.remote
def nested_env(*names: str) -> dict[str, str | None]:
    return rtml.get(env_of.remote(*names))


@rtml.remote
class EnvActor:
    def __init__(self) -> None:
        self.pid = os.getpid()

    def env(self, *names: str) -> tuple[int, dict[str, str | None]]:
        return self.pid, {name: os.environ.get(name) for name in names}

    def cwd(self) -> str:
        return os.getcwd()


def make_working_dir(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "rtenv_wd_mod.py").write_text("VALUE = 'from the working dir'\n")
    (root / "data" / "input.txt").write_text("read by a relative path\n")
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / "logs" / "run.log").write_text("left out\n")
    return root


# -- env_vars -----------------------------------------------------------------------------

def test_env_vars_are_seen_by_their_task_and_actor_and_by_no_later_plain_task(
        cluster: None) -> None:
    os.environ.pop("RTENV_A", None)
    task_env = {"env_vars": {"RTENV_A": "task", "RTENV_PATHS": "${HOME}/x"}}
    assert rtml.get(env_of.options(runtime_env=task_env).remote("RTENV_A", "RTENV_PATHS")) == {
        "RTENV_A": "task", "RTENV_PATHS": f"{os.environ['HOME']}/x"}
    other = {"env_vars": {"RTENV_B": "other"}}
    assert rtml.get(env_of.options(runtime_env=other).remote("RTENV_A", "RTENV_B")) == {
        "RTENV_A": None, "RTENV_B": "other"}
    actor = EnvActor.options(runtime_env={"env_vars": {"RTENV_A": "actor"}}).remote()
    first = rtml.get(actor.env.remote("RTENV_A"))
    assert first[1] == {"RTENV_A": "actor"}
    assert rtml.get(actor.env.remote("RTENV_A")) == first  # for its life, same process
    plain = [env_of.remote("RTENV_A", "RTENV_B", "RTENV_PATHS") for _ in range(4)]
    assert rtml.get(plain) == [{"RTENV_A": None, "RTENV_B": None, "RTENV_PATHS": None}] * 4
    env_pids = {rtml.get(where.options(runtime_env=task_env).remote())["pid"]}
    plain_pids = {p["pid"] for p in rtml.get([where.remote() for _ in range(4)])}
    assert env_pids.isdisjoint(plain_pids | {first[0]})  # each env: workers of its own


# -- working_dir and py_modules ---------------------------------------------------------------

def test_working_dir_imports_reads_relative_files_and_leaves_out_excludes(
        cluster: None, tmp_path: Path) -> None:
    root = make_working_dir(tmp_path / "project")
    env = {"working_dir": str(root), "excludes": ["*.bin", "logs/"]}
    seen = rtml.get(use_working_dir.options(runtime_env=env).remote())
    assert seen["value"] == "from the working dir"
    assert seen["data"] == "read by a relative path\n"
    assert seen["files"] == ["data", "data/input.txt", "rtenv_wd_mod.py"]
    digest = Path(seen["cwd"]).name
    assert Path(seen["cwd"]).parent.parts[-2:] == ("runtime_resources", "packages")
    assert len(digest) == 64 and Path(seen["cwd"]) != root
    later = rtml.get([where.remote() for _ in range(4)])
    for plain in later:
        assert plain["cwd"] != seen["cwd"] and not plain["finds"]["rtenv_wd_mod"]
    unexcluded = rtml.get(use_working_dir.options(runtime_env={"working_dir": str(root)})
                          .remote())
    assert "logs/run.log" in unexcluded["files"] and "data/big.bin" in unexcluded["files"]
    assert Path(unexcluded["cwd"]).name != digest  # other files, another package


def test_py_modules_and_a_zipped_working_dir_are_importable(cluster: None,
                                                              tmp_path: Path) -> None:
    package = tmp_path / "mods" / "rtenv_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("NAME = 'package'\n")
    single = tmp_path / "mods" / "rtenv_single.py"
    single.write_text("NAME = 'single file'\n")
    zipped = tmp_path / "zipped.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("rtenv_zipped/__init__.py", "NAME = 'zipped'\n")
    sys.path.insert(0, str(tmp_path / "mods"))
    try:
        import rtenv_pkg  # a module object, as Ray takes too
    finally:
        sys.path.remove(str(tmp_path / "mods"))
        sys.modules.pop("rtenv_pkg", None)
    env = {"py_modules": [rtenv_pkg, str(single), str(zipped)]}
    assert rtml.get(use_py_modules.options(runtime_env=env).remote()) == (
        "package", "single file", "zipped")
    project = tmp_path / "project.zip"  # a working_dir zip with one top-level directory
    with zipfile.ZipFile(project, "w") as archive:
        archive.writestr("project/rtenv_wd_mod.py", "VALUE = 'zipped dir'\n")
        archive.writestr("project/data/input.txt", "in the zip\n")
    seen = rtml.get(use_working_dir.options(runtime_env={"working_dir": str(project)})
                    .remote())
    assert (seen["value"], seen["data"], Path(seen["cwd"]).name) == (
        "zipped dir", "in the zip\n", "project")
    assert not any(p["finds"]["rtenv_pkg"] or p["finds"]["rtenv_single"]
                   for p in rtml.get([where.remote() for _ in range(4)]))


# -- job-level envs ---------------------------------------------------------------------------

def test_job_env_applies_to_every_task_and_actor_and_merges_with_theirs(
        start_cluster: Any, tmp_path: Path) -> None:
    root = make_working_dir(tmp_path / "job")
    start_cluster(num_cpus=2, runtime_env={"working_dir": str(root),
                                           "env_vars": {"RTENV_A": "job", "RTENV_B": "job"}})
    assert rtml.get(env_of.remote("RTENV_A", "RTENV_B")) == {"RTENV_A": "job",
                                                             "RTENV_B": "job"}
    assert rtml.get(use_working_dir.remote())["value"] == "from the working dir"
    merged = env_of.options(runtime_env={"env_vars": {"RTENV_B": "task", "RTENV_C": "task"}})
    assert rtml.get(merged.remote("RTENV_A", "RTENV_B", "RTENV_C")) == {
        "RTENV_A": "job", "RTENV_B": "task", "RTENV_C": "task"}
    replaced = tmp_path / "other"
    replaced.mkdir()
    (replaced / "rtenv_wd_mod.py").write_text("VALUE = 'the task wins'\n")
    (replaced / "data").mkdir()
    (replaced / "data" / "input.txt").write_text("its own\n")
    seen = rtml.get(use_working_dir.options(runtime_env={"working_dir": str(replaced)})
                    .remote())
    assert (seen["value"], seen["data"]) == ("the task wins", "its own\n")
    actor = EnvActor.options(runtime_env={"env_vars": {"RTENV_A": "actor"}}).remote()
    assert rtml.get(actor.env.remote("RTENV_A", "RTENV_B"))[1] == {"RTENV_A": "actor",
                                                                   "RTENV_B": "job"}
    assert Path(rtml.get(actor.cwd.remote())).parent.name == "packages"
    # A nested task inherits its parent's env (the job's, merged with the task's).
    inner = nested_env.options(runtime_env={"env_vars": {"RTENV_C": "parent"}})
    assert rtml.get(inner.remote("RTENV_A", "RTENV_C")) == {"RTENV_A": "job",
                                                            "RTENV_C": "parent"}


# -- bad envs ---------------------------------------------------------------------------------

def test_bad_envs_fail_with_the_problem_and_the_fix(cluster: None, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"unknown runtime_env key\(s\) \['working_dri'\]"):
        env_of.options(runtime_env={"working_dri": "."})
    with pytest.raises(ValueError, match=r"\['conda'\] are not supported by rtml"):
        rtml.remote(runtime_env={"conda": "env"})(lambda: 1)
    with pytest.raises(TypeError, match=r"\['env_vars'\]\['N'\] must be a str, got 1 .*str\(1\)"):
        EnvActor.options(runtime_env={"env_vars": {"N": 1}})
    with pytest.raises(TypeError, match="runtime_env must be a dict"):
        env_of.options(runtime_env=["env_vars"])
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match=f"{missing}' does not exist.*existing directory"):
        env_of.options(runtime_env={"working_dir": missing}).remote()
    with pytest.raises(ValueError, match="does not exist"):
        EnvActor.options(runtime_env={"py_modules": [missing]}).remote()
    with pytest.raises(ValueError, match="rtml uploads local directories"):
        env_of.options(runtime_env={"working_dir": "s3://bucket/code.zip"})
    root = make_working_dir(tmp_path / "big")
    monkeypatch.setattr(envs, "PACKAGE_MAX_BYTES", 500)
    with pytest.raises(ValueError, match=r"holds [\d.]+ MiB, more than a package may .*excludes"):
        where.options(runtime_env={"working_dir": str(root)}).remote()
    small = where.options(runtime_env={"working_dir": str(root), "excludes": ["*.bin"]})
    assert Path(rtml.get(small.remote())["cwd"]).parent.name == "packages"
    rtml.shutdown()
    with pytest.raises(ValueError, match="does not exist"):
        rtml.init(num_cpus=1, runtime_env={"working_dir": missing})
    assert not rtml.is_initialized()  # nothing was started


# -- pip --------------------------------------------------------------------------------------

def test_pip_env_runs_in_its_own_virtualenv_and_a_failing_install_says_why(
        cluster: None) -> None:
    camel, prefix = rtml.get(use_pip.options(runtime_env={"pip": [PIP_PACKAGE]}).remote())
    assert camel == "RuntimeEnv"
    assert Path(prefix).parent.parts[-2:] == ("runtime_resources", "pip")
    plain = rtml.get([where.remote() for _ in range(3)])
    assert all(not p["finds"]["inflection"] and p["prefix"] != prefix for p in plain)
    bad = {"pip": ["rtml-no-such-package-exists==0.0.1"]}
    with pytest.raises(RuntimeEnvSetupError, match=r"(?s)pip install of "
                       r"\['rtml-no-such-package-exists==0.0.1'\] failed.*fix the requirement"):
        rtml.get(where.options(runtime_env=bad).remote())
    actor = EnvActor.options(runtime_env=bad).remote()
    with pytest.raises(ActorDiedError, match="rtml-no-such-package-exists"):
        rtml.get(actor.cwd.remote())


# -- several jobs, several nodes --------------------------------------------------------------

def test_a_working_dir_is_uploaded_once_and_reused_by_the_next_job(
        start_nodes: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_working_dir(tmp_path / "shared")
    cluster, _ = start_nodes(1)
    env = {"working_dir": str(root)}
    caplog.set_level(logging.INFO, logger="rtml.core.runtime_env")
    rtml.shutdown()
    cluster.connect(runtime_env=env)
    first = rtml.get(use_working_dir.remote())
    assert [r.message for r in caplog.records if "uploaded package" in r.message]
    caplog.clear()
    rtml.shutdown()
    cluster.connect(runtime_env=env)  # a second job of the same cluster
    second = rtml.get(use_working_dir.remote())
    messages = [r.message for r in caplog.records]
    assert any("is stored already" in m for m in messages)
    assert not any("uploaded package" in m for m in messages)
    assert second["cwd"] == first["cwd"] and second["value"] == "from the working dir"


def test_a_task_on_the_second_node_gets_the_working_dir_there(start_nodes: Any,
                                                              tmp_path: Path) -> None:
    root = make_working_dir(tmp_path / "spread")
    cluster, (second,) = start_nodes(1, 1)
    there = rtml.NodeAffinitySchedulingStrategy(second.node_id, soft=False)
    env = {"working_dir": str(root), "excludes": ["logs/"]}
    seen = rtml.get(use_working_dir.options(runtime_env=env, scheduling_strategy=there)
                    .remote())
    node = rtml.get(where.options(runtime_env=env, scheduling_strategy=there).remote())
    assert node["node"] == second.node_id
    assert seen["value"] == "from the working dir"
    assert seen["data"] == "read by a relative path\n"
    assert Path(seen["cwd"]).is_relative_to(Path(second.session_dir) / "runtime_resources")
    assert "logs/run.log" not in seen["files"]
