"""The head service process: ``python -m rtml.head.main CONFIG_JSON READY_FD``.

    launcher (rtml.cluster) --config, a bound listening socket--> main()
        HeadService.recover(): what an earlier head recorded in the control plane (a head
                               restarted by its supervisor takes over from there)
        HeadService serves node managers and drivers on that socket
        one task group: the liveness watch (nodes silent for node_timeout s die), the
                        submitted jobs' runner (rtml.head.job_runner)
        /metrics (--metrics-port: rtml.metrics on this loop, rtml.head.metrics' families),
                 its address recorded in the control plane (what `rtml status` shows)
        --"ok host:port [metrics host:port]"--> readiness pipe
    SIGTERM / SIGINT --> stopped: every node manager is told to shut down, writes finish
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from rtml.config import HEARTBEAT_INTERVAL, TRIM_INTERVAL, HeadConfig
from rtml.daemon import (
    ReadyPipe,
    die_with_launcher,
    run_daemon,
    run_until_stopped,
    setup_logging,
)
from rtml.head.metrics import HeadParts
from rtml.head.service import HeadService
from rtml.metrics import MetricsServer
from rtml.rpc import messages as m
from rtml.rpc.server import protocol_factory
from rtml.rpc.tls import listener_tls
from rtml.session import Session

log = logging.getLogger(__name__)


async def serve(cfg: HeadConfig, ready: ReadyPipe) -> None:
    head = HeadService(cfg)
    await asyncio.to_thread(head.recover)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop_on_signal, head, sig)
    tls = listener_tls(cfg.tls_cert, cfg.tls_key)
    if cfg.listen_fd >= 0:
        sock = socket.socket(fileno=cfg.listen_fd)
        if sock.family == socket.AF_UNIX:
            tls = None  # (TLS is for what crosses the network)
        server = await loop.create_server(protocol_factory(head, tls), sock=sock)
    else:
        server = await loop.create_server(protocol_factory(head, tls), cfg.host, cfg.port)
    port = server.sockets[0].getsockname()[1]
    log.info("head service pid %d serving on %s:%d", os.getpid(), cfg.host, port)
    metrics = None
    if cfg.metrics_port >= 0:
        parts = HeadParts(head.nodes, head.actors, head.jobs, head.sched)
        metrics = MetricsServer(head.metrics.serve(parts), cfg.metrics_host or "127.0.0.1",
                                cfg.metrics_port, cfg.token)
        await metrics.start()
    head.writes.write(head.plane.set_head_metrics_address, metrics.address if metrics else "")
    ready.report(f"ok {cfg.host}:{port}" + (f" {metrics.address}" if metrics else ""))
    try:
        await run_until_stopped(head.stopped, _watch_liveness(head), _trim_tasks(head),
                                head.submissions.run(f"{cfg.host}:{port}"))
    finally:
        for node in head.nodes.values():
            if node.alive:
                node.peer.send(m.Shutdown())
        server.close()
        if metrics is not None:
            await metrics.close()
        await asyncio.to_thread(head.close)


def _stop_on_signal(head: HeadService, sig: signal.Signals) -> None:
    log.info("stopping on %s", sig.name)
    head.stopped.set()


async def _watch_liveness(head: HeadService) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_INTERVAL)
        head.check_liveness()


async def _trim_tasks(head: HeadService) -> None:
    """Keep the task table bounded (``task_records_kept``), off the loop."""
    while True:
        await asyncio.sleep(TRIM_INTERVAL)
        head.writes.aside(head.plane.trim_task_records, head.cfg.task_records_kept)


def main(argv: list[str]) -> int:
    cfg = HeadConfig.from_json(argv[1])
    ready = ReadyPipe(int(argv[2]) if len(argv) > 2 else -1)
    die_with_launcher()
    setup_logging(str(Session(Path(cfg.session_dir)).log_file("head")))
    return run_daemon("head service", "head", ready, serve(cfg, ready))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
