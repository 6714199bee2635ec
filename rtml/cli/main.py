"""The ``rtml`` command: start, stop and inspect the processes of a node.

::

    rtml start --head        -> cluster.start_head_node -> Redis, head service, node manager
    rtml start --address A   -> hello to A (token check) -> cluster.join_node -> node manager
                                 |
                                 v
                  <session_dir>/session.json  (addresses, pids, Redis host/port)
                                 |
    rtml stop  -----------------+  SIGTERM the recorded pids, SIGKILL after 5 s
    rtml status / list / timeline -> ControlPlane(redis host, port, token) -> Redis

Every ``rtml start`` records what it started in its session directory
(``--session-dir``, else ``RTML_SESSION_DIR``, else ``/tmp/rtml/session_latest``);
``rtml stop`` stops exactly those processes. Daemons are started in their own
session so they outlive this command. A user mistake prints one line naming the
fix and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rtml import cluster
from rtml.config import NodeConfig, default_object_store_memory, parse_resources
from rtml.control_plane import ControlPlane
from rtml.daemon import FramedClient, pid_alive
from rtml.exceptions import ProtocolError, RtmlSystemError
from rtml.ids import random_id
from rtml.rpc.reactor import make_hello
from rtml.session import Session, default_session_dir, new_token

STOP_TIMEOUT = 5.0
HELLO_TIMEOUT = 5.0
_GIB = float(1 << 30)
_BYTE_RESOURCES = ("memory", "object_store_memory")


class CliError(Exception):
    """A user mistake or an unmet precondition; the message names the fix."""


# -- entry points ------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """Run one ``rtml`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse prints its own usage message
        return exc.code if isinstance(exc.code, int) else 2
    if not hasattr(args, "run"):
        parser.print_help()
        return 1
    try:
        return int(args.run(args))
    except (CliError, RtmlSystemError) as exc:
        print(f"rtml: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main(sys.argv[1:]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtml", description="Run and inspect rtml clusters.")
    sub = parser.add_subparsers(title="commands")
    _add_start(sub)
    stop = _command(sub, "stop", cmd_stop, "stop the processes recorded in a session directory")
    _add_session_dir(stop)
    status = _command(sub, "status", cmd_status, "nodes, resources, pending demand, actors")
    _add_session_dir(status)
    _add_list(sub)
    timeline = _command(sub, "timeline", cmd_timeline, "write a Chrome trace of the tasks")
    timeline.add_argument("-o", "--output", default="timeline.json", help="file to write")
    _add_session_dir(timeline)
    _command(sub, "microbenchmark", cmd_microbenchmark, "run benchmarks/micro.py")
    return parser


def _command(sub: Any, name: str, run: Callable[[argparse.Namespace], int],
             help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                     description=help_text)
    parser.set_defaults(run=run)
    return parser


def _add_session_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session-dir", default=None,
                        help="session directory (default: $RTML_SESSION_DIR or "
                             "/tmp/rtml/session_latest)")


def _add_start(sub: Any) -> None:
    start = _command(sub, "start", cmd_start, "start a head node or join a cluster")
    where = start.add_mutually_exclusive_group(required=True)
    where.add_argument("--head", action="store_true", help="start a new cluster here")
    where.add_argument("--address", help="HOST:PORT of the head to join")
    start.add_argument("--token", default=None, help="cluster token (default: $RTML_TOKEN)")
    start.add_argument("--port", type=int, default=6380, help="head service port (--head)")
    start.add_argument("--node-ip-address", default=None, metavar="IP",
                       help="address this node listens on and others reach it at "
                            "(default: this machine's address on its default route)")
    start.add_argument("--num-cpus", type=float, default=None)
    start.add_argument("--num-gpus", type=float, default=None)
    start.add_argument("--resources", default=None, help='JSON, e.g. \'{"accel": 2}\'')
    start.add_argument("--object-store-memory", type=int, default=None, metavar="BYTES")
    start.add_argument("--block", action="store_true",
                       help="stay in the foreground; stop everything on Ctrl-C / SIGTERM")
    _add_session_dir(start)


def _add_list(sub: Any) -> None:
    lst = _command(sub, "list", cmd_list, "list cluster state from the control plane")
    lst.add_argument("kind", choices=sorted(_TABLES))
    lst.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                     help="keep rows whose KEY equals VALUE (repeatable)")
    lst.add_argument("--format", choices=("table", "json"), default="table")
    _add_session_dir(lst)


# -- rtml start --------------------------------------------------------------------------------

def cmd_start(args: argparse.Namespace) -> int:
    session = _session(args)
    _refuse_if_running(session)
    if args.head:
        return _start_head(args, session)
    return _start_worker_node(args, session)


def _node_config(args: argparse.Namespace, session: Session, token: str) -> NodeConfig:
    try:
        resources = parse_resources(args.resources)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    for flag in ("num_cpus", "num_gpus", "object_store_memory"):
        value = getattr(args, flag)
        if value is not None and value < 0:
            raise CliError(f"--{flag.replace('_', '-')} must be >= 0, got {value}")
    num_cpus = float(os.cpu_count() or 1) if args.num_cpus is None else args.num_cpus
    store = args.object_store_memory or default_object_store_memory()
    node_ip = args.node_ip_address or cluster.detect_node_ip()
    if not cluster.is_local_ip(node_ip):
        raise CliError(f"--node-ip-address {node_ip} is not an address of this machine")
    return NodeConfig(str(session.root), token, "", num_cpus, args.num_gpus or 0.0,
                      resources, store, node_ip=node_ip)


def _start_head(args: argparse.Namespace, session: Session) -> int:
    token = args.token or os.environ.get("RTML_TOKEN") or new_token()
    node = _node_config(args, session, token)
    _check_port_free(node.node_ip, args.port)
    started = cluster.start_head_node(session, token, node, port=args.port,
                                      die_with_parent=False)
    assert started.redis is not None
    _write_record(started, "head", started.redis.host, started.redis.port)
    _print_head_started(started, token, session)
    return _block(started) if args.block else 0


def _start_worker_node(args: argparse.Namespace, session: Session) -> int:
    token = args.token or os.environ.get("RTML_TOKEN")
    if not token:
        raise CliError("no cluster token: pass --token TOKEN or set RTML_TOKEN (the head "
                       "printed it as RTML_TOKEN=... when it started)")
    address = _check_address(args.address)
    node = _node_config(args, session, token)
    info = _hello_head(address, token)
    try:
        started = cluster.join_node(session, token, node, address, die_with_parent=False)
    except RtmlSystemError as exc:
        raise CliError(f"could not join the head at {address}: {exc}") from None
    _write_record(started, "node", info.get("redis_host", ""), int(info.get("redis_port", 0)))
    print(f"Started an rtml node in session {session.root}")
    print(f"  joined head:   {address}")
    print(f"  node manager:  {started.nm_address} (node {started.node_id})")
    print(f"RTML_ADDRESS={address}")
    print(f"To stop it: rtml stop{_session_flag(session)}", flush=True)
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


def _hello_head(address: str, token: str) -> dict[str, str]:
    """Say hello to the head so a wrong token or address fails here, clearly.

    Returns the head's HelloReply info (where its Redis listens).
    """
    async def hello() -> dict[str, str]:
        client, reply = await FramedClient.connect(
            address, make_hello(token, "cli", random_id()), timeout=HELLO_TIMEOUT)
        client.close()
        return dict(reply.info)

    try:
        return asyncio.run(hello())
    except ProtocolError as exc:
        raise CliError(f"the head at {address} refused this node: {exc}; pass the token the "
                       f"head printed (RTML_TOKEN=...) with --token or RTML_TOKEN") from None
    except (OSError, TimeoutError, ConnectionError) as exc:
        raise CliError(f"cannot reach the head at {address} ({exc or type(exc).__name__}); "
                       f"check the address and that `rtml start --head` runs there") from None


def _write_record(started: cluster.StartedNode, role: str, redis_host: str,
                  redis_port: int) -> None:
    """Record what was started; processes are listed in the order to stop them."""
    procs = [(proc.pid, _module_name(proc.args)) for proc in reversed(started.procs)]
    if started.redis is not None:
        procs.append((started.redis.proc.pid, "redis"))
    started.session.write_record({
        "role": role, "head_address": started.head_address, "nm_address": started.nm_address,
        "node_id": started.node_id, "redis_host": redis_host, "redis_port": redis_port,
        "pids": [pid for pid, _ in procs],
        "processes": [{"pid": pid, "name": name, "start_time": _start_time(pid)}
                      for pid, name in procs],
    })


def _module_name(argv: Any) -> str:
    """The process's short name: ``node_manager`` for ``python -m rtml.scheduler.node_manager``."""
    try:
        return str(argv[argv.index("-m") + 1]).rsplit(".", 1)[-1]
    except (ValueError, IndexError, AttributeError):
        return "process"


def _print_head_started(started: cluster.StartedNode, token: str, session: Session) -> None:
    assert started.redis is not None
    env = "" if session.root == Path(default_session_dir()) else \
        f"RTML_SESSION_DIR={session.root} "
    lines = [
        f"Started the rtml head node in session {session.root}",
        f"  head service:   {started.head_address}",
        f"  node manager:   {started.nm_address} (node {started.node_id})",
        f"  control plane:  Redis at {started.redis.host}:{started.redis.port}",
        f"RTML_ADDRESS={started.head_address}",
        f"RTML_TOKEN={token}",
        "",
        "To connect a driver on this machine:",
        f"    {env}python -c 'import rtml; rtml.init(address=\"auto\")'",
        "To add another node to this cluster:",
        f"    rtml start --address {started.head_address} --token {token} "
        f"--session-dir DIR",
        f"To stop this node:  rtml stop{_session_flag(session)}",
    ]
    print("\n".join(lines), flush=True)


def _session_flag(session: Session) -> str:
    if session.root == Path(default_session_dir()):
        return ""
    return f" --session-dir {session.root}"


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
    session = _session(args)
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


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to detect pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


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
                       f"`rtml stop{_session_flag(session)}` first, or pass another "
                       f"--session-dir")


# -- reading the control plane -----------------------------------------------------------------

def _session(args: argparse.Namespace) -> Session:
    return Session(Path(args.session_dir or default_session_dir()).absolute())


def _control_plane(args: argparse.Namespace) -> tuple[ControlPlane, dict[str, Any]]:
    """The control plane of the cluster this session's node belongs to."""
    session = _session(args)
    record = session.read_record()
    if record is None:
        raise CliError(f"no rtml node is recorded in {session.root}; start one with "
                       f"`rtml start --head`, or pass --session-dir / set RTML_SESSION_DIR")
    token = session.read_token() or os.environ.get("RTML_TOKEN")
    if not token:
        raise CliError(f"no token file in {session.root}; set RTML_TOKEN")
    if not record.get("redis_host") or not record.get("redis_port"):
        raise CliError(f"the record in {session.root} does not say where the control plane "
                       f"is; run this command with the head node's --session-dir")
    plane = ControlPlane(record["redis_host"], int(record["redis_port"]), token)
    if not plane.ping():
        raise CliError(f"cannot reach the control plane at {record['redis_host']}:"
                       f"{record['redis_port']}; is the cluster running? (`rtml start "
                       f"--head`)")
    return plane, record


