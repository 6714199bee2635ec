"""Launchpad's command-line flags, defined on absl's ``FLAGS`` when absl is installed.

    python prog.py --lp_launch_type=local_mp    absl's app.run(main) parses the flags;
           |                                    without app.run, launch() reads the lp_
           v                                    flags from sys.argv itself
    FLAGS.lp_launch_type ------------------> lp.launch(program) given no launch_type
    --lp_termination_notice_secs=N --------> the grace period of a stop (when given)
    --lp_terminal, --lp_worker_manager_v2,
      --lp_worker_manager_registers_signals,
      --tmux_open_window, --tmux_session_name  accepted: rtml has nothing for them to change

Without absl nothing is defined and rtml imports as before: ``launch()`` with no
``launch_type`` runs ``local_mt``. The names, types and defaults are Launchpad's,
so a Launchpad program's command line parses unchanged.
"""

from __future__ import annotations

import math
import sys
from typing import Any

LAUNCHPAD_LAUNCH_TYPES = ("local_mt", "local_mp", "test_mp", "test_mt", "local_docker",
                          "vertex_ai")
"""The values of Launchpad's ``--lp_launch_type`` (rtml adds ``rtml``)."""

DEFAULT_LAUNCH_TYPE = "local_mt"


def _absl_flags() -> Any:
    """``absl.flags``, or None when absl is not installed."""
    try:
        from absl import flags
    except ImportError:
        return None
    return flags


def define() -> None:
    """Define Launchpad's flags on absl's FLAGS (once; nothing without absl)."""
    flags = _absl_flags()
    if flags is None or "lp_launch_type" in flags.FLAGS:
        return
    flags.DEFINE_enum("lp_launch_type", DEFAULT_LAUNCH_TYPE,
                      [*LAUNCHPAD_LAUNCH_TYPES, "rtml"],
                      "How to launch a Launchpad program when launch() is given no "
                      "launch_type (rtml: every node an actor on an rtml cluster).",
                      allow_override=True)
    flags.DEFINE_integer("lp_termination_notice_secs", 10,
                         "Seconds between a stop and killing the nodes still running (when "
                         "given; rtml's default is 5, or 2 for tests); 0: kill at once; "
                         "negative: never kill.", allow_override=True)
    _define_accepted(flags)


def _define_accepted(flags: Any) -> None:
    """Flags of Launchpad's that rtml accepts and has nothing to do with."""
    flags.DEFINE_string("lp_terminal", None, "Accepted for Launchpad's sake: rtml's local_mp "
                        "shows every node's output in the current terminal.",
                        allow_override=True)
    flags.DEFINE_bool("lp_worker_manager_v2", False, "Accepted for Launchpad's sake; no "
                      "effect in rtml.", allow_override=True)
    flags.DEFINE_bool("lp_worker_manager_registers_signals", True, "Accepted for "
                      "Launchpad's sake; no effect in rtml.", allow_override=True)
    flags.DEFINE_string("tmux_open_window", None, "Accepted for Launchpad's sake; no "
                        "effect in rtml.", allow_override=True)
    flags.DEFINE_string("tmux_session_name", "launchpad", "Accepted for Launchpad's sake; "
                        "no effect in rtml.", allow_override=True)


def launch_type() -> str:
    """The launch type the command line asks for (``local_mt`` without absl).

    Raises absl's IllegalFlagValueError for a value outside the flag's enum."""
    flag = _flag("lp_launch_type")
    return DEFAULT_LAUNCH_TYPE if flag is None else str(flag.value)


def grace_period() -> float | None:
    """The grace period ``--lp_termination_notice_secs`` asks for, None if it is not given
    (negative: never kill, ``math.inf``)."""
    flag = _flag("lp_termination_notice_secs")
    if flag is None or not flag.present:
        return None
    return math.inf if flag.value < 0 else float(flag.value)


def _flag(name: str) -> Any:
    """The flag ``name`` with its command-line value, or None without absl.

    Before absl has parsed the command line (no ``app.run``), only this flag's own
    ``--name=value`` or ``--name value`` is read from sys.argv: FLAGS stays unparsed, so a
    later ``app.run`` or ``FLAGS(argv)`` sees the command line whole."""
    flags = _absl_flags()
    if flags is None or name not in flags.FLAGS:
        return None
    flag = flags.FLAGS[name]
    if not flags.FLAGS.is_parsed():
        value = _value_in_argv(name, sys.argv[1:])
        if value is not None:
            flag.parse(value)
    return flag


def _value_in_argv(name: str, argv: list[str]) -> str | None:
    """The last value given to ``--name`` (or ``-name``) before a ``--``, if any."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        key, eq, given = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or key != name:
            continue
        if eq:
            value = given
        elif i + 1 < len(argv):
            value = argv[i + 1]
    return value
