"""Prometheus metrics of the daemons: ``/metrics`` served on a daemon's own event loop.

Each daemon (the head service, every node manager) counts what it already sees in plain
integers and histograms, and builds its families only when scraped
(:class:`prometheus_client.registry.Collector`), so nothing is added to the paths the
counters sit on but the increment. This package is the serving half: an aiohttp route
on the daemon's loop, loopback-only unless the user names another address, where a
bearer token (the cluster token) is then required.
"""

from rtml.metrics.server import LATENCY_BUCKETS, MetricsServer, loopback

__all__ = ["LATENCY_BUCKETS", "MetricsServer", "loopback"]