def cmd_status(args: argparse.Namespace) -> int:
    plane, record = _control_plane(args)
    try:
        nodes = plane.list_nodes()
        alive = sum(1 for n in nodes if n["Alive"])
        print(f"Cluster at {record['head_address']}: {alive} alive node(s), "
              f"{len(nodes) - alive} dead")
        for node in nodes:
            _print_node(node)
        _print_pending(nodes)
        actors = Counter(str(a.get("state", "?")) for a in plane.list_actors())
        print(f"Actors: {_counts(actors)}")
        tasks = Counter(str(t.get("status", "?")) for t in plane.list_tasks())
        print(f"Tasks: {_counts(tasks)}")
    finally:
        plane.close()
    return 0


def _print_node(node: dict[str, Any]) -> None:
    state = "alive" if node["Alive"] else "dead"
    print(f"  node {node['NodeID']}  {state}  {node['NodeManagerAddress']}")
    if not node["Alive"]:
        return
    total: dict[str, float] = node["Resources"] or {}
    available: dict[str, float] = node["Available"] or total
    parts = []
    for name in _resource_order(total):
        used = total[name] - available.get(name, total[name])
        parts.append(f"{name} {_amount(name, used)}/{_amount(name, total[name])}")
    print(f"    used/total: {', '.join(parts)}")


