"""rtml: a Ray-style distributed execution engine for real-time machine learning.

The public names load on first use (PEP 562), so the cluster's own processes
(head, node manager, worker template), which run ``python -m rtml.<module>``,
do not import the driver API they never call: each starts ~0.1 s sooner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rtml import _native

BUILD = _native.choose()
"""How the hot path runs here: "compiled" (C, by mypyc), "source" (a compiled build's
``.py`` files: ``RTML_PURE_PYTHON=1``, or edited since the build) or "pure" (no compiled
build: no C compiler at install). See :mod:`rtml._native`."""

if TYPE_CHECKING:
    from rtml import exceptions
    from rtml.api import (
        available_resources,
        cancel,
        cluster_resources,
        get,
        get_actor,
        get_gpu_ids,
        get_runtime_context,
        kill,
        nodes,
        put,
        remote,
        timeline,
        wait,
    )
    from rtml.core.actors import ActorHandle, method
    from rtml.core.generators import ObjectRefGenerator
    from rtml.core.object_ref import ObjectRef
    from rtml.core.options import NodeAffinitySchedulingStrategy
    from rtml.driver import init, is_initialized, shutdown

__version__ = "0.1.0"

_HOME = {
    **dict.fromkeys(["available_resources", "cancel", "cluster_resources", "get", "get_actor",
                     "get_gpu_ids", "get_runtime_context", "kill", "nodes", "put", "remote",
                     "timeline", "wait"], "rtml.api"),
    **dict.fromkeys(["init", "is_initialized", "shutdown"], "rtml.driver"),
    "ActorHandle": "rtml.core.actors", "method": "rtml.core.actors",
    "ObjectRef": "rtml.core.object_ref", "ObjectRefGenerator": "rtml.core.generators",
    "NodeAffinitySchedulingStrategy": "rtml.core.options",
}

_MODULES = {"actor", "dag", "debug", "exceptions", "experimental", "job_config", "util"}
"""Submodules reachable as attributes without their own import (``rtml.util.ActorPool``
after ``import rtml``, as in Ray)."""

__all__ = [
    "ActorHandle", "NodeAffinitySchedulingStrategy", "ObjectRef", "ObjectRefGenerator",
    "available_resources",
    "cancel", "cluster_resources", "exceptions", "get", "get_actor", "get_gpu_ids",
    "get_runtime_context", "init", "is_initialized", "kill", "method", "nodes", "put",
    "remote", "shutdown", "timeline", "wait",
]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"rtml.{name}")
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'rtml' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
