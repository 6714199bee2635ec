"""A worker's stdout and stderr: kept in its log file and echoed to the job's drivers.

    print() in a task --> OutputTee --write--> the worker's log file (as before)
                                  --complete lines--> WorkerOutput --> node manager --> drivers

Like Ray's log_to_driver: the driver prints each line as ``(pid=N) line``.
"""

from __future__ import annotations

import os
import threading
from typing import IO, Any

from rtml.rpc import messages as m


class OutputTee:
    """A text stream that writes through and forwards complete lines."""

    def __init__(self, stream: IO[str], send: Any, job_of_current_task: Any) -> None:
        self._stream = stream
        self._send = send
        self._job = job_of_current_task
        self._partial = ""
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def write(self, text: str) -> int:
        self._stream.write(text)
        with self._lock:
            text = self._partial + text
            cut = text.rfind("\n") + 1
            self._partial = text[cut:]
            lines = text[:cut]
        if lines:
            self._send(m.WorkerOutput(self._pid, self._job(), lines))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
