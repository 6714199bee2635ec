"""The head service process: the cluster's node table, jobs, actor directory and the
global scheduling shell.

``main`` is the process's entry (``python -m rtml.head.main``); ``service`` is its I/O
shell; ``actors`` is the actor directory, a pure state machine; ``jobs`` the submitted
jobs' table (pure) and ``job_runner`` its shell, which runs their entrypoints.
"""

__all__ = ["actors", "job_runner", "jobs", "main", "service"]
