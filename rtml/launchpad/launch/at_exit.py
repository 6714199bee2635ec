"""Programs launched for real outlive the launching script's main: the interpreter waits.

    lp.launch(...)  (local_mt, local_mp, rtml; not a test launch) --> wait_at_exit(handle)
    main returns, or app.run(main) exits
      --> threading's exit hooks (before concurrent.futures stops taking work, which the
          nodes' courier servers need, and before rtml.shutdown's atexit handler)
      --> each program still running: handle.wait(); a node's error is printed
    Ctrl-C while waiting --> every program is stopped and given its grace period

So a Launchpad script that calls ``lp.launch(program)`` and returns does its work,
as under Launchpad, whose local launchers wait at exit too.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before ours
import sys
import threading
import traceback

from rtml.launchpad.launch.program_handle import ProgramHandle

_handles: list[ProgramHandle] = []  # the programs to wait for at exit
_lock = threading.Lock()
_registered = False


def wait_at_exit(handle: ProgramHandle) -> None:
    """Have the interpreter wait for ``handle``'s program before it exits."""
    global _registered
    with _lock:
        _handles[:] = [h for h in _handles if not h.done.is_set()]  # a long-lived launcher
        _handles.append(handle)
        if _registered:
            return
        _registered = True
    # threading runs its exit hooks (CPython's private API, which concurrent.futures uses
    # too) last registered first: ours, then concurrent.futures'.
    register = getattr(threading, "_register_atexit", atexit.register)
    register(_wait_for_all)


def _wait_for_all() -> None:
    with _lock:
        handles = [h for h in _handles if not h.done.is_set()]
        _handles.clear()
    try:
        for handle in handles:
            _wait(handle)
    except KeyboardInterrupt:
        _stop_all(handles)


def _wait(handle: ProgramHandle) -> None:
    """Wait for one program; print its error (the script's main has returned)."""
    try:
        handle.wait()
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # a node failed (even with SystemExit): the program is over
        text = "".join(traceback.format_exception(error))
        sys.stderr.write(f"rtml.launchpad: program {handle.program.name!r} failed:\n{text}")


def _stop_all(handles: list[ProgramHandle]) -> None:
    """Ctrl-C at exit: stop every program, give it its grace period, then exit."""
    sys.stderr.write("rtml.launchpad: interrupted; stopping the launched programs\n")
    for handle in handles:
        handle.stop()
    for handle in handles:
        handle.done.wait(min(handle.grace_period, 60.0) + 5.0)
