"""``GET /metrics`` (Prometheus text format) on a daemon's event loop.

    Prometheus --GET /metrics [Authorization: Bearer <token>]--> aiohttp route
        loopback address (the default): served to anyone on this machine (as the
            daemons' Unix sockets are not: metrics carry no secret and run nothing)
        another address (--metrics-host): the cluster token is required, else 401
        --> prometheus_client.generate_latest(registry): the daemon's collectors read
            its counters now, on the loop (no lock: the loop is their only writer)

aiohttp and prometheus_client are imported only by a daemon asked to serve metrics:
a cluster without them starts ~0.2 s sooner.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Any

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds, for the latency histograms: a lease granted from the idle pool takes ~100 us,
one that waits for a worker to start 10-100 ms, one queued behind busy workers seconds; a
small object pulls in ~1 ms, 100 MB in 0.1-1 s."""


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (served without a token)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class MetricsServer:
    """Serves one registry at ``http://host:port/metrics`` until :meth:`close`."""

    def __init__(self, registry: Any, host: str, port: int, token: str) -> None:
        """``host`` not loopback: every request must carry ``Bearer <token>``."""
        self.registry = registry
        self.host = host
        self.port = port
        self._token = token if not loopback(host) else ""
        self._runner: Any = None
        self.address = ""

    async def start(self) -> str:
        """Listen; returns ``host:port`` (the port the kernel chose, for port 0). Raises
        RtmlSystemError naming the flag to change when the port is taken."""
        from aiohttp import web

        from rtml.exceptions import RtmlSystemError

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise RtmlSystemError(f"cannot serve metrics on {self.host}:{self.port} "
                                  f"({exc.strerror or exc}); pass another --metrics-port (an "
                                  f"embedded init()'s _metrics_export_port), or stop what "
                                  f"uses it") from None
        self.address = f"{self.host}:{self._runner.addresses[0][1]}"
        log.info("serving metrics at http://%s/metrics%s", self.address,
                 " (token required)" if self._token else "")
        return self.address

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self._token and not self._authorized(request.headers.get("Authorization", "")):
            return web.Response(status=401, text="rtml metrics: send the cluster token as "
                                "'Authorization: Bearer <token>' (<session>/token)\n",
                                headers={"WWW-Authenticate": 'Bearer realm="rtml"'})
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _authorized(self, header: str) -> bool:
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                  self._token.encode())

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
