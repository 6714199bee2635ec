"""Scheduling policy, pure (no process, socket or Redis): ``local`` (a node's leases,
worker pool and resources), ``placement`` (the global scheduler: where a spilled lease
or an actor goes), ``resources`` (shapes and their arithmetic) and ``strategy`` (the
wire form of a scheduling strategy)."""

__all__ = ["bundles", "local", "placement", "resources", "strategy"]
