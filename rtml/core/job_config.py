"""Ray's ``ray.job_config.JobConfig``: options of a whole job, given to ``init``.

    rtml.init(job_config=JobConfig(default_actor_lifetime="detached",
                                   code_search_path=["/src/lib"],
                                   runtime_env={...}, metadata={...},
                                   ray_namespace="team"))

``default_actor_lifetime``: the lifetime of the job's actors created without one (its
tasks' actors too: a worker asks the head for its job's, once); ``code_search_path``:
directories put on the import path of the job's workers; ``runtime_env``: the job's
runtime environment; ``ray_namespace``: its namespace; ``metadata``: recorded with the
job. ``jvm_options`` are for Java workers, which rtml has none of.
"""

from __future__ import annotations

from typing import Any

LIFETIMES = ("non_detached", "detached")


class JobConfig:
    def __init__(self, jvm_options: list[str] | None = None,
                 code_search_path: list[str] | None = None,
                 runtime_env: dict[str, Any] | None = None, client_job: bool = False,
                 metadata: dict[str, str] | None = None, ray_namespace: str | None = None,
                 default_actor_lifetime: str = "non_detached",
                 _py_driver_sys_path: list[str] | None = None) -> None:
        if jvm_options:
            raise ValueError("JobConfig(jvm_options=...) is for Java workers; rtml runs "
                             "Python only: leave it out")
        self.code_search_path = _paths("code_search_path", code_search_path)
        self.runtime_env = runtime_env
        self.client_job = client_job
        self.metadata: dict[str, str] = dict(metadata or {})
        self.ray_namespace = ray_namespace
        self.default_actor_lifetime = "non_detached"
        self.set_default_actor_lifetime(default_actor_lifetime)
        self.py_driver_sys_path = _paths("_py_driver_sys_path", _py_driver_sys_path)

    def set_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def set_ray_namespace(self, ray_namespace: str) -> None:
        self.ray_namespace = ray_namespace

    def set_runtime_env(self, runtime_env: dict[str, Any] | None) -> None:
        self.runtime_env = runtime_env

    def set_py_driver_sys_path(self, py_driver_sys_path: list[str]) -> None:
        self.py_driver_sys_path = _paths("py_driver_sys_path", py_driver_sys_path)

    def set_default_actor_lifetime(self, default_actor_lifetime: str) -> None:
        if default_actor_lifetime not in LIFETIMES:
            raise ValueError(f"default_actor_lifetime must be one of {list(LIFETIMES)}, got "
                             f"{default_actor_lifetime!r}")
        self.default_actor_lifetime = default_actor_lifetime

    def __repr__(self) -> str:
        return (f"JobConfig(default_actor_lifetime={self.default_actor_lifetime!r}, "
                f"ray_namespace={self.ray_namespace!r})")


def _paths(what: str, paths: Any) -> list[str]:
    if paths is None:
        return []
    if isinstance(paths, str) or not all(isinstance(p, str) for p in paths):
        raise TypeError(f"JobConfig {what} must be a list of directory paths, got {paths!r}")
    return list(paths)
