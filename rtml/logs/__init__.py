"""The cluster's log files: served by each node manager (``files``), found and read from
anywhere (``reader``: the ``rtml logs`` command, and the dashboard)."""

from rtml.logs.files import MAX_CHUNK, bad_name, list_files, read
from rtml.logs.reader import DAEMON_FILES, FOLLOW_INTERVAL, LogReader, LogSource

__all__ = ["DAEMON_FILES", "FOLLOW_INTERVAL", "MAX_CHUNK", "LogReader", "LogSource",
           "bad_name", "list_files", "read"]