def _resource_order(total: dict[str, float]) -> list[str]:
    first = [n for n in ("CPU", "GPU", *_BYTE_RESOURCES) if n in total]
    rest = sorted(n for n in total if n not in first and not n.startswith("node:"))
    return first + rest


def _amount(name: str, value: float) -> str:
    if name in _BYTE_RESOURCES:
        return f"{value / _GIB:.2f} GiB"
    return f"{value:g}"


def _print_pending(nodes: list[dict[str, Any]]) -> None:
    shapes: Counter[str] = Counter()
    for node in nodes:
        if node["Alive"]:
            for shape in node.get("PendingShapes") or []:
                shapes[json.dumps(shape, sort_keys=True)] += 1
    if not shapes:
        print("Pending demand: none")
        return
    print("Pending demand:")
    for shape, count in shapes.most_common():
        print(f"  {count} pending task(s) need {shape}: no node can run them yet")


def _counts(counter: Counter[str]) -> str:
    if not counter:
        return "none"
    return ", ".join(f"{n} {state}" for state, n in sorted(counter.items()))


# -- rtml list ---------------------------------------------------------------------------------

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def _field(name: str, width: int = 0) -> Callable[[dict[str, Any]], Any]:
    def get(row: dict[str, Any]) -> Any:
        value = row.get(name)
        if width and isinstance(value, str):
            return value[:width]
        return value
    return get


def _clock(name: str) -> Callable[[dict[str, Any]], Any]:
    def get(row: dict[str, Any]) -> Any:
        value = row.get(name)
        if not isinstance(value, int | float) or not value:
            return None
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    return get


