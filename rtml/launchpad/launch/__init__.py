"""How a program runs: ``launch(program, launch_type)`` picks the launcher."""

from __future__ import annotations

import enum
from typing import Any

from rtml.launchpad.controller import CONNECT_TIMEOUT
from rtml.launchpad.launch.program_handle import DEFAULT_GRACE_PERIOD, LaunchOptions, ProgramHandle
from rtml.launchpad.program import Program


class LaunchType(enum.Enum):
    LOCAL_MULTI_THREADING = "local_mt"
    LOCAL_MULTI_PROCESSING = "local_mp"
    TEST_MULTI_THREADING = "test_mt"
    RTML = "rtml"


def launch(program: Program, launch_type: LaunchType | str = LaunchType.LOCAL_MULTI_THREADING,
           *, max_restarts: dict[str, int] | None = None,
           resources: dict[str, dict[str, Any]] | None = None,
           grace_period: float = DEFAULT_GRACE_PERIOD,
           connect_timeout: float = CONNECT_TIMEOUT) -> ProgramHandle:
    """Start every node of ``program``; returns a handle with ``wait()`` and ``stop()``.

    ``max_restarts``: per group label, how often a crashed node is restarted (-1:
    always) instead of stopping the program. ``resources`` (``rtml`` only): per
    group label, actor options such as ``{"num_gpus": 1}`` or ``{"resources": {...}}``.
    ``grace_period``: seconds between a stop and killing the nodes still running.
    ``connect_timeout``: seconds a call to a node that is not up yet waits for it.
    Raises ValueError for an unknown launch type or group label.
    """
    kind = _launch_type(launch_type)
    for option, given in (("max_restarts", max_restarts), ("resources", resources)):
        unknown = set(given or {}) - set(program.groups)
        if unknown:
            raise ValueError(f"{option} names group(s) {sorted(unknown)} that program "
                             f"{program.name!r} does not have; its groups are "
                             f"{sorted(program.groups)}")
    if resources and kind is not LaunchType.RTML:
        raise ValueError(f"resources=... place nodes on an rtml cluster; launch_type "
                         f"{kind.value!r} runs every node on this machine")
    options = LaunchOptions(dict(max_restarts or {}), dict(resources or {}), grace_period,
                            connect_timeout)
    handle: ProgramHandle
    if kind in (LaunchType.LOCAL_MULTI_THREADING, LaunchType.TEST_MULTI_THREADING):
        from rtml.launchpad.launch.threads import ThreadsHandle
        handle = ThreadsHandle(program, kind.value, options)
    elif kind is LaunchType.LOCAL_MULTI_PROCESSING:
        from rtml.launchpad.launch.processes import ProcessesHandle
        handle = ProcessesHandle(program, kind.value, options)
    else:
        from rtml.launchpad.launch.actors import ActorsHandle
        handle = ActorsHandle(program, kind.value, options)
    return handle.start()


def _launch_type(value: LaunchType | str) -> LaunchType:
    if isinstance(value, LaunchType):
        return value
    try:
        return LaunchType(value)
    except ValueError:
        raise ValueError(f"unknown launch_type {value!r}; use one of "
                         f"{[t.value for t in LaunchType]}") from None
