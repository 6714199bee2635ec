"""Placement groups' policy: where a group's bundles go, and the resource names that
tie tasks to them. Sans-I/O.

    place(bundles, strategy, nodes) --> a node per bundle, or None (not now)
    reserve on each node: its bundle's shape leaves the node's own pool and comes back
        under group names (bundle_resources): CPU_group_<i>_<pg>, CPU_group_<pg>, ...
    a task of bundle i (or any: -1) asks for group_shape(...) instead of its shape, so
        the ordinary lease and spill path puts it where its bundle is

Strategies, as Ray's: PACK (as few nodes as fit, soft), SPREAD (each bundle on its own
node where possible, soft), STRICT_PACK (one node), STRICT_SPREAD (a node per bundle).
"""

from __future__ import annotations

from rtml.ids import NodeID
from rtml.scheduler.resources import Shape, fits, subtract

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
BUNDLE = "bundle"
"""The resource every bundle has (as Ray's), so a task of no resources lands there too."""
BUNDLE_UNITS = 1000.0
TASK_BUNDLE_UNITS = 0.001


def group_shape(shape: Shape, pg_hex: str, index: int) -> Shape:
    """What a task of ``shape`` asks for in bundle ``index`` (-1: any) of the group."""
    suffix = f"_group_{index}_{pg_hex}" if index >= 0 else f"_group_{pg_hex}"
    asked = {f"{name}{suffix}": amount for name, amount in shape.items() if amount}
    asked[f"{BUNDLE}{suffix}"] = TASK_BUNDLE_UNITS
    return asked


def bundle_resources(shape: Shape, pg_hex: str, index: int) -> Shape:
    """What reserving bundle ``index`` of ``shape`` adds to its node."""
    added: Shape = {}
    for name, amount in {**shape, BUNDLE: BUNDLE_UNITS}.items():
        added[f"{name}_group_{index}_{pg_hex}"] = amount
        added[f"{name}_group_{pg_hex}"] = amount
    return added


def group_of(shape: Shape) -> str:
    """The placement group (hex) a task's shape ties it to, or ""."""
    for name in shape:
        if name.startswith(f"{BUNDLE}_group_"):
            return name.rsplit("_", 1)[1]
    return ""


def check_bundles(bundles: object) -> str:
    """What is wrong with ``bundles`` (a non-empty list of non-empty resource dicts of
    amounts >= 0, not all zero), or ""."""
    if not isinstance(bundles, list) or not bundles:
        return f"bundles must be a non-empty list of resource dicts, got {bundles!r}"
    for i, bundle in enumerate(bundles):
        if not isinstance(bundle, dict) or not bundle:
            return f"bundle {i} must be a non-empty dict like {{'CPU': 1}}, got {bundle!r}"
        for name, amount in bundle.items():
            if (not isinstance(name, str) or isinstance(amount, bool)
                    or not isinstance(amount, int | float) or not amount >= 0
                    or amount == float("inf")):
                return f"bundle {i}: {name!r} must be a finite number >= 0, got {amount!r}"
        if not any(bundle.values()):
            return f"bundle {i} asks for nothing ({bundle!r}); give it some resource"
    return ""


def place(bundles: list[Shape], strategy: str, nodes: dict[NodeID, Shape]
          ) -> list[NodeID] | None:
    """A node for each bundle, from ``nodes`` (what each has available), or None if the
    strategy cannot be met now."""
    room = {node_id: dict(available) for node_id, available in nodes.items()}
    if strategy == "STRICT_PACK":
        return _one_node(bundles, room)
    if strategy == "PACK":
        return _one_node(bundles, room) or _fill(bundles, room, spread=False)
    if strategy == "STRICT_SPREAD":
        return _distinct(bundles, room)
    return _distinct(bundles, room) or _fill(bundles, room, spread=True)


def _one_node(bundles: list[Shape], room: dict[NodeID, Shape]) -> list[NodeID] | None:
    total: Shape = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + amount
    for node_id, available in _roomiest(room):
        if fits(total, available):
            return [node_id] * len(bundles)
    return None


def _distinct(bundles: list[Shape], room: dict[NodeID, Shape]) -> list[NodeID] | None:
    """A different node for each bundle (the largest bundles choose first)."""
    order = sorted(range(len(bundles)), key=lambda i: -sum(bundles[i].values()))
    chosen: dict[int, NodeID] = {}
    for i in order:
        free = [(n, a) for n, a in _roomiest(room) if n not in chosen.values()
                and fits(bundles[i], a)]
        if not free:
            return None
        chosen[i] = free[0][0]
    return [chosen[i] for i in range(len(bundles))]


def _fill(bundles: list[Shape], room: dict[NodeID, Shape], spread: bool
          ) -> list[NodeID] | None:
    """Each bundle on a node with room: the one last used while it fits (PACK), or the
    roomiest each time (SPREAD)."""
    room = {n: dict(a) for n, a in room.items()}
    chosen: list[NodeID] = []
    for bundle in bundles:
        last = chosen[-1] if chosen and not spread else None
        if last is not None and fits(bundle, room[last]):
            node_id = last
        else:
            fitting = [n for n, a in _roomiest(room) if fits(bundle, a)]
            if not fitting:
                return None
            node_id = fitting[0]
        subtract(room[node_id], bundle)
        chosen.append(node_id)
    return chosen


def _roomiest(room: dict[NodeID, Shape]) -> list[tuple[NodeID, Shape]]:
    return sorted(room.items(), key=lambda item: -item[1].get("CPU", 0.0))
