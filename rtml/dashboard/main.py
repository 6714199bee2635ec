"""The dashboard daemon: ``python -m rtml.dashboard.main HEAD_CONFIG_JSON READY_FD``.

    its launcher (the head supervisor; an embedded driver's DashboardKeeper) binds the
    listening socket (HeadConfig.dashboard_fd) --> main()
        ControlPlane (Redis, as the head's config says) --> StateReader, LogReader
        aiohttp on that socket (rtml.dashboard.app) --> records its URL in the
        control plane --"ok URL"--> readiness pipe
    SIGTERM / SIGINT --> the server closes, then we exit

A process of its own, as Ray's dashboard: a crash or a slow page here cannot take the
head service down, and the head's event loop serves no HTTP. Its launcher starts it
again when it dies, on the same socket.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from pathlib import Path

from aiohttp import web

from rtml.cluster import dashboard_url
from rtml.config import HeadConfig
from rtml.control_plane import ControlPlane, RedisAddress, tls_from_text
from rtml.daemon import ReadyPipe, die_with_launcher, run_daemon, setup_logging
from rtml.dashboard.app import Dashboard, build_app
from rtml.logs import LogReader
from rtml.session import Session
from rtml.state import StateReader

log = logging.getLogger(__name__)


async def serve(cfg: HeadConfig, ready: ReadyPipe) -> None:
    sock = socket.socket(fileno=cfg.dashboard_fd)
    url = dashboard_url(sock)
    plane = ControlPlane.at(RedisAddress(cfg.redis_host, cfg.redis_port, cfg.redis_user,
                                         cfg.redis_password, tls_from_text(cfg.redis_tls)),
                            cfg.token)
    dashboard = Dashboard(StateReader(plane), LogReader(plane, cfg.token), cfg.token)
    runner = web.AppRunner(build_app(dashboard), access_log=None, handle_signals=False)
    await runner.setup()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await web.SockSite(runner, sock).start()
        await dashboard.read(plane.set_dashboard_url, url)
        log.info("the dashboard serves at %s", url)
        ready.report(f"ok {url}")
        await stopped.wait()
    finally:
        await runner.cleanup()
        dashboard.close()
        plane.close()


def main(argv: list[str]) -> int:
    cfg = HeadConfig.from_json(argv[1])
    ready = ReadyPipe(int(argv[2]) if len(argv) > 2 else -1)
    die_with_launcher()
    setup_logging(str(Session(Path(cfg.session_dir)).log_file("dashboard")))
    return run_daemon("dashboard", "dashboard", ready, serve(cfg, ready))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
