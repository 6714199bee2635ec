"""The head's placement groups when nodes die mid-placement: a removed group still being
prepared is released, and an answer to an earlier placement round is not taken for the
new one."""

from __future__ import annotations

from rtml.head.placement_groups import GroupState, PlacementGroups, Send
from rtml.rpc import messages as m

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16
PG = b"p" * 16
ONE = {"CPU": 1.0}


def spec(strategy: str = "STRICT_SPREAD", n: int = 2) -> m.CreatePlacementGroup:
    return m.CreatePlacementGroup(PG, [ONE] * n, strategy, "g", "ns", b"j" * 4, False)


def sends(commands: list, kind: type) -> set[bytes]:
    return {c.node_id for c in commands if isinstance(c, Send) and isinstance(c.msg, kind)}


def test_a_group_removed_while_preparing_is_released_when_a_node_dies() -> None:
    """remove() defers the release until every prepare is answered; a node that dies
    before answering never does (node_died skips REMOVED groups), so the nodes that
    did prepare keep the bundles' resources for ever."""
    groups = PlacementGroups()
    groups.create(spec(), {A: {"CPU": 2.0}, B: {"CPU": 2.0}})
    groups.remove(PG)  # while the prepares are out
    released = groups.prepared(PG, A, True)  # A took the bundle out of its pool
    released += groups.node_died(B, {A: {"CPU": 1.0}})  # B never answers
    assert A in sends(released, m.ReleaseBundles), "A's prepared bundle is never released"


def test_a_prepare_answer_of_an_earlier_round_is_not_taken_for_the_new_one() -> None:
    """node_died places the group again at once, on nodes whose answers to the first
    round may still be on their way: such an answer counts for the new round. Here A's
    first-round yes is followed by its refusal of the second, yet the group is CREATED
    (A never offers the bundle: its tasks wait for ever)."""
    groups = PlacementGroups()
    view = {n: {"CPU": 2.0} for n in (A, B, C)}
    groups.create(spec("SPREAD", 3), view)
    first = groups.groups[PG].nodes
    assert sorted(first) == [A, B, C]
    groups.prepared(PG, C, True, 1)
    groups.node_died(B, {A: {"CPU": 2.0}, C: {"CPU": 2.0}})  # placed again on A and C
    assert A in groups.groups[PG].waiting and groups.groups[PG].round == 2
    groups.prepared(PG, A, True, 1)  # A's answer to round one, still on its way
    groups.prepared(PG, C, True, 2)  # round two
    groups.prepared(PG, A, False, 2)  # A's answer to round two: no room
    assert groups.groups[PG].state is not GroupState.CREATED
