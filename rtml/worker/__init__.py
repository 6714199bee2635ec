"""The worker processes: the zygote (a template that imports the worker code once and
forks workers) and the worker itself, which runs tasks and actor methods.

``zygote`` is the template's entry (``python -m rtml.worker.zygote``); ``main`` is each
forked worker's; ``executor`` runs calls; ``output`` forwards prints to the driver. A
worker is also a client: it submits nested tasks through ``rtml.core``'s runtime.
"""

__all__ = ["executor", "main", "output", "zygote"]
