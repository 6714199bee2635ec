"""The ``rtml`` command: ``main`` (its entry), ``start`` (start and stop daemons),
``state`` (status, list, timeline)."""

__all__ = ["main"]
