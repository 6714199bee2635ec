"""``rtml start`` and ``rtml stop``: the processes of one node, and their record.

::

    rtml start --head        -> cluster.start_head_node -> Redis, head service, node manager
    rtml start --address A   -> hello to A (token check) -> cluster.join_node -> node manager
                                 |
                                 v
                  <session_dir>/session.json  (addresses, pids, start times, Redis host/port)
                                 |
    rtml stop  -----------------+  SIGTERM the recorded pids, SIGKILL after 5 s

A recorded process is stopped only if it still runs with its recorded start
time, so a reused pid is never signalled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from rtml import cluster
from rtml.cli.options import CliError, session_flag, session_of
from rtml.config import (
    DEFAULT_DASHBOARD_PORT,
    DashboardConfig,
    NodeConfig,
    default_object_store_memory,
)
from rtml.control_plane import RedisAddress
from rtml.daemon import pid_alive
from rtml.exceptions import ProtocolError, RtmlSystemError
from rtml.ids import new_client_id
from rtml.rpc.client import FramedClient, make_hello
from rtml.rpc.tls import make_certificate, server_tls
from rtml.scheduler.resources import bad_amount
from rtml.session import Session, default_session_dir, new_token, process_start_time

STOP_TIMEOUT = 5.0
HELLO_TIMEOUT = 5.0


# -- rtml start --------------------------------------------------------------------------------

def cmd_start(args: argparse.Namespace) -> int:
    session = session_of(args)
    if args.head and _take_over_head(session):
        return 0
    _refuse_if_running(session)
    if args.head:
        return _start_head(args, session)
    return _start_worker_node(args, session)


def _node_config(args: argparse.Namespace, session: Session, token: str) -> NodeConfig:
    try:
        resources = _parse_resources(args.resources)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for flag in ("num_cpus", "num_gpus", "object_store_memory"):
        value = getattr(args, flag)
        if value is not None and bad_amount({flag: value}):
            raise CliError(f"--{flag.replace('_', '-')} must be a finite number >= 0, got "
                           f"{value}")
    num_cpus = float(os.cpu_count() or 1) if args.num_cpus is None else args.num_cpus
    store = args.object_store_memory or default_object_store_memory()
    node_ip = args.node_ip_address or cluster.detect_node_ip()
    if not cluster.is_local_ip(node_ip):
        raise CliError(f"--node-ip-address {node_ip} is not an address of this machine")
    cert, key = _tls_files(args, session)
    metrics_port, metrics_host = _metrics_flags(args)
    return NodeConfig(str(session.root), token, "", num_cpus, args.num_gpus or 0.0,
                      resources, store, node_ip=node_ip, tls_cert=cert, tls_key=key,
                      metrics_port=metrics_port, metrics_host=metrics_host)
def _tls_files(args: argparse.Namespace, session: Session) -> tuple[str, str]:
    """The certificate and key of ``--tls`` (given, or made in the session directory),
    checked; ("", "") without TLS."""
    if (args.tls_cert or args.tls_key) and not args.tls:
        raise CliError("--tls-cert and --tls-key go with --tls")
    if not args.tls:
        return "", ""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise CliError("pass both --tls-cert and --tls-key (PEM files), or neither to have "
                       "rtml make a certificate")
    if args.tls_cert:
        cert, key = os.path.abspath(args.tls_cert), os.path.abspath(args.tls_key)
    else:
        cert, key = make_certificate(str(session.create().root))
    try:
        server_tls(cert, key)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return cert, key


def _metrics_flags(args: argparse.Namespace) -> tuple[int, str]:
    """(port, host) of ``--metrics-port`` / ``--metrics-host``; (-1, "") when off."""
    port, host = args.metrics_port, args.metrics_host
    if port is None:
        if host is not None:
            raise CliError("--metrics-host needs --metrics-port PORT (0: any free port)")
        return -1, ""
    if not 0 <= port <= 65534:
        raise CliError(f"--metrics-port must be a port number (0 for any free one), got "
                       f"{port}")
    if host is not None and host != "0.0.0.0" and not cluster.is_local_ip(host):
        raise CliError(f"--metrics-host {host} is not an address of this machine (give one "
                       f"of its addresses, or 0.0.0.0 for all)")
    return port, host or ""


def _parse_resources(text: str | None) -> dict[str, float]:
    """Parse ``--resources '{"name": 2}'``. Raises ValueError with a fix."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--resources must be a JSON object like "
                         f"'{{\"GPU_TYPE_A\": 1}}': {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("--resources must be a JSON object of names to amounts")
    bad = bad_amount(value)
    if bad:
        raise ValueError(f"--resources: {bad}")
    return {str(k): float(v) for k, v in value.items()}


