"""The client runtime: what a driver (and a worker, for the calls its tasks make) uses to
submit tasks, call actors, and own, borrow and read objects.

Its face: ``runtime`` (``ClientRuntime``, ``ClientConfig``), ``current`` (the process's
runtime), ``object_ref``, ``remote_function``, ``actors`` (classes, handles), ``dag``
(lazy graphs of their calls), ``options``, ``runtime_env`` (runtime environments:
checked, packaged, uploaded), ``context`` (the running task), ``serialization`` and
``memory_store`` (the owner's values), ``kept_calls`` (what the task table keeps of a
call, for replay). ``links``, ``shared_objects``, ``tasks``,
``submitter``, ``owner``, ``references``, ``actor_caller``, ``calls`` and ``arguments``
are the runtime's private parts.
"""

__all__ = [
    "actors", "context", "current", "dag", "generators", "job_config", "kept_calls", "memory_store", "object_ref", "options",
    "placement_groups", "progress", "remote_function", "runtime", "runtime_context",
    "runtime_env", "serialization",
]
