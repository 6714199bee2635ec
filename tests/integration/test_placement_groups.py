"""Placement groups on a real three-node cluster (separate node managers over TCP):
bundles reserved by strategy, tasks and actors run on them, an infeasible group waits
and says so, removal frees the resources and stops what runs in them, a job's groups
end with it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

import rtml
from rtml.testing import Cluster
from rtml.util import (
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from rtml.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Cluster]:
    os.environ["RTML_NODE_TIMEOUT_S"] = "1.5"
    if rtml.is_initialized():
        rtml.shutdown()
    cluster = Cluster(head_node_args={"num_cpus": 2})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        cluster.connect()
        yield cluster
    finally:
        rtml.shutdown()
        cluster.shutdown()
        os.environ.pop("RTML_NODE_TIMEOUT_S", None)


@rtml.remote(num_cpus=1)
def where() -> tuple[str, dict[str, float], bool]:
    ctx = rtml.get_runtime_context()
    return ctx.get_node_id(), ctx.get_assigned_resources(), \
        get_current_placement_group() is not None


@rtml.remote(num_cpus=1)
class Holder:
    def node(self) -> str:
        return rtml.get_runtime_context().get_node_id()


@rtml.remote(num_cpus=1, max_retries=0)
def sleeper() -> None:
    time.sleep(60)


def in_bundle(pg: Any, index: int = -1) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(pg, index)


def free_cpus() -> float:
    return rtml.available_resources().get("CPU", 0.0)


def dead(actor: Any) -> bool:
    try:
        rtml.get(actor.node.remote(), timeout=30)
    except rtml.exceptions.ActorDiedError:
        return True
    return False


def until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_strict_spread_puts_a_bundle_on_each_node(three_nodes: Cluster) -> None:
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert pg.wait(30)
    table = placement_group_table(pg)
    assert table["state"] == "CREATED" and table["strategy"] == "STRICT_SPREAD"
    nodes = set(table["bundles_to_node_id"].values())
    assert nodes == {n["NodeID"] for n in rtml.nodes()}
    until(lambda: free_cpus() == 3.0)  # three of six reserved
    ran = [rtml.get(where.options(scheduling_strategy=in_bundle(pg, i)).remote(), timeout=30)
           for i in range(3)]
    assert [r[0] for r in ran] == [table["bundles_to_node_id"][i] for i in range(3)]
    assert all(r[1] == {"CPU": 1.0} and r[2] for r in ran)
    remove_placement_group(pg)
    until(lambda: free_cpus() == 6.0)
    assert placement_group_table(pg)["state"] == "REMOVED"


def test_strict_pack_keeps_bundles_and_their_actors_together(three_nodes: Cluster) -> None:
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK", name="packed")
    rtml.get(pg.ready(), timeout=30)
    assert get_placement_group("packed") == pg
    actors = [Holder.options(scheduling_strategy=in_bundle(pg, i)).remote() for i in (0, 1)]
    nodes = {rtml.get(a.node.remote(), timeout=30) for a in actors}
    assert nodes == set(placement_group_table(pg)["bundles_to_node_id"].values())
    assert len(nodes) == 1
    remove_placement_group(pg)  # its actors end for good
    for actor in actors:
        until(lambda a=actor: dead(a))
        with pytest.raises(rtml.exceptions.ActorDiedError, match="placement group"):
            rtml.get(actor.node.remote(), timeout=30)
    with pytest.raises(ValueError, match="packed"):
        get_placement_group("packed")


def test_an_infeasible_group_waits_until_room_frees(three_nodes: Cluster) -> None:
    never = placement_group([{"CPU": 1}] * 4, strategy="STRICT_SPREAD")  # three nodes
    assert never.wait(1) is False
    assert placement_group_table(never)["state"] == "PENDING"
    big = placement_group([{"CPU": 2}] * 3, strategy="SPREAD")  # every CPU
    assert big.wait(30)
    waiting = placement_group([{"CPU": 1}], strategy="PACK")
    assert waiting.wait(1) is False
    remove_placement_group(big)
    assert waiting.wait(30)  # placed once the first one's bundles came back
    for pg in (never, waiting):
        remove_placement_group(pg)
    until(lambda: free_cpus() == 6.0)


def test_removal_stops_the_tasks_running_in_it(three_nodes: Cluster) -> None:
    pg = placement_group([{"CPU": 1}], strategy="PACK")
    assert pg.wait(30)
    running = sleeper.options(scheduling_strategy=in_bundle(pg, 0)).remote()
    time.sleep(1.0)  # it started
    remove_placement_group(pg)
    with pytest.raises(rtml.exceptions.RtmlError):
        rtml.get(running, timeout=30)
    with pytest.raises(rtml.exceptions.RtmlError, match="was removed"):
        rtml.get(where.options(scheduling_strategy=in_bundle(pg)).remote(), timeout=30)
    until(lambda: free_cpus() == 6.0)


def test_a_group_passed_to_a_task_and_the_old_options(three_nodes: Cluster) -> None:
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
    assert pg.wait(30)

    @rtml.remote(num_cpus=0)
    def inner(group: Any) -> str:
        return rtml.get(where.options(placement_group=group,
                                      placement_group_bundle_index=1).remote())[0]

    assert rtml.get(inner.remote(pg), timeout=30) == \
        placement_group_table(pg)["bundles_to_node_id"][1]
    remove_placement_group(pg)


def test_bad_groups_are_refused_with_the_reason(three_nodes: Cluster) -> None:
    with pytest.raises(ValueError, match="strategy"):
        placement_group([{"CPU": 1}], strategy="CLOSE")
    with pytest.raises(ValueError, match="finite number"):
        placement_group([{"CPU": -1}])
    pg = placement_group([{"CPU": 1}])
    with pytest.raises(ValueError, match="bundle_index"):
        PlacementGroupSchedulingStrategy(pg, 1)
    remove_placement_group(pg)


def test_a_jobs_groups_end_with_its_driver(three_nodes: Cluster) -> None:
    script = textwrap.dedent(f"""
        import rtml
        from rtml.util import placement_group
        rtml.init(address={three_nodes.address!r}, token={three_nodes.token!r})
        pg = placement_group([{{"CPU": 2}}], strategy="PACK")
        assert pg.wait(30)
        print("reserved", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "reserved" in done.stdout, done.stderr
    until(lambda: free_cpus() == 6.0)  # the driver left: its group was removed


@rtml.remote(num_cpus=0)
def child_group() -> str:
    group = get_current_placement_group()
    return group.id.hex() if group is not None else ""


@rtml.remote(num_cpus=0)
def parent_of_children(explicit: bool) -> list[str]:
    if explicit:  # an explicit strategy wins over the captured group
        return [rtml.get(child_group.options(scheduling_strategy="DEFAULT").remote())]
    return rtml.get([child_group.remote(), child_group.remote()])


def test_a_capturing_task_puts_its_children_in_its_group(three_nodes: Cluster) -> None:
    pg = placement_group([{"CPU": 1}], strategy="PACK")
    assert pg.wait(30)
    captor = PlacementGroupSchedulingStrategy(pg, 0, placement_group_capture_child_tasks=True)
    assert rtml.get(parent_of_children.options(scheduling_strategy=captor).remote(False),
                    timeout=30) == [pg.id.hex()] * 2
    assert rtml.get(parent_of_children.options(scheduling_strategy=captor).remote(True),
                    timeout=30) == [""]
    plain = PlacementGroupSchedulingStrategy(pg, 0)
    assert rtml.get(parent_of_children.options(scheduling_strategy=plain).remote(False),
                    timeout=30) == ["", ""]
    remove_placement_group(pg)