def _start_head(args: argparse.Namespace, session: Session) -> int:
    token = _given_token(args) or new_token()
    node = _node_config(args, session, token)
    _check_port_free(node.node_ip, args.port)
    timeout = args.node_timeout_s
    if timeout is not None and not timeout > 0:
        raise CliError(f"--node-timeout-s must be > 0 seconds, got {timeout}")
    redis = None
    if args.redis_address:
        try:
            redis = RedisAddress.parse(args.redis_address)
        except ValueError as exc:
            raise CliError(f"--redis-address: {exc}") from None
    dashboard = _dashboard_config(args)
    try:
        started = cluster.start_head_node(session, token, node, port=args.port,
                                          die_with_parent=False, node_timeout=timeout,
                                          redis_address=redis, dashboard=dashboard)
    except RtmlSystemError as exc:
        if redis is None:
            raise
        raise CliError(f"--redis-address: {exc}") from None
    assert started.redis_address is not None
    _write_record(started, "head", started.redis_address, (node.tls_cert, node.tls_key))
    _print_head_started(started, token, session, bool(node.tls_cert))
    return _block(started) if args.block else 0


def _dashboard_config(args: argparse.Namespace) -> DashboardConfig | None:
    """Where the dashboard listens; None for ``--dashboard-port 0``. Given no port, a
    free one is taken when 8265 is not free."""
    port = args.dashboard_port
    if port is not None and not 0 <= port <= 65535:
        raise CliError(f"--dashboard-port must be a port number (0 runs no dashboard), "
                       f"got {port}")
    if port == 0:
        return None
    if not cluster.is_local_ip(args.dashboard_host) and args.dashboard_host not in (
            "0.0.0.0", "::"):
        raise CliError(f"--dashboard-host {args.dashboard_host} is not an address of this "
                       f"machine (give one of its addresses, or 0.0.0.0 for all)")
    if port is None:
        return DashboardConfig(args.dashboard_host, DEFAULT_DASHBOARD_PORT, any_port=True)
    return DashboardConfig(args.dashboard_host, port)


def _take_over_head(session: Session) -> bool:
    """The session's head supervisor died (so its head service) while its Redis lives:
    start both again, on the recorded address, taking over from Redis; its node managers
    rejoin. False when there is no such head to take over."""
    record = session.read_record()
    token = session.read_token()
    if record is None or record.get("role") != "head" or not token:
        return False
    by_name = {p["name"]: p for p in _recorded_processes(record)}
    supervisor, redis = by_name.get("supervisor"), by_name.get("redis")
    users = record.get("redis_password")  # a Redis of the user's: not ours to watch
    if supervisor is None or _alive(supervisor) or not users and (
            redis is None or not _alive(redis)):
        return False
    try:
        proc = cluster.take_over_head(session, token, record["head_address"],
                                      RedisAddress.from_info(record),
                                      0 if users or redis is None else int(redis["pid"]),
                                      (record.get("tls_cert", ""), record.get("tls_key", "")),
                                      record.get("metrics", {}).get("head", ""))
    except RtmlSystemError as exc:
        raise CliError(f"could not start the head again in {session.root}: {exc}") from None
    supervisor.update(pid=proc.pid, start_time=process_start_time(proc.pid))
    record["pids"] = [p["pid"] for p in record["processes"]]
    session.write_record(record)
    print(f"Started the head service again in session {session.root}, taking over from "
          f"its control plane (Redis at {record['redis_host']}:{record['redis_port']})")
    print(f"RTML_ADDRESS={record['head_address']}", flush=True)
    return True


