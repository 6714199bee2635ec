"""The cluster's log files: served by each node manager (``files``), found and read from
anywhere (``reader``: the ``rtml logs`` command, and a dashboard)."""

from rtml.logs.files import MAX_CHUNK, bad_name, list_files, read
from rtml.logs.reader import DAEMON_FILES, LogReader, LogSource

__all__ = ["DAEMON_FILES", "MAX_CHUNK", "LogReader", "LogSource", "bad_name", "list_files",
           "read"]
