"""The process's current runtime: the one ``rtml.init`` (or a worker's start) connected,
which the API's calls use."""

from __future__ import annotations

from collections.abc import Callable

from rtml.core.runtime import ClientRuntime

_runtime: ClientRuntime | None = None
_auto_init: Callable[[], object] | None = None


def set_runtime(runtime: ClientRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def get_runtime() -> ClientRuntime | None:
    return _runtime


def set_auto_init(start: Callable[[], object] | None) -> None:
    """What :func:`require_runtime` calls in a driver that has not called ``init``: it
    starts or joins a cluster (``rtml.api``'s, as Ray's auto-init)."""
    global _auto_init
    _auto_init = start


def require_runtime() -> ClientRuntime:
    """The connected runtime, started by the auto-init hook on first use if need be.
    Raises RuntimeError telling the user to call init() if there is none."""
    runtime = _runtime
    if runtime is None and _auto_init is not None:
        _auto_init()
        runtime = _runtime
    if runtime is None:
        raise RuntimeError("rtml is not initialized; call rtml.init() first")
    return runtime
