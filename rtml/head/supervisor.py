"""The head supervisor daemon of ``rtml start --head``: ``python -m rtml.head.supervisor
CONFIG_JSON READY_FD``.

    rtml start --head --config, the bound listening socket--> main()
        HeadSupervisor (rtml.cluster) starts the head service (which dies with us) and
        starts it again whenever it exits unasked, on the same socket
        DashboardKeeper (rtml.cluster) does the same for the dashboard, on its socket
        RedisKeeper (rtml.cluster) starts the session's Redis again whenever it exits
        --"ok host:port [metrics]" once the first head is ready--> readiness pipe
    SIGTERM / SIGINT --> the head (and a Redis started here) is stopped, then we exit

An embedded cluster runs the same supervisor as a thread of its driver.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from pathlib import Path

from rtml.cluster import DashboardKeeper, HeadSupervisor, RedisKeeper, await_ready
from rtml.config import HeadConfig
from rtml.control_plane import own_password
from rtml.daemon import ReadyPipe, setup_logging
from rtml.exceptions import RtmlSystemError
from rtml.session import Session


def main(argv: list[str]) -> int:
    cfg = HeadConfig.from_json(argv[1])
    ready = ReadyPipe(int(argv[2]) if len(argv) > 2 else -1)
    session = Session(Path(cfg.session_dir))
    setup_logging(str(session.log_file("supervisor")))
    supervisor = HeadSupervisor(session, cfg, socket.socket(fileno=cfg.listen_fd),
                                die_with_parent=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.stopping.set())
    try:
        address = await_ready(supervisor.launch(), session)
    except RtmlSystemError as exc:
        ready.report(f"error {exc}")
        supervisor.stop()
        return 1
    ready.report(f"ok {address}")
    dashboard = None
    if cfg.dashboard_fd >= 0:
        dashboard = DashboardKeeper(session, cfg, socket.socket(fileno=cfg.dashboard_fd),
                                    die_with_parent=True)
        dashboard.watch_in_thread(dashboard.launch())
    keeper = None
    if cfg.redis_pid:
        keeper = RedisKeeper(session, cfg.redis_host, cfg.redis_port, own_password(cfg.token),
                             cfg.redis_pid)
        keeper.watch_in_thread()

    def watch() -> None:
        supervisor.watch()
        supervisor.stopping.set()  # it gave up: so do we

    threading.Thread(target=watch, name="rtml-head-watch", daemon=True).start()
    supervisor.stopping.wait()
    if dashboard is not None:
        dashboard.stop()
    if keeper is not None:
        keeper.stop()
    supervisor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
