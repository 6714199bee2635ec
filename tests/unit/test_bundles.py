"""Placement groups' pure parts: where bundles go (rtml.scheduler.bundles), the head's
group directory (rtml.head.placement_groups) and a node's bundle book (LocalScheduler)."""

from __future__ import annotations

import pytest

from rtml.head.placement_groups import (
    GroupState,
    KillGroupActors,
    PlacementGroups,
    Save,
    Send,
)
from rtml.rpc import messages as m
from rtml.scheduler.bundles import bundle_resources, check_bundles, group_of, group_shape, place
from rtml.scheduler.local import LocalScheduler, StopActor, StopWorker

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16
ONE = {"CPU": 1.0}


def room(*cpus: float) -> dict[bytes, dict[str, float]]:
    return {node: {"CPU": c} for node, c in zip((A, B, C), cpus, strict=False)}


def test_strategies_place_bundles_as_ray_does() -> None:
    assert place([ONE] * 3, "STRICT_SPREAD", room(2, 2, 2)) is not None
    assert len(set(place([ONE] * 3, "STRICT_SPREAD", room(2, 2, 2)) or [])) == 3
    assert place([ONE] * 3, "STRICT_SPREAD", room(4, 4)) is None  # two nodes, three bundles
    assert place([ONE] * 2, "STRICT_PACK", room(1, 2)) == [B, B]
    assert place([ONE] * 3, "STRICT_PACK", room(2, 2)) is None
    assert place([ONE] * 3, "PACK", room(2, 1)) == [A, A, B]  # soft: spills when it must
    assert sorted(place([ONE] * 2, "SPREAD", room(4, 4)) or []) == [A, B]
    assert place([ONE] * 3, "SPREAD", room(4, 4)) is not None  # soft: shares when it must
    assert place([{"GPU": 1.0}], "PACK", room(8, 8)) is None


def test_group_names_tie_a_task_to_its_bundle() -> None:
    offered = bundle_resources({"CPU": 2.0}, "ff", 1)
    assert offered == {"CPU_group_1_ff": 2.0, "CPU_group_ff": 2.0,
                       "bundle_group_1_ff": 1000.0, "bundle_group_ff": 1000.0}
    asked = group_shape({"CPU": 1.0, "GPU": 0.0}, "ff", 1)
    assert asked == {"CPU_group_1_ff": 1.0, "bundle_group_1_ff": 0.001}
    assert group_shape({"CPU": 0.0}, "ff", -1) == {"bundle_group_ff": 0.001}
    assert group_of(asked) == "ff" and group_of({"CPU": 1.0}) == ""


@pytest.mark.parametrize("bundles,fragment", [
    ([], "non-empty list"), ("CPU", "non-empty list"), ([{}], "non-empty dict"),
    ([{"CPU": -1}], "finite number"), ([{"CPU": float("nan")}], "finite number"),
    ([{"CPU": 0}], "asks for nothing")])
def test_bad_bundles_are_named(bundles: object, fragment: str) -> None:
    assert fragment in check_bundles(bundles)


def spec(pg: bytes = b"p" * 16, strategy: str = "STRICT_SPREAD", n: int = 2,
         job: bytes = b"j" * 4, detached: bool = False) -> m.CreatePlacementGroup:
    return m.CreatePlacementGroup(pg, [ONE] * n, strategy, "g", "ns", job, detached)


def test_a_group_is_created_once_every_node_prepared() -> None:
    groups = PlacementGroups()
    view = room(2, 2)
    commands = groups.create(spec(), view)
    assert sorted(c.node_id for c in commands if isinstance(c, Send)) == [A, B]
    assert view == {A: {"CPU": 1.0}, B: {"CPU": 1.0}}  # taken from the head's view
    assert groups.prepared(b"p" * 16, A, True) == []
    commits = groups.prepared(b"p" * 16, B, True)
    assert {c.node_id for c in commits if isinstance(c, Send)} == {A, B}
    assert all(isinstance(c.msg, m.CommitBundles) for c in commits if isinstance(c, Send))
    assert Save(groups.groups[b"p" * 16]) in commits  # recorded: a new head restores it
    assert groups.lookup(1, b"", "g", "ns").state == "CREATED"
    assert groups.lookup(1, b"x" * 16, "", "").state == "MISSING"


def test_a_refused_prepare_releases_the_others_and_retries() -> None:
    groups = PlacementGroups()
    groups.create(spec(), room(2, 2))
    groups.prepared(b"p" * 16, A, False)
    release = groups.prepared(b"p" * 16, B, True)
    assert {(c.node_id, type(c.msg)) for c in release if isinstance(c, Send)} == {
        (A, m.ReleaseBundles), (B, m.ReleaseBundles)}
    assert groups.groups[b"p" * 16].state is GroupState.PENDING
    assert len(groups.place_pending(room(2, 2))) == 2  # prepared again on the next chance


