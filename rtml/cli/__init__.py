"""The ``rtml`` command: ``main`` (its entry), ``start`` (start and stop daemons),
``state`` (status, list, timeline), ``job`` (``rtml job``: submit and follow jobs)."""

__all__ = ["main"]
