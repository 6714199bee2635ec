"""The node manager process: one per node, it owns the node's worker pool, local
leases, object store and the links to the other nodes.

``main`` is the process's entry (``python -m rtml.node.main``); ``manager`` is its I/O
shell, driving the pure cores of ``rtml.scheduler`` (leases) and ``rtml.objectstore``
(the store); ``objects`` is the object manager shell, ``workers`` starts and watches
worker processes, ``links`` connects to other node managers.
"""

__all__ = ["links", "main", "manager", "objects", "workers"]