def _start_worker_node(args: argparse.Namespace, session: Session) -> int:
    for flag in ("node_timeout_s", "redis_address", "dashboard_port"):
        if getattr(args, flag) is not None:
            raise CliError(f"--{flag.replace('_', '-')} is the head's setting: pass it to "
                           f"`rtml start --head`")
    token = _given_token(args)
    if not token:
        raise CliError("no cluster token: set RTML_TOKEN or pass --token-file PATH (the head "
                       "printed it as RTML_TOKEN=... when it started)")
    address = _check_address(args.address)
    node = _node_config(args, session, token)
    info, head_tls = _hello_head(address, token)
    if head_tls != bool(node.tls_cert):
        raise CliError(f"the head at {address} uses TLS: start this node with --tls too"
                       if head_tls else f"the head at {address} does not use TLS: drop --tls "
                       f"here, or start the head with --tls")
    try:
        started = cluster.join_node(session, token, node, address, die_with_parent=False)
    except RtmlSystemError as exc:
        raise CliError(f"could not join the head at {address}: {exc}") from None
    _write_record(started, "node", RedisAddress.from_info(info) if info.get("redis_host")
                  else None, (node.tls_cert, node.tls_key))
    print(f"Started an rtml node in session {session.root}")
    print(f"  joined head:   {address}")
    print(f"  node manager:  {started.nm_address} (node {started.node_id})")
    for line in _metrics_lines(started):
        print(line)
    print(f"RTML_ADDRESS={address}")
    print(f"To stop it: rtml stop{session_flag(session)}", flush=True)
    return _block(started) if args.block else 0


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CliError(f"--address must be HOST:PORT (e.g. 127.0.0.1:6380), got {address!r}")
    return address


def _check_port_free(host: str, port: int) -> None:
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CliError(f"port {port} on {host} is not free ({exc.strerror}); pass "
                           f"--port with another port, or stop what uses it") from None


def _given_token(args: argparse.Namespace) -> str | None:
    """The token of ``--token``, ``--token-file`` or ``RTML_TOKEN`` (None: none given)."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"--token-file {args.token_file}: {exc.strerror}") from None
        if not token:
            raise CliError(f"--token-file {args.token_file} is empty")
        return token
    return args.token or os.environ.get("RTML_TOKEN") or None


def _hello_head(address: str, token: str) -> tuple[dict[str, str], bool]:
    """Say hello to the head so a wrong token or address fails here, clearly.

    Returns the head's HelloReply info (where its Redis listens), and whether it uses TLS.
    """
    async def hello() -> tuple[dict[str, str], bool]:
        client, reply = await FramedClient.connect(
            address, token, make_hello("cli", new_client_id()), timeout=HELLO_TIMEOUT)
        client.close()
        return dict(reply.info), client.tls

    try:
        return asyncio.run(hello())
    except ProtocolError as exc:
        raise CliError(f"the head at {address} refused this node: {exc}; pass the token the "
                       f"head printed (RTML_TOKEN=...) as RTML_TOKEN or in --token-file") from None
    except (OSError, TimeoutError, ConnectionError) as exc:
        raise CliError(f"cannot reach the head at {address} ({exc or type(exc).__name__}); "
                       f"check the address and that `rtml start --head` runs there") from None


def _write_record(started: cluster.StartedNode, role: str,
                  redis: RedisAddress | None, tls: tuple[str, str]) -> None:
    """Record what was started; processes are listed in the order to stop them. The
    record (0600) also says where the control plane is, and how to log in to a Redis
    of the user's."""
    procs = [(proc.pid, _module_name(proc.args)) for proc in reversed(started.procs)]
    if started.redis is not None:
        procs.append((started.redis.proc.pid, "redis"))
    where = redis.info() if redis is not None else {"redis_host": "", "redis_port": ""}
    started.session.write_record({
        "role": role, "head_address": started.head_address, "nm_address": started.nm_address,
        "node_id": started.node_id, **where, "tls_cert": tls[0], "tls_key": tls[1],
        "dashboard_url": started.dashboard_url, "metrics": started.metrics,
        "pids": [pid for pid, _ in procs],
        "processes": [{"pid": pid, "name": name, "start_time": process_start_time(pid)}
                      for pid, name in procs],
    })


def _module_name(argv: Any) -> str:
    """The process's short name: ``node`` for ``python -m rtml.node.main``."""
    try:
        package, _, module = str(argv[argv.index("-m") + 1]).rpartition(".")
    except (ValueError, IndexError, AttributeError):
        return "process"
    return package.rpartition(".")[2] if module == "main" else module


