"""absl logging in a node's own process, set up as absl's app.run sets it up in Launchpad's.

    launcher: launcher_flags() -> ["--verbosity=1", ...]   (None without absl)
                 | in the node's payload
                 v
    node process (local_mp entry, rtml actor): init(argv, ...)
        FLAGS(argv) -> absl's verbosity (INFO unless the launcher's command line set it)
        the absl handler -> stderr: absl.logging.info(...) in the node is seen

A ``local_mp`` node process is the node's own: its root logger gets absl's handler,
as under Launchpad. An ``rtml`` actor's worker keeps rtml's logging (its log file),
so only absl's own logger gets the handler there; the worker's stderr reaches the
driver as every print of a task does.
"""

from __future__ import annotations

import sys
from typing import Any

LOGGING_FLAGS = ("verbosity", "logger_levels", "stderrthreshold", "logtostderr",
                 "alsologtostderr", "showprefixforinfo")
"""absl's logging flags a node takes over from its launcher's command line."""


def launcher_flags() -> list[str] | None:
    """The launcher's absl logging flags that its command line set, for its nodes; None
    without absl."""
    try:
        from absl import flags
        from absl import logging as absl_logging  # noqa: F401 - defines the logging flags
    except ImportError:
        return None
    if not flags.FLAGS.is_parsed():
        return []
    return [flags.FLAGS[name].serialize() for name in LOGGING_FLAGS
            if name in flags.FLAGS and flags.FLAGS[name].present]


def init(argv: list[str] | None, program_name: str, root: bool) -> None:
    """Set up absl logging in this node process (nothing if ``argv`` is None: the launcher
    has no absl). ``root``: the process is the node's own (absl's handler on the root
    logger) rather than an rtml worker's."""
    if argv is None:
        return
    try:
        from absl import flags
        from absl import logging as absl_logging
    except ImportError:
        return  # the launcher has absl, this interpreter not: the node logs as before
    if not flags.FLAGS.is_parsed():
        flags.FLAGS([program_name, *argv], known_only=True)
    if flags.FLAGS["verbosity"].using_default_value:
        absl_logging.set_verbosity(absl_logging.INFO)  # as app.run does when -v is not given
    if root:
        absl_logging.use_absl_handler()
    else:
        _absl_logger_only(absl_logging)


def _absl_logger_only(absl_logging: Any) -> None:
    """absl's handler on absl's logger alone, writing to the current stderr (absl keeps
    that logger's level at the verbosity while its handler is off the root logger)."""
    handler = absl_logging.get_absl_handler()
    handler.python_handler.stream = sys.stderr
    logger = absl_logging.get_absl_logger()
    if handler not in logger.handlers:
        logger.addHandler(handler)
    logger.propagate = False  # the worker's log file gets the lines through its stderr