def test_an_infeasible_group_waits_and_removal_releases_and_kills() -> None:
    groups = PlacementGroups()
    assert [c for c in groups.create(spec(n=3), room(4, 4)) if isinstance(c, Send)] == []
    assert groups.lookup(1, b"p" * 16, "", "").state == "PENDING"
    created = PlacementGroups()
    created.create(spec(), room(2, 2))
    created.prepared(b"p" * 16, A, True)
    created.prepared(b"p" * 16, B, True)
    removal = created.remove(b"p" * 16)
    assert KillGroupActors((b"p" * 16).hex()) in removal
    assert {c.node_id for c in removal if isinstance(c, Send)} == {A, B}
    assert created.removed((b"p" * 16).hex()) and created.remove(b"p" * 16) == []


def test_a_jobs_groups_end_with_it_unless_detached() -> None:
    groups = PlacementGroups()
    groups.create(spec(b"1" * 16), room(4, 4))
    groups.create(spec(b"2" * 16, detached=True), room(4, 4))
    groups.job_ended(b"j" * 4)
    assert groups.groups[b"1" * 16].state is GroupState.REMOVED
    assert groups.groups[b"2" * 16].state is not GroupState.REMOVED


def test_a_dead_nodes_groups_are_placed_again() -> None:
    groups = PlacementGroups()
    groups.create(spec(strategy="SPREAD"), room(2, 2, 2))
    for node in list(groups.groups[b"p" * 16].nodes):
        groups.prepared(b"p" * 16, node, True)
    lost = groups.groups[b"p" * 16].nodes[0]
    commands = groups.node_died(lost, {n: {"CPU": 2.0} for n in (A, B, C)})
    prepares = [c for c in commands if isinstance(c, Send)
                and isinstance(c.msg, m.PrepareBundles)]
    assert prepares and all(c.node_id != lost for c in prepares)
    assert groups.groups[b"p" * 16].state is GroupState.RESCHEDULING


def test_a_node_offers_bundles_once_committed_and_stops_their_users() -> None:
    sched = LocalScheduler({"CPU": 4.0}, pool_size=0)
    pg = "ab" * 8
    assert sched.prepare_bundles(pg, [(0, {"CPU": 2.0})])
    assert sched.available["CPU"] == 2.0 and "CPU_group_0_" + pg not in sched.total
    assert not sched.prepare_bundles("cd" * 8, [(0, {"CPU": 3.0})])  # no room left
    sched.commit_bundles(pg)
    assert sched.total[f"CPU_group_0_{pg}"] == 2.0 and sched.total_changes == 1
    sched.idle.append(b"w" * 16)
    sched.request_lease("owner", 1, group_shape({"CPU": 1.0}, pg, 0))
    assert sched.leases  # granted on the bundle
    sched.actor_shapes[b"x" * 16] = group_shape({"CPU": 0.0}, pg, -1)
    commands = sched.release_bundles(pg)
    assert StopWorker(b"w" * 16) in commands and StopActor(b"x" * 16) in commands
    assert sched.available["CPU"] == 4.0 and not any(pg in k for k in sched.total)


def test_a_recorded_group_is_restored_by_a_new_head() -> None:
    groups = PlacementGroups()
    groups.restore(spec(b"1" * 16), GroupState.CREATED, [A, B])
    groups.restore(spec(b"2" * 16), GroupState.RESCHEDULING, [A])
    assert groups.lookup(1, b"1" * 16, "", "").nodes == [A, B]
    assert groups.groups[b"2" * 16].state is GroupState.PENDING  # placed again
    assert any(isinstance(c, Send) for c in groups.place_pending(room(4, 4)))


def test_bundles_of_a_group_no_head_recorded_are_released_on_rejoin() -> None:
    groups = PlacementGroups()
    groups.restore(spec(b"1" * 16), GroupState.CREATED, [A])
    commands = groups.node_back(A, [b"1" * 16, b"9" * 16])
    assert commands == [Send(A, m.ReleaseBundles(b"9" * 16))]  # the known one is kept
    assert groups.removed((b"9" * 16).hex()) and not groups.removed((b"1" * 16).hex())
    groups.remove(b"1" * 16)  # while the node was away: it is told when it is back
    assert Send(A, m.ReleaseBundles(b"1" * 16)) in groups.node_back(A, [b"1" * 16])