def _print_head_started(started: cluster.StartedNode, token: str, session: Session,
                        tls: bool) -> None:
    redis = started.redis_address
    tls_flag = " --tls" if tls else ""
    assert redis is not None
    whose = "" if started.redis is not None else " (yours: not started or stopped by rtml)"
    env = "" if session.root == Path(default_session_dir()) else \
        f"RTML_SESSION_DIR={session.root} "
    lines = [
        f"Started the rtml head node in session {session.root}",
        f"  head service:   {started.head_address}",
        f"  node manager:   {started.nm_address} (node {started.node_id})",
        f"  control plane:  Redis at {redis}{whose}",
        f"  dashboard:      {started.dashboard_url or 'none (--dashboard-port 0)'}",
        *_metrics_lines(started),
        f"RTML_ADDRESS={started.head_address}",
        f"RTML_TOKEN={token}",
        "",
        "To connect a driver on this machine:",
        f"    {env}python -c 'import rtml; rtml.init(address=\"auto\")'",
        "To add another node to this cluster (the token stays out of `ps`):",
        f"    RTML_TOKEN={token} rtml start --address {started.head_address} "
        f"--session-dir DIR{tls_flag}",
        f"  or, with a copy of {session.token_file}: rtml start --address "
        f"{started.head_address} --token-file PATH --session-dir DIR{tls_flag}",
        f"To stop this node:  rtml stop{session_flag(session)}",
    ]
    print("\n".join(lines), flush=True)


def _metrics_lines(started: cluster.StartedNode) -> list[str]:
    return [f"  metrics ({name.replace('_', ' ')}): http://{address}/metrics"
            for name, address in started.metrics.items()]


def _block(started: cluster.StartedNode) -> int:
    """Wait for SIGINT/SIGTERM, then stop what was started and forget the record."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("Running in the foreground; press Ctrl-C to stop.", flush=True)
    stop.wait()
    print("Stopping...", flush=True)
    started.stop()
    started.session.record_file.unlink(missing_ok=True)
    return 0


# -- rtml stop ---------------------------------------------------------------------------------

def cmd_stop(args: argparse.Namespace) -> int:
    session = session_of(args)
    record = session.read_record()
    if record is None:
        print(f"Nothing to stop: no rtml processes are recorded in {session.root}.")
        return 0
    stopped = 0
    for proc in _recorded_processes(record):
        if not _alive(proc):
            continue
        how = _terminate(proc["pid"])
        print(f"Stopped {proc['name']} (pid {proc['pid']}){how}.")
        stopped += 1
    session.record_file.unlink(missing_ok=True)
    if not stopped:
        print(f"Nothing was running in {session.root}; removed its stale record.")
    return 0


def _recorded_processes(record: dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(record.get("processes"), list):
        return list(record["processes"])
    return [{"pid": pid, "name": "process", "start_time": None}
            for pid in record.get("pids", [])]


def _terminate(pid: int) -> str:
    """SIGTERM, wait up to STOP_TIMEOUT s, then SIGKILL; returns a note on how it ended."""
    if not _signal(pid, signal.SIGTERM) or _wait_gone(pid, STOP_TIMEOUT):
        return ""
    _signal(pid, signal.SIGKILL)
    _wait_gone(pid, 2.0)
    return f" with SIGKILL after {STOP_TIMEOUT:.0f}s"


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    # Not our child (the starting `rtml start` has exited), so there is nothing to wait()
    # on; a short poll is fine for a command-line tool.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive({"pid": pid}):
            return True
        time.sleep(0.02)
    return not _alive({"pid": pid})


def _alive(proc: dict[str, Any]) -> bool:
    """True if the recorded process still runs (not a zombie, not a reused pid)."""
    pid = int(proc["pid"])
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to signal 0
        return pid_alive(pid)
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return False
    recorded = proc.get("start_time")
    return recorded is None or recorded == fields[19]


def _refuse_if_running(session: Session) -> None:
    record = session.read_record()
    if record is None:
        return
    alive = [p for p in _recorded_processes(record) if _alive(p)]
    if alive:
        pids = ", ".join(str(p["pid"]) for p in alive)
        raise CliError(f"rtml is already running in {session.root} (pids {pids}); run "
                       f"`rtml stop{session_flag(session)}` first, or pass another "
                       f"--session-dir")
