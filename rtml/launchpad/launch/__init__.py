"""How a program runs: ``launch(program, launch_type)`` picks the launcher.

    launch(program, launch_type=None, test_case=None, ...)
      launch type: the argument, else --lp_launch_type (absl), else local_mt;
                   with test_case, local_mt/local_mp become test_mt/test_mp
      options: grace period (argument > --lp_termination_notice_secs > default),
               serialize_py_nodes (thread launches only), restarts (none in tests)
      --> ThreadsHandle | ProcessesHandle | ActorsHandle .start()
      --> test_case given: its cleanup stops the program and re-raises a node's error
          a test launch:   nothing more (the test ends it)
          otherwise:       the interpreter waits for the program at exit (at_exit)
"""

from __future__ import annotations

import enum
from typing import Any

from rtml.launchpad import flags
from rtml.launchpad.controller import CONNECT_TIMEOUT
from rtml.launchpad.launch import at_exit
from rtml.launchpad.launch.program_handle import (
    DEFAULT_GRACE_PERIOD,
    TEST_GRACE_PERIOD,
    LaunchOptions,
    ProgramHandle,
)
from rtml.launchpad.program import Program


class LaunchType(enum.Enum):
    LOCAL_MULTI_THREADING = "local_mt"
    LOCAL_MULTI_PROCESSING = "local_mp"
    TEST_MULTI_THREADING = "test_mt"
    TEST_MULTI_PROCESSING = "test_mp"
    RTML = "rtml"


THREADS = (LaunchType.LOCAL_MULTI_THREADING, LaunchType.TEST_MULTI_THREADING)
TESTS = (LaunchType.TEST_MULTI_THREADING, LaunchType.TEST_MULTI_PROCESSING)
_AS_TEST = {LaunchType.LOCAL_MULTI_THREADING: LaunchType.TEST_MULTI_THREADING,
            LaunchType.LOCAL_MULTI_PROCESSING: LaunchType.TEST_MULTI_PROCESSING}


def launch(program: Program, launch_type: LaunchType | str | None = None, *,
           test_case: Any = None, serialize_py_nodes: bool | None = None,
           max_restarts: dict[str, int] | None = None,
           resources: dict[str, dict[str, Any]] | None = None,
           grace_period: float | None = None,
           connect_timeout: float = CONNECT_TIMEOUT,
           terminal: str | None = None) -> ProgramHandle:
    """Start every node of ``program``; returns a handle with ``wait()`` and ``stop()``.

    ``launch_type``: None reads ``--lp_launch_type`` (``local_mt`` without absl).
    ``test_case``: a ``unittest.TestCase`` (or pytest's ``request``) the program is
    launched for: test semantics, and the test's cleanup stops the program, waits for it
    and re-raises a node's error. ``serialize_py_nodes``: whether a thread launch runs
    copies of the nodes (default: yes for local_mt, no for test_mt); process and rtml
    launches always send copies.
    ``max_restarts``: per group label, how often a crashed node is restarted (-1:
    always) instead of stopping the program (not in tests). ``resources`` (``rtml``
    only): per group label, actor options such as ``{"num_gpus": 1}``.
    ``grace_period``: seconds between a stop and killing the nodes still running
    (default: ``--lp_termination_notice_secs`` if given, else 5, or 2 in tests).
    ``connect_timeout``: seconds a call to a node that is not up yet waits for it.
    ``terminal``: accepted for Launchpad's sake (local_mp shows every node's output in the
    current terminal).
    Raises ValueError for an unknown launch type or group label, TypeError for a
    ``test_case`` that takes no cleanups.
    """
    del terminal
    kind = _launch_type(launch_type, test_case is not None)
    _check_groups(program, kind, max_restarts, resources)
    for_test = kind in TESTS
    options = LaunchOptions(
        {} if for_test else dict(max_restarts or {}), dict(resources or {}),
        _grace_period(grace_period, for_test), connect_timeout,
        serialize=_serialize(serialize_py_nodes, kind), for_test=for_test)
    handle = _handle(program, kind, options).start()
    if test_case is not None:
        _end_with_test(test_case, handle)
    elif not for_test:
        at_exit.wait_at_exit(handle)
    return handle


def _launch_type(value: LaunchType | str | None, for_test_case: bool) -> LaunchType:
    """The launch type to use. Raises ValueError naming the valid ones."""
    kind = _parse(flags.launch_type() if value is None else value)
    return _AS_TEST.get(kind, kind) if for_test_case else kind


def _parse(value: LaunchType | str) -> LaunchType:
    if isinstance(value, LaunchType):
        return value
    try:
        return LaunchType(value)
    except ValueError:
        valid = [t.value for t in LaunchType]
        if value in flags.LAUNCHPAD_LAUNCH_TYPES:
            raise ValueError(f"launch_type {value!r} is one of Launchpad's that rtml does "
                             f"not run; use one of {valid} (rtml: nodes as actors on an "
                             f"rtml cluster)") from None
        raise ValueError(f"unknown launch_type {value!r}; use one of {valid}") from None


def _check_groups(program: Program, kind: LaunchType, max_restarts: dict[str, int] | None,
                  resources: dict[str, dict[str, Any]] | None) -> None:
    """Raises ValueError for an option naming a group the program lacks, or resources
    outside an rtml launch."""
    for option, given in (("max_restarts", max_restarts), ("resources", resources)):
        unknown = set(given or {}) - set(program.groups)
        if unknown:
            raise ValueError(f"{option} names group(s) {sorted(unknown)} that program "
                             f"{program.name!r} does not have; its groups are "
                             f"{sorted(program.groups)}")
    if resources and kind is not LaunchType.RTML:
        raise ValueError(f"resources=... place nodes on an rtml cluster; launch_type "
                         f"{kind.value!r} runs every node on this machine")


def _grace_period(given: float | None, for_test: bool) -> float:
    if given is not None:
        return given
    from_flags = flags.grace_period()
    if from_flags is not None:
        return from_flags
    return TEST_GRACE_PERIOD if for_test else DEFAULT_GRACE_PERIOD


def _serialize(given: bool | None, kind: LaunchType) -> bool:
    """Whether nodes run as copies: always outside this process; as given, or by the
    launch type's default, in threads."""
    if kind not in THREADS:
        return True
    return given if given is not None else kind is LaunchType.LOCAL_MULTI_THREADING


def _handle(program: Program, kind: LaunchType, options: LaunchOptions) -> ProgramHandle:
    if kind in THREADS:
        from rtml.launchpad.launch.threads import ThreadsHandle
        return ThreadsHandle(program, kind.value, options)
    if kind is LaunchType.RTML:
        from rtml.launchpad.launch.actors import ActorsHandle
        return ActorsHandle(program, kind.value, options)
    from rtml.launchpad.launch.processes import ProcessesHandle
    return ProcessesHandle(program, kind.value, options)


def _end_with_test(test_case: Any, handle: ProgramHandle) -> None:
    """Register the end of the program as a cleanup of ``test_case``. Raises TypeError
    (after stopping the program) if it takes no cleanups."""
    add = getattr(test_case, "addCleanup", None) or getattr(test_case, "addfinalizer", None)
    if not callable(add):
        handle.stop()
        raise TypeError(f"test_case={test_case!r} takes no cleanups; pass the "
                        f"unittest.TestCase (self) or pytest's request fixture")
    add(handle.end_test)
