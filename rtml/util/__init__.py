"""Ray's ``ray.util``, on rtml's public API: libraries a program imports by name.

    ActorPool                 rtml.util.actor_pool    a fixed set of actors fed tasks
    queue.Queue               rtml.util.queue         a FIFO shared by tasks and actors
    multiprocessing.Pool      rtml.util.multiprocessing   multiprocessing's Pool on actors
    list_named_actors, get_node_ip_address   (rtml.api's)
"""

from __future__ import annotations

from rtml.api import get_node_ip_address, list_named_actors
from rtml.util import multiprocessing, queue, scheduling_strategies, state
from rtml.util.actor_pool import ActorPool
from rtml.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = [
    "ActorPool", "PlacementGroup", "get_current_placement_group", "get_node_ip_address",
    "get_placement_group", "list_named_actors", "multiprocessing", "placement_group",
    "placement_group_table", "queue", "remove_placement_group", "scheduling_strategies",
    "state",
]
