"""What every ``rtml`` command shares: the ``--session-dir`` flag, and ``CliError``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rtml.session import Session, default_session_dir


class CliError(Exception):
    """A user mistake or an unmet precondition; the message names the fix."""


def add_session_dir(parser: argparse.ArgumentParser) -> None:
    """Give a command the ``--session-dir`` flag that :func:`session_of` reads."""
    parser.add_argument("--session-dir", default=None,
                        help="session directory (default: $RTML_SESSION_DIR or "
                             "/tmp/rtml-<uid>/session_latest)")


def session_of(args: argparse.Namespace) -> Session:
    """The session a command acts on: ``--session-dir``, else the default one; checked
    (RtmlSystemError) before the command trusts what it finds there."""
    return Session(Path(args.session_dir or default_session_dir()).absolute()).check()


def session_flag(session: Session) -> str:
    """The ``--session-dir`` flag to repeat in a printed command ('' for the default)."""
    if session.root == Path(default_session_dir()):
        return ""
    return f" --session-dir {session.root}"
