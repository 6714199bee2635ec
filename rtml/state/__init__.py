"""The cluster's state as its readers see it: Ray's state records (``common``), how
control-plane records become them (``records``), summaries (``summary``), and :class:`StateReader`, which reads them from a ControlPlane for the
state API (``rtml.util.state``), the command line and the dashboard alike.

Only reads; the writes are the daemons' and owners' (``rtml.control_plane``).
"""

from __future__ import annotations

from rtml.state import common, records, summary
from rtml.state.reader import KINDS, SUMMARIES, StateReader, replay_command

__all__ = ["KINDS", "SUMMARIES", "StateReader", "common", "records", "replay_command",
           "summary"]
