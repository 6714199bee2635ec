"""The web dashboard: a daemon of the head node (``python -m rtml.dashboard.main``) that
serves one page and a JSON API of the cluster's state, read from the control plane
through ``rtml.state.StateReader``, and of every node's logs, read through
``rtml.logs.LogReader``, to the holders of the cluster token.

``app`` has the routes, ``auth`` who may use them.
"""

from __future__ import annotations

from rtml.dashboard import app, auth

__all__ = ["app", "auth"]