def _duration(row: dict[str, Any]) -> Any:
    start, end = row.get("start_ts"), row.get("end_ts")
    if isinstance(start, int | float) and isinstance(end, int | float):
        return f"{(end - start) * 1000:.1f}ms"
    return None


def _node_resource(name: str) -> Callable[[dict[str, Any]], Any]:
    def get(row: dict[str, Any]) -> Any:
        total = (row.get("Resources") or {}).get(name)
        if total is None:
            return None
        available = (row.get("Available") or {}).get(name, total)
        return f"{_amount(name, total - available)}/{_amount(name, total)}"
    return get


_TABLES: dict[str, tuple[Callable[[ControlPlane], list[dict[str, Any]]], list[Column]]] = {
    "tasks": (lambda p: p.list_tasks(), [
        ("TASK_ID", _field("task_id")), ("NAME", _field("name")),
        ("STATUS", _field("status")), ("ATTEMPT", _field("attempt")),
        ("NODE", _field("node_id", 12)), ("WORKER_PID", _field("worker_pid")),
        ("SUBMITTED", _clock("submit_ts")), ("DURATION", _duration)]),
    "actors": (lambda p: p.list_actors(), [
        ("ACTOR_ID", _field("actor_id")), ("CLASS", _field("class_name")),
        ("NAME", _field("name")), ("STATE", _field("state")),
        ("NODE", _field("node_id", 12)), ("RESTARTS", _field("restarts"))]),
    "objects": (lambda p: p.list_objects(), [
        ("OBJECT_ID", _field("object_id")), ("OWNER", _field("owner", 12)),
        ("SIZE", _field("size")), ("LOCATIONS", _field("locations"))]),
    "nodes": (lambda p: p.list_nodes(), [
        ("NODE_ID", _field("NodeID")), ("ALIVE", _field("Alive")),
        ("ADDRESS", _field("NodeManagerAddress")), ("CPU", _node_resource("CPU")),
        ("GPU", _node_resource("GPU")), ("LAST_HEARTBEAT", _clock("LastHeartbeat"))]),
    "jobs": (lambda p: p.list_jobs(), [
        ("JOB_ID", _field("JobID")), ("DEAD", _field("IsDead")), ("PID", _field("pid")),
        ("START", _clock("StartTime")), ("END", _clock("EndTime")), ("CWD", _field("cwd"))]),
}


def cmd_list(args: argparse.Namespace) -> int:
    filters = _parse_filters(args.filter)
    plane, _ = _control_plane(args)
    try:
        read, columns = _TABLES[args.kind]
        rows = [r for r in read(plane) if _matches(r, filters)]
    finally:
        plane.close()
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(_table(rows, columns) if rows else f"No {args.kind}.")
    return 0


def _parse_filters(items: Iterable[str]) -> dict[str, str]:
    filters = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--filter takes KEY=VALUE (e.g. --filter status=FINISHED), "
                           f"got {item!r}")
        filters[key] = value
    return filters


def _matches(row: dict[str, Any], filters: dict[str, str]) -> bool:
    return all(key in row and _cell(row[key]) == value for key, value in filters.items())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def _table(rows: list[dict[str, Any]], columns: list[Column]) -> str:
    cells = [[_cell(get(row)) for _, get in columns] for row in rows]
    headers = [name for name, _ in columns]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
              for line in cells]
    return "\n".join(lines)


# -- rtml timeline / microbenchmark ------------------------------------------------------------

def cmd_timeline(args: argparse.Namespace) -> int:
    plane, _ = _control_plane(args)
    try:
        tasks = plane.list_tasks()
    finally:
        plane.close()
    events = [_trace_event(t) for t in tasks if t.get("start_ts") and t.get("end_ts")]
    with open(args.output, "w") as f:
        json.dump(events, f)
    print(f"Wrote {len(events)} task event(s) to {args.output}; open it in "
          f"chrome://tracing or https://ui.perfetto.dev")
    return 0


def _trace_event(task: dict[str, Any]) -> dict[str, Any]:
    return {"name": task.get("name") or "task", "cat": "task", "ph": "X",
            "ts": task["start_ts"] * 1e6, "dur": (task["end_ts"] - task["start_ts"]) * 1e6,
            "pid": str(task.get("node_id") or "")[:12], "tid": task.get("worker_pid", 0),
            "args": {"task_id": task.get("task_id"), "status": task.get("status"),
                     "job_id": task.get("job_id")}}


def cmd_microbenchmark(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "micro.py"
    if not script.is_file():
        print("The microbenchmarks live in the rtml source checkout (benchmarks/micro.py); "
              "run `rtml microbenchmark` from an editable install of it.")
        return 1
    return subprocess.call([sys.executable, str(script)], cwd=script.parents[1])


if __name__ == "__main__":
    entry()
