"""The head service process: the cluster's node table, jobs, actor directory and the
global scheduling shell.

``main`` is the process's entry (``python -m rtml.head.main``); ``service`` is its I/O
shell; ``actors`` is the actor directory, a pure state machine.
"""

__all__ = ["actors", "main", "service"]
