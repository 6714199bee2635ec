"""Placement groups: reserve two bundles of one CPU (PACK), run tasks and an actor in
them, then remove the group.

Modelled on Ray's "Placement Groups" page.
"""

import time

import rtml as ray
from rtml.util.placement_group import (
    get_current_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from rtml.util.scheduling_strategies import PlacementGroupSchedulingStrategy

cpus_before = ray.available_resources().get("CPU", 0)

# Two bundles of one CPU each, packed onto as few nodes as possible (here, the one).
pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")

# The group is created asynchronously: ready() is an ObjectRef set once it is reserved.
ray.get(pg.ready(), timeout=30)
print("bundles:", pg.bundle_count)
table = placement_group_table(pg)
print("state:", table["state"], "- strategy:", table["strategy"])
print("bundles on one node:", len(set(table["bundles_to_node_id"].values())) == 1)

# The reserved CPUs are no longer available to work outside the group.
cpus_reserved = cpus_before - ray.available_resources().get("CPU", 0)
print("CPUs reserved:", int(cpus_reserved))


@ray.remote(num_cpus=1)
def in_group():
    current = get_current_placement_group()
    return current is not None and current.id == pg.id


@ray.remote(num_cpus=1)
def outside_group():
    return get_current_placement_group() is None


# A task scheduled into bundle 0.
in_bundle_0 = in_group.options(
    scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)
).remote()
print("task in bundle 0 sees the group:", ray.get(in_bundle_0))


@ray.remote(num_cpus=1)
class Worker:
    def __init__(self):
        self.total = 0

    def add(self, x):
        self.total += x
        return self.total


# An actor in bundle 1, using that bundle's CPU while it lives.
worker = Worker.options(
    scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=1)
).remote()
print("actor sums:", ray.get([worker.add.remote(i) for i in range(1, 4)]))

# Tasks with no bundle index go to any bundle with room; here, bundle 0.
any_bundle = PlacementGroupSchedulingStrategy(placement_group=pg)
print("tasks in any bundle:",
      ray.get([in_group.options(scheduling_strategy=any_bundle).remote() for _ in range(3)]))

# Removing the group frees its resources and ends the actor running in it. The actor
# is stopped asynchronously: a call made at once may still be answered, and once the
# actor is gone its calls raise an actor error.
remove_placement_group(pg)
print("state after removal:", placement_group_table(pg)["state"])
while True:
    try:
        ray.get(worker.add.remote(0))
    except ray.exceptions.ActorDiedError:
        break
    time.sleep(0.05)
print("the actor in the removed group is gone")

# The CPUs are free for ordinary tasks again.
print("a task outside any group runs:", ray.get(outside_group.remote()))
