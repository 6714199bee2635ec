"""The state commands' text: what ``rtml.state.StateReader`` read, as tables and lines
for a terminal. Pure functions, one per command."""

from __future__ import annotations

import json
import time
from typing import Any

from rtml.config import STORE_RESOURCE

_GIB = float(1 << 30)
_BYTE_RESOURCES = ("memory", STORE_RESOURCE)
_CELL_MAX = 60  # characters of a cell in a table (ids are 40; errors go in `rtml get`)


def status(cluster: dict[str, Any], head_address: str, dashboard_url: str,
           head_metrics: str) -> str:
    """``rtml status``: where to look (the dashboard, each daemon's /metrics), nodes with
    their resources used/total, pending demand, counts."""
    nodes = cluster["nodes"]
    alive = sum(1 for n in nodes if n["alive"])
    lines = [f"Cluster at {head_address}: {alive} alive node(s), {len(nodes) - alive} dead"]
    if dashboard_url:
        lines.append(f"Dashboard: {dashboard_url}")
    if head_metrics:
        lines.append(f"Metrics (head): http://{head_metrics}/metrics")
    for node in nodes:
        state = "alive" if node["alive"] else "dead"
        lines.append(f"  node {node['node_id']}  {state}  {node['address']}")
        if node["alive"]:
            lines.append(f"    used/total: {_use(node['resources'])}")
            if node["metrics_address"]:
                lines.append(f"    metrics: http://{node['metrics_address']}/metrics")
    demand = cluster["pending_demand"]
    lines.append("Pending demand:" + ("" if demand else " none"))
    lines += [f"  {d['count']} pending task(s) need {json.dumps(d['shape'], sort_keys=True)}: "
              f"no node can run them yet" for d in demand]
    lines.append(f"Actors: {_counts(cluster['actors'])}")
    lines.append(f"Tasks: {_counts(cluster['tasks'])}")
    return "\n".join(lines)


def _use(resources: dict[str, dict[str, float]]) -> str:
    first = [n for n in ("CPU", "GPU", *_BYTE_RESOURCES) if n in resources]
    names = first + sorted(n for n in resources if n not in first)
    return ", ".join(f"{n} {amount(n, resources[n]['used'])}/{amount(n, resources[n]['total'])}"
                     for n in names)


def amount(name: str, value: float) -> str:
    """A resource amount as people read it: bytes in GiB, the rest as numbers."""
    if name in _BYTE_RESOURCES:
        return f"{value / _GIB:.2f} GiB"
    return f"{value:g}"


def _counts(counts: dict[str, int]) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def size(value: float) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= _CELL_MAX else text[:_CELL_MAX - 3] + "..."


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as aligned columns, headers in upper case."""
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    headers = [c.upper() for c in columns]
    widths = [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
              for line in cells]
    return "\n".join(lines)


def record(fields: dict[str, Any]) -> str:
    """One record as ``name: value`` lines."""
    width = max(len(k) for k in fields)
    return "\n".join(f"{k.ljust(width)}  {cell(v) if not isinstance(v, str) else v}"
                     for k, v in fields.items())


def task(found: dict[str, Any]) -> str:
    """``rtml get task``: its columns, its attempts, and a failure's traceback."""
    fields = {k: v for k, v in found.items() if k not in ("attempts", "error_message")}
    for key in ("creation_time_ms", "start_time_ms", "end_time_ms"):
        fields[key] = _clock_ms(fields.get(key))
    parts = [record(fields)]
    attempts = found["attempts"]
    if attempts:
        rows = [{**a, "start_ts": _clock(a["start_ts"]), "end_ts": _clock(a["end_ts"]),
                 "error": a["error_type"]} for a in attempts]
        parts.append("\nAttempts:\n" + table(rows, ["attempt", "status", "start_ts", "end_ts",
                                                    "worker_pid", "node_id", "error"]))
    if found.get("error_message"):
        parts.append(f"\nError ({found.get('error_type')}):\n{found['error_message'].rstrip()}")
    if found.get("state") == "FAILED":
        parts.append(f"\nTo run it again under a debugger: {found['replay']}")
    return "\n".join(parts)


def _clock(seconds: Any) -> str | None:
    if not isinstance(seconds, int | float) or not seconds:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _clock_ms(ms: Any) -> str | None:
    return _clock(ms / 1000) if isinstance(ms, int | float) else None


def summary(kind: str, cluster: dict[str, Any]) -> str:
    """``rtml summary``: one line per function, class or call site, with state counts."""
    groups = cluster["summary"]
    if not groups:
        return f"No {kind}."
    name = {"tasks": "func_or_class_name", "actors": "class_name"}.get(kind)
    rows = []
    for key, group in sorted(groups.items()):
        counts = group.get("state_counts") or group.get("task_state_counts") or {}
        row = {"name": key, "states": _counts(counts)}
        if kind == "tasks":
            row["type"] = group["type"]
        if kind == "objects":
            row.update(objects=group["total_objects"],
                       size=size(group["total_size_mb"] * (1 << 20)))
        rows.append(row)
    columns = ["name", "type", "states"] if kind == "tasks" else (
        ["name", "states"] if name else ["name", "objects", "size", "states"])
    totals = {k: v for k, v in cluster.items() if k.startswith("total")}
    return table(rows, columns) + "\n\n" + ", ".join(f"{k} {v}" for k, v in totals.items())


def memory(found: dict[str, Any]) -> str:
    """``rtml memory``: objects by owner, then each object with where its copies are."""
    if not found["objects"]:
        return "No objects in the object stores (small values live in their owners' memory)."
    owners = [{"owner": g["owner_id"], "objects": g["objects"], "size": size(g["bytes"]),
               "spilled": size(g["spilled_bytes"]), "nodes": len(g["nodes"])}
              for g in found["owners"]]
    objects = [{"object_id": o["object_id"], "size": size(max(o["object_size"], 0)),
                "owner": o["owner_id"], "spilled": o["spilled"],
                "locations": ", ".join(f"{n[:12]}:{s}" for n, s in
                                       sorted((o["locations"] or {}).items()))}
               for o in sorted(found["objects"], key=lambda o: -o["object_size"])]
    return "\n".join([
        f"{found['total_objects']} object(s), {size(found['total_bytes'])} in all, "
        f"{size(found['spilled_bytes'])} spilled to disk", "",
        "By owner:", table(owners, ["owner", "objects", "size", "spilled", "nodes"]), "",
        "Objects:", table(objects, ["object_id", "size", "owner", "spilled", "locations"])])
