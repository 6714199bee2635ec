"""``summarize_*``'s counts, in the shape Ray's return: ``{"cluster": {...}}`` (Ray keys
a summary by node, and its state API gives one key, "cluster"). Pure functions."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rtml.state.common import ActorState, ObjectState, TaskState

_MIB = float(1 << 20)


def task_summary(tasks: list[TaskState]) -> dict[str, Any]:
    """Tasks counted by function (or ``Class.method``) name and state, as Ray's
    ``TaskSummaries`` by ``func_name``."""
    summary: dict[str, dict[str, Any]] = {}
    for task in tasks:
        group = summary.setdefault(task.func_or_class_name, {
            "func_or_class_name": task.func_or_class_name, "type": task.type,
            "state_counts": {}})
        counts = group["state_counts"]
        counts[task.state] = counts.get(task.state, 0) + 1
    types = Counter(task.type for task in tasks)
    return {"cluster": {
        "summary": summary, "total_tasks": types["NORMAL_TASK"],
        "total_actor_tasks": types["ACTOR_TASK"],
        "total_actor_scheduled": types["ACTOR_CREATION_TASK"],  # rtml records none
        "summary_by": "func_name"}}


def actor_summary(actors: list[ActorState]) -> dict[str, Any]:
    """Actors counted by class and state, as Ray's ``ActorSummaries``."""
    summary: dict[str, dict[str, Any]] = {}
    for actor in actors:
        group = summary.setdefault(actor.class_name, {
            "class_name": actor.class_name, "state_counts": {}})
        counts = group["state_counts"]
        counts[actor.state] = counts.get(actor.state, 0) + 1
    return {"cluster": {"summary": summary, "total_actors": len(actors),
                        "summary_by": "class"}}


def object_summary(objects: list[ObjectState], owners: list[str]) -> dict[str, Any]:
    """Objects counted by call site (all ``"disabled"``: rtml records none), as Ray's
    ``ObjectSummaries``; ``owners[i]`` is the process owning ``objects[i]``."""
    summary: dict[str, dict[str, Any]] = {}
    workers: dict[str, set[str]] = {}
    nodes: dict[str, set[str | None]] = {}
    for obj, owner in zip(objects, owners, strict=True):
        group = summary.setdefault(obj.call_site, {
            "total_objects": 0, "total_size_mb": 0.0, "total_num_workers": 0,
            "total_num_nodes": 0, "task_state_counts": {}, "ref_type_counts": {}})
        group["total_objects"] += 1
        if obj.object_size >= 0:
            group["total_size_mb"] += obj.object_size / _MIB
        _count(group["task_state_counts"], obj.task_status)
        _count(group["ref_type_counts"], obj.reference_type)
        workers.setdefault(obj.call_site, set()).add(owner)
        nodes.setdefault(obj.call_site, set()).add(obj.ip)
    for call_site, group in summary.items():
        group["total_num_workers"] = len(workers[call_site])
        group["total_num_nodes"] = len(nodes[call_site])
    return {"cluster": {
        "summary": summary, "total_objects": len(objects),
        "total_size_mb": sum(g["total_size_mb"] for g in summary.values()),
        "callsite_enabled": False, "summary_by": "callsite"}}


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def memory_summary(objects: list[ObjectState]) -> dict[str, Any]:
    """``rtml memory``: the objects (detail columns filled) by the process owning them,
    largest owner first: ``{"owners": [{"owner_id", "objects", "bytes", "spilled_bytes",
    "nodes", "object_ids"}], "total_objects", "total_bytes", "spilled_bytes"}``."""
    owners: dict[str, dict[str, Any]] = {}
    for obj in objects:
        owner = obj.owner_id or "?"
        group = owners.setdefault(owner, {"owner_id": owner, "objects": 0, "bytes": 0,
                                          "spilled_bytes": 0, "nodes": set(),
                                          "object_ids": []})
        size = max(obj.object_size, 0)
        group["objects"] += 1
        group["bytes"] += size
        group["spilled_bytes"] += size if obj.spilled else 0
        group["nodes"].update(obj.locations or {})
        group["object_ids"].append(obj.object_id)
    ranked = sorted(owners.values(), key=lambda g: (-g["bytes"], g["owner_id"]))
    for group in ranked:
        group["nodes"] = sorted(group["nodes"])
    return {"owners": ranked, "total_objects": len(objects),
            "total_bytes": sum(g["bytes"] for g in ranked),
            "spilled_bytes": sum(g["spilled_bytes"] for g in ranked)}
