"""Scheduling policy, pure (no process, socket or Redis): ``local`` (a node's leases,
worker pool and resources), ``placement`` (the global scheduler: where a spilled lease
or an actor goes) and ``resources`` (shapes and their arithmetic)."""

__all__ = ["local", "placement", "resources"]
