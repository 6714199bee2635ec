"""RemoteHolds: local holders of objects whose primary copy is on another node."""

from __future__ import annotations

from rtml.objectstore.remote import RemoteHolds

NODE_A, NODE_B = b"A" * 16, b"B" * 16
X, Y, Z = b"x" * 20, b"y" * 20, b"z" * 20


def test_the_first_hold_and_the_last_release_are_forwarded() -> None:
    holds = RemoteHolds()
    assert holds.add([X, Y], b"client1", NODE_A) == {NODE_A: [X, Y]}
    assert holds.add([X], b"client2", NODE_A) == {}  # node A already holds X for us
    assert holds.primary_of(X) == NODE_A
    assert holds.release([X], b"client1") == {}
    assert holds.release([X, Y], b"client2") == {NODE_A: [X]}  # Y was never client2's
    assert holds.release_holder(b"client1") == {NODE_A: [Y]}
    assert holds.primary_of(X) is None and holds.primary_of(Y) is None


def test_a_holder_that_goes_away_releases_every_node() -> None:
    holds = RemoteHolds()
    holds.add([X], b"task", NODE_A)
    holds.add([Z], b"task", NODE_B)
    assert holds.release_holder(b"task") == {NODE_A: [X], NODE_B: [Z]}
    assert holds.release_holder(b"task") == {}


def test_a_dead_primary_is_forgotten() -> None:
    holds = RemoteHolds()
    holds.add([X], b"c1", NODE_A)
    holds.add([Z], b"c1", NODE_B)
    assert holds.node_died(NODE_A) == {X: {b"c1"}}
    assert holds.release_holder(b"c1") == {NODE_B: [Z]}
