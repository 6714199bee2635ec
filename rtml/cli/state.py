"""``rtml status``, ``rtml list`` and ``rtml timeline``: cluster state read from Redis.

::

    <session_dir>/session.json (Redis host/port) + token
        -> ControlPlane -> Redis -> nodes, actors, tasks, objects, jobs
        -> status summary | table or JSON rows | Chrome trace file

These commands only read. The session's record (written by ``rtml start`` on
the head or on a joined node) says where the control plane listens.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from rtml.cli.options import CliError, session_of
from rtml.config import STORE_RESOURCE
from rtml.control_plane import ControlPlane, RedisAddress, chrome_trace, unreachable
from rtml.exceptions import RtmlSystemError

_GIB = float(1 << 30)
_BYTE_RESOURCES = ("memory", STORE_RESOURCE)


# -- reading the control plane -----------------------------------------------------------------

def _control_plane(args: argparse.Namespace) -> tuple[ControlPlane, dict[str, Any]]:
    """The control plane of the cluster this session's node belongs to."""
    session = session_of(args)
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
    plane = ControlPlane.at(RedisAddress.from_info(record), token)
    try:
        plane.check()
    except RtmlSystemError as exc:
        if not unreachable(exc):
            raise
        plane.close()
        raise CliError(f"the control plane: {exc}") from None
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


TABLES: dict[str, tuple[Callable[[ControlPlane], list[dict[str, Any]]], list[Column]]] = {
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
        read, columns = TABLES[args.kind]
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


# -- rtml timeline -----------------------------------------------------------------------------

def cmd_timeline(args: argparse.Namespace) -> int:
    plane, _ = _control_plane(args)
    try:
        events = chrome_trace(plane.list_tasks(), plane.read_events())
    finally:
        plane.close()
    with open(args.output, "w") as f:
        json.dump(events, f)
    tasks = sum(1 for e in events if e.get("cat") in ("task", "actor_call"))
    print(f"Wrote {len(events)} trace event(s) ({tasks} task(s) and actor call(s), their "
          f"phases, leases and transfers) to {args.output}; open it in chrome://tracing or "
          f"https://ui.perfetto.dev")
    return 0
