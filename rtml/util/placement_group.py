"""Ray's ``ray.util.placement_group``: reserve bundles of resources across nodes, then
run tasks and actors on them (``rtml.core.placement_groups`` draws the data flow).

    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    rtml.get(pg.ready())                        # reserved: one bundle on each of 3 nodes
    f.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
    remove_placement_group(pg)                  # freed; what runs in it is stopped
"""

from __future__ import annotations

from typing import Any

from rtml.core import current, placement_groups
from rtml.core.placement_groups import PlacementGroup

__all__ = ["PlacementGroup", "get_current_placement_group", "get_placement_group",
           "placement_group", "placement_group_table", "remove_placement_group"]


def placement_group(bundles: list[dict[str, float]], strategy: str = "PACK",
                    name: str = "", lifetime: str | None = None) -> PlacementGroup:
    """Ask for ``bundles`` (resource dicts) placed by ``strategy`` (PACK, SPREAD,
    STRICT_PACK, STRICT_SPREAD); returns at once: ``ready()`` / ``wait()`` tell when it
    is reserved (it waits, PENDING, while the cluster cannot hold it). It is removed
    when its job ends unless ``lifetime="detached"``."""
    return placement_groups.create(current.require_runtime(), bundles, strategy, name,
                                   lifetime)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Free the group's resources; the tasks and actors running on them are stopped."""
    placement_groups.remove(current.require_runtime(), placement_group)


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The live group of this name in the job's namespace; ValueError if none."""
    info = placement_groups.info(current.require_runtime(), name=placement_group_name)
    if info.state == "MISSING":
        raise ValueError(f"no placement group named {placement_group_name!r} in this "
                         f"job's namespace")
    return PlacementGroup(info.pg_id, info.bundles)


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict[str, Any]:
    """The group's state, bundles, strategy and nodes, as Ray's table shows them."""
    if placement_group is None:
        raise ValueError("placement_group_table() needs a placement group here")
    info = placement_groups.info(current.require_runtime(), placement_group.id)
    return {"placement_group_id": info.pg_id.hex(), "name": info.name,
            "state": info.state, "strategy": info.strategy,
            "bundles": dict(enumerate(info.bundles)),
            "bundles_to_node_id": {i: n.hex() for i, n in enumerate(info.nodes)}}


def get_current_placement_group() -> PlacementGroup | None:
    """The group the running task or actor runs in; None in a driver or outside one."""
    return placement_groups.current()
