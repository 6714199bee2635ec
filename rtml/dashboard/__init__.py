"""The web dashboard: a daemon of the head node (``python -m rtml.dashboard.main``) that
serves one page and a JSON API of the cluster's state, read from the control plane
through ``rtml.state.StateReader``, to the holders of the cluster token.

``app`` has the routes, ``auth`` who may use them, ``logs`` the session's log files.
"""

from __future__ import annotations

from rtml.dashboard import app, auth, logs

__all__ = ["app", "auth", "logs"]
