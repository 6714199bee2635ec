"""The node's object manager shell, with fake links and peers: holds made before an object's
primary was known move to its node, waits for objects a local owner has not made yet (woken
by the seal, failed with owner_died when the owner goes), other nodes asking where an object
is, the answers to our own questions, the bounded asks of pulls that find nothing, and
releases of holders and nested refs forwarded to the node holding them."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from pathlib import Path
from typing import cast

import pytest

from rtml.exceptions import ObjectLostError
from rtml.node import objects
from rtml.node.links import NodeLinks
from rtml.node.objects import COPY, MAX_ASKS, ObjectManager
from rtml.objectstore import segment
from rtml.rpc import messages as m

HERE, B, C = b"a" * 16, b"b" * 16, b"c" * 16  # this node and two others
OWNER, H1, H2, H3, H4 = b"o" * 16, b"1" * 16, b"2" * 16, b"3" * 16, b"4" * 16
X, Y = b"x" * 20, b"y" * 20
ADDRESSES = {B: "10.0.0.2:7000", C: "10.0.0.3:7000"}  # transfer servers of B and C


class FakeLinks:
    """The node links: records what is sent to which node."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, m.Msg]] = []

    def send(self, node_id: bytes, msg: m.Msg) -> None:
        self.sent.append((node_id, msg))

    def address_known(self, node_id: bytes, address: str) -> None:
        pass

    def forget(self, node_id: bytes) -> None:
        pass

    async def fence(self, node_id: bytes) -> None:
        pass


class FakePeer:
    """A client's or another node's connection: records what it is sent."""

    def __init__(self) -> None:
        self.sent: list[m.Msg] = []

    def send(self, msg: m.Msg) -> None:
        self.sent.append(msg)


def _manager(tmp_path: Path) -> tuple[ObjectManager, FakeLinks]:
    """A manager for node HERE; call inside a running loop (it takes the running one)."""
    links = FakeLinks()
    ended: list[bytes] = []
    store_dir = tmp_path / f"store-{uuid.uuid4().hex[:8]}"
    store_dir.mkdir(mode=0o700)
    manager = ObjectManager(HERE, str(store_dir), str(tmp_path), 1 << 20,
                            "token", cast(NodeLinks, links), ended.append)
    return manager, links


def _record_pulls(manager: ObjectManager,
                  monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes, str]]:
    """Know the transfer servers of B and C, and record the pulls started instead of
    running them (a real pull is gRPC in a thread)."""
    manager.transfer_addresses.update(ADDRESSES)
    started: list[tuple[bytes, bytes, str]] = []

    def start_pull(object_id: bytes, node_id: bytes, address: str) -> None:
        started.append((object_id, node_id, address))

    monkeypatch.setattr(manager, "_start_pull", start_pull)
    return started


def _not_found(manager: ObjectManager) -> asyncio.Future[int]:
    """A finished pull that found nothing on its node (gRPC NOT_FOUND)."""
    future: asyncio.Future[int] = manager.loop.create_future()
    future.set_exception(ObjectLostError("the object is not on node b"))
    return future


def _owner_died_error(owner: bytes) -> str:
    return f"its owner {owner.hex()} died before the value existed"


# -- holds made before the primary was known ---------------------------------------------------


def test_placeholder_holds_move_to_the_primary_node_once_it_is_known(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        # Refs pickled before the value existed name their owner's node: this one.
        manager.add_holds(m.AddHolds([X], H1))
        manager.add_holds(m.AddHolds([X], H2))
        assert manager.store.stats()["num_placeholders"] == 1
        assert links.sent == []

        manager.add_holds(m.AddHolds([X], H3, B))  # the value turned out to live on B
        assert manager.store.stats()["num_placeholders"] == 0
        assert manager.remote.primary_of(X) == B and len(manager.remote) == 1
        assert links.sent == [(B, m.AddHolds([X], HERE))]  # one node-level hold for all three

        # Holds made later without a node go to B too (no new placeholder, nothing sent).
        manager.add_holds(m.AddHolds([X], H4))
        assert manager.store.stats()["num_placeholders"] == 0
        assert len(links.sent) == 1

        # H1 and H2 are held through B now: releasing them (and H3) leaves H4's hold ...
        for holder in (H1, H2, H3):
            manager.release_holds(m.ReleaseHolds([X], holder))
        assert len(links.sent) == 1 and manager.remote.primary_of(X) == B
        # ... and the last local holder's release drops the node's hold on B.
        manager.release_holds(m.ReleaseHolds([X], H4))
        assert links.sent[1:] == [(B, m.ReleaseHolds([X], HERE))]
        assert manager.remote.primary_of(X) is None and len(manager.remote) == 0
        assert manager.store.stats()["num_placeholders"] == 0

    asyncio.run(scenario())


# -- waits for an object a local owner has not made yet ----------------------------------------


def test_a_wait_for_a_value_its_local_owner_never_made_fails_when_the_owner_dies(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        manager.client_joined(OWNER)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(7, X, OWNER))
        # The owner is here: it will seal the value or say where it was placed.
        assert manager.awaited == {X: OWNER}
        assert manager.pulls == {} and manager.pulls_started == 0
        assert manager.unlocated == set() and links.sent == [] and waiter.sent == []

        manager.client_gone(OWNER, set())
        assert waiter.sent == [m.ObjectAvailable(7, b"", _owner_died_error(OWNER), True)]
        died = waiter.sent[0]
        assert isinstance(died, m.ObjectAvailable) and OWNER.hex() in died.error
        assert manager.awaited == {} and manager.store.stats()["num_waiters"] == 0

    asyncio.run(scenario())


def test_a_wait_is_woken_by_the_seal_and_the_owner_dying_later_sends_nothing(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        manager.client_joined(OWNER)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(7, X, OWNER))
        manager.seal(m.SealObject(X, 100, OWNER))
        assert waiter.sent == [m.ObjectAvailable(7, b"", "", False)]
        assert manager.awaited == {}

        manager.client_gone(OWNER, set())
        await asyncio.sleep(0)  # the collect the release scheduled frees X
        assert len(waiter.sent) == 1 and links.sent == []
        assert not manager.store.contains(X)

    asyncio.run(scenario())


# -- other nodes asking where an object is -----------------------------------------------------


def test_a_locate_is_answered_at_once_when_sealed_here_or_its_primary_is_known(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        asker = FakePeer()
        manager.seal(m.SealObject(X, 10, H1))
        manager.add_holds(m.AddHolds([Y], H1, B))
        manager.answer_locate(asker, m.LocateObject(1, X, OWNER))
        manager.answer_locate(asker, m.LocateObject(2, Y, OWNER))
        assert asker.sent == [m.ObjectLocated(1, X, HERE), m.ObjectLocated(2, Y, B)]
        assert manager.locating == {} and manager.awaited == {}

    asyncio.run(scenario())


def test_a_locate_for_a_live_local_owner_is_parked_until_the_value_is_sealed(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        manager.client_joined(OWNER)
        asker = FakePeer()
        manager.answer_locate(asker, m.LocateObject(1, X, OWNER))
        assert asker.sent == [] and manager.awaited == {X: OWNER}

        manager.seal(m.SealObject(X, 10, OWNER))
        assert asker.sent == [m.ObjectLocated(1, X, HERE)]
        assert manager.locating == {} and manager.awaited == {}

    asyncio.run(scenario())


def test_a_parked_locate_is_answered_when_the_primary_becomes_known(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        manager.client_joined(OWNER)
        asker = FakePeer()
        manager.answer_locate(asker, m.LocateObject(1, X, OWNER))
        manager.add_holds(m.AddHolds([X], OWNER, B))  # the owner's task put it on B
        assert asker.sent == [m.ObjectLocated(1, X, B)]
        assert manager.locating == {} and manager.awaited == {}
        assert manager.pulls == {}  # nobody waits for it here
        assert links.sent == [(B, m.AddHolds([X], HERE))]

    asyncio.run(scenario())


def test_a_parked_locate_fails_with_owner_died_when_the_owner_goes(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        manager.client_joined(OWNER)
        asker = FakePeer()
        manager.answer_locate(asker, m.LocateObject(1, X, OWNER))
        manager.client_gone(OWNER, set())
        assert asker.sent == [m.ObjectLocated(1, X, b"", _owner_died_error(OWNER),
                                              owner_died=True)]
        assert manager.locating == {} and manager.awaited == {}

    asyncio.run(scenario())


def test_a_locate_for_an_owner_already_gone_fails_with_owner_died(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        manager.client_joined(OWNER)
        manager.client_gone(OWNER, set())
        asker = FakePeer()
        manager.answer_locate(asker, m.LocateObject(1, X, OWNER))
        assert asker.sent == [m.ObjectLocated(1, X, b"", _owner_died_error(OWNER),
                                              owner_died=True)]
        assert manager.locating == {}

    asyncio.run(scenario())


def test_a_locate_for_an_unknown_owner_fails_without_owner_died(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        asker = FakePeer()
        manager.answer_locate(asker, m.LocateObject(1, X, OWNER))
        assert asker.sent == [m.ObjectLocated(1, X, b"", f"node {HERE.hex()} has no copy")]
        answer = asker.sent[0]  # nobody here knows whether it will ever exist
        assert isinstance(answer, m.ObjectLocated) and answer.owner_died is False
        assert manager.locating == {} and manager.awaited == {}

    asyncio.run(scenario())


# -- answers to our own questions --------------------------------------------------------------


@pytest.mark.parametrize("owner_died", [True, False])
def test_a_located_error_fails_the_waiters_carrying_owner_died(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner_died: bool) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        _record_pulls(manager, monkeypatch)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(5, X, OWNER, B))
        manager._pulled(X, B, _not_found(manager), 0.0)  # so we ask B where X is
        assert links.sent == [(B, m.LocateObject(1, X, OWNER))]

        manager.located(m.ObjectLocated(1, X, b"", "no such object", owner_died))
        assert waiter.sent == [m.ObjectAvailable(5, b"", "no such object", owner_died)]
        assert manager.asked == {} and manager.store.stats()["num_waiters"] == 0

    asyncio.run(scenario())


def test_a_located_node_is_pulled_from_and_answers_not_asked_for_are_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        started = _record_pulls(manager, monkeypatch)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(5, X, OWNER, B))
        assert started == [(X, B, ADDRESSES[B])] and manager.pulls == {X: B}
        manager._pulled(X, B, _not_found(manager), 0.0)
        assert manager.pulls == {} and manager.asked == {X: (B, OWNER, 1)}

        # Y is awaited here (its owner is ours), but we never asked anyone where it is.
        manager.client_joined(OWNER)
        other = FakePeer()
        manager.wait(other, set(), m.WaitObject(6, Y, OWNER))
        manager.located(m.ObjectLocated(9, Y, C))
        manager.located(m.ObjectLocated(10, Y, b"", "no such object", owner_died=True))
        assert len(started) == 1 and manager.pulls == {} and other.sent == []
        assert manager.asked == {X: (B, OWNER, 1)} and manager.awaited == {Y: OWNER}

        manager.located(m.ObjectLocated(1, X, C))
        assert started[1:] == [(X, C, ADDRESSES[C])] and manager.pulls == {X: C}
        assert manager.owners == {X: (OWNER, 1)}  # the ask counts for this wait
        manager.located(m.ObjectLocated(1, X, B))  # a second answer: the question is closed
        assert len(started) == 2 and manager.pulls == {X: C}
        assert waiter.sent == []

    asyncio.run(scenario())


# -- pulls that find nothing -------------------------------------------------------------------


def test_a_pull_that_finds_nothing_asks_the_node_pulled_from_at_most_max_asks_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        started = _record_pulls(manager, monkeypatch)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(5, X, OWNER, B))
        source = B
        for ask in range(1, MAX_ASKS + 1):
            manager._pulled(X, source, _not_found(manager), 0.0)
            assert links.sent[-1] == (source, m.LocateObject(ask, X, OWNER))
            source = C if source == B else B  # each answer names the other node
            manager.located(m.ObjectLocated(ask, X, source))
            assert started[-1] == (X, source, ADDRESSES[source])
        assert len(links.sent) == MAX_ASKS and waiter.sent == []

        manager._pulled(X, source, _not_found(manager), 0.0)  # asked enough: the wait fails
        assert len(links.sent) == MAX_ASKS
        assert waiter.sent == [m.ObjectAvailable(5, b"", "the object is not on node b")]
        assert manager.asked == {} and manager.owners == {} and manager.pulls == {}
        assert len(started) == MAX_ASKS + 1

    asyncio.run(scenario())


def test_a_pull_that_finds_nothing_without_an_owner_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        _record_pulls(manager, monkeypatch)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(5, X, b"", B))
        manager._pulled(X, B, _not_found(manager), 0.0)
        assert links.sent == [] and manager.asked == {}
        assert waiter.sent == [m.ObjectAvailable(5, b"", "the object is not on node b")]

    asyncio.run(scenario())


# -- releases forwarded to the node holding for us ---------------------------------------------


def test_releasing_a_holder_on_another_node_forwards_it_and_touches_nothing_here(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        manager.seal(m.SealObject(X, 10, H1))
        manager.add_holds(m.AddHolds([Y], H1, B))
        manager.release_holder(H1, B)
        assert links.sent == [(B, m.AddHolds([Y], HERE)), (B, m.ReleaseHolder(H1))]
        manager._collect()
        # H1's holds here (on X, and through B on Y) are untouched.
        assert manager.store.contains(X)
        assert manager.remote.primary_of(Y) == B and len(manager.remote) == 1
        assert len(links.sent) == 2

    asyncio.run(scenario())


def test_deleting_a_result_whose_refs_another_node_holds_releases_them_there(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        manager.seal(m.SealObject(X, 10, H1, holds_at=B))  # B holds the refs inside X
        assert manager.holds_at == {X: B}
        manager.release_holds(m.ReleaseHolds([X], H1))
        assert links.sent == []  # deleted only by the collect
        manager._collect()
        assert not manager.store.contains(X)
        assert links.sent == [(B, m.ReleaseHolder(X))]
        assert manager.holds_at == {}

    asyncio.run(scenario())


# -- regressions --------------------------------------------------------------------------------


def test_a_parked_locate_is_answered_when_a_pulled_copy_lands_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        _record_pulls(manager, monkeypatch)
        manager.client_joined(OWNER)
        manager.wait(FakePeer(), set(), m.WaitObject(1, X, OWNER, B))  # pulled from B
        asker = FakePeer()
        manager.answer_locate(asker, m.LocateObject(7, X, OWNER))  # asked meanwhile: parked
        assert asker.sent == []
        pulled: asyncio.Future[int] = manager.loop.create_future()
        pulled.set_result(10)
        manager._pulled(X, B, pulled, 0.0)
        assert asker.sent == [m.ObjectLocated(7, X, HERE)]
        manager.client_gone(OWNER, set())  # nothing more to say
        assert asker.sent == [m.ObjectLocated(7, X, HERE)] and manager.locating == {}

    asyncio.run(scenario())


def test_a_release_naming_a_node_not_known_here_yet_drops_the_hold_made_here(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        manager.add_holds(m.AddHolds([X], H1))  # before anyone said X lives on B
        manager.release_holds(m.ReleaseHolds([X], H1, B))  # H1 learned B meanwhile
        assert manager.store.stats()["num_placeholders"] == 0
        manager.add_holds(m.AddHolds([X], H2, B))
        manager.release_holds(m.ReleaseHolds([X], H2, B))
        assert len(manager.remote) == 0  # no stale H1 hold moved to B and kept there
        assert links.sent == [(B, m.AddHolds([X], HERE)), (B, m.ReleaseHolds([X], HERE))]

    asyncio.run(scenario())


def test_a_wait_on_a_dead_nodes_object_leaves_no_owner_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        manager.node_died(B, "killed")
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(1, X, OWNER, B))
        assert waiter.sent == [m.ObjectAvailable(1, b"", f"its node {B.hex()} is dead")]
        assert manager.owners == {}

    asyncio.run(scenario())


def test_copies_of_a_dead_nodes_objects_are_freed_once_unheld(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        for object_id in (X, Y):  # pulled from B: held here as copies
            manager.copy_of[object_id] = B
            manager.store.seal(object_id, 10, b"copy")
        manager.add_holds(m.AddHolds([Y], H1))  # a reader here still holds Y
        manager.node_died(B, "killed")
        manager._collect()
        assert not manager.store.contains(X) and manager.store.contains(Y)
        assert manager.copy_of == {}
        manager.release_holds(m.ReleaseHolds([Y], H1))
        manager._collect()
        assert not manager.store.contains(Y)

    asyncio.run(scenario())


def test_holds_learned_while_asking_where_start_no_second_pull(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        manager, links = _manager(tmp_path)
        started = _record_pulls(manager, monkeypatch)
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(1, X, OWNER, B))
        manager._pulled(X, B, _not_found(manager), 0.0)  # not there yet: B is asked where
        assert X in manager.asked and len(started) == 1
        manager.add_holds(m.AddHolds([X], H1, B))  # a borrower's hold naming B, meanwhile
        assert len(started) == 1 and waiter.sent == []  # the answer decides, not this hold
        (ask,) = [msg for _, msg in links.sent if isinstance(msg, m.LocateObject)]
        manager.located(m.ObjectLocated(ask.req_id, X, C))
        assert started[-1][:2] == (X, C)

    asyncio.run(scenario())


def test_an_object_lost_with_its_node_is_said_lost_to_those_asking_later(
        tmp_path: Path) -> None:
    # Its owner (here) lives on, so "not made yet" would keep the asker waiting forever.
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        manager.client_joined(OWNER)
        manager.add_holds(m.AddHolds([X], OWNER, B))  # made on B
        parked = FakePeer()
        manager.answer_locate(parked, m.LocateObject(1, X, OWNER))
        assert parked.sent == [m.ObjectLocated(1, X, B)]
        manager.node_died(B, "killed")
        later, waiter = FakePeer(), FakePeer()
        manager.answer_locate(later, m.LocateObject(2, X, OWNER))
        manager.wait(waiter, set(), m.WaitObject(3, X, OWNER))
        why = f"its node {B.hex()} died (killed)"
        assert later.sent == [m.ObjectLocated(2, X, b"", why)]
        assert waiter.sent == [m.ObjectAvailable(3, b"", why)]
        assert manager.awaited == {} and manager.locating == {}

    asyncio.run(scenario())


def test_a_copy_of_a_dead_nodes_object_becomes_the_primary_for_its_holders(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        manager.client_joined(OWNER)
        manager.add_holds(m.AddHolds([X, Y], OWNER, B))  # made on B, held through here
        manager.copy_of[X] = B  # X was pulled here
        manager.store.seal(X, 10, COPY)
        kept = manager.node_died(B, "killed")
        assert kept == [X] and manager.copy_of == {}
        manager._collect()
        assert manager.store.contains(X)  # held here by its owner now, not as a copy
        waiter = FakePeer()
        manager.wait(waiter, set(), m.WaitObject(1, Y, OWNER))  # Y had no copy here: lost
        assert waiter.sent == [m.ObjectAvailable(1, b"", f"its node {B.hex()} died (killed)")]
        manager.release_holds(m.ReleaseHolds([X], OWNER))
        manager._collect()
        assert not manager.store.contains(X)

    asyncio.run(scenario())


def _sealed(manager: ObjectManager, object_id: bytes, n_bytes: int, holder: bytes) -> None:
    """An object of about ``n_bytes`` written to shared memory and sealed here."""
    size = segment.write_segment(manager._segment(object_id), b"x" * n_bytes, [])
    manager.seal(m.SealObject(object_id, size, holder))


def _created(manager: ObjectManager, creator: bytes, object_id: bytes,
             n_bytes: int) -> FakePeer:
    peer = FakePeer()
    manager.create(peer, creator, m.CreateObject(7, object_id, n_bytes))
    return peer


def test_room_for_a_new_object_is_made_by_spilling_before_it_is_written(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        try:
            _sealed(manager, X, 600_000, H1)
            peer = _created(manager, H2, Y, 600_000)
            assert peer.sent == [m.ObjectCreated(7, free=(1 << 20) - 600_000)]
            assert manager.store.state(X) == "SPILLED"
            assert os.path.exists(manager._spill_file(X))
            assert manager.store.stats()["used_bytes"] == 600_000  # Y's room, reserved
            _sealed(manager, Y, 600_000, H2)
            used = manager.store.stats()["used_bytes"]
            assert 600_000 < used < 601_000  # Y itself (and its header), counted once
        finally:
            manager.shutdown(None)

    asyncio.run(scenario())


def test_a_spill_that_fails_keeps_the_object_and_the_new_one_fails_out_of_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(source: str, destination: str) -> None:
        with open(destination, "wb") as f:  # a partial copy, then the disk is full
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        try:
            _sealed(manager, X, 600_000, H1)
            monkeypatch.setattr(segment, "copy_file", no_space)
            peer = _created(manager, H2, Y, 600_000)
            (answer,) = peer.sent
            assert isinstance(answer, m.ObjectCreated) and answer.out_of_disk
            assert f"spilling to {tmp_path} failed" in answer.error
            assert "No space left on device" in answer.error
            assert manager.store.state(X) == "SEALED"  # kept where it was, readable
            assert os.path.exists(manager._segment(X))
            assert not os.path.exists(manager._spill_file(X))  # no partial copy left
            assert manager.store.stats()["used_bytes"] > 600_000
        finally:
            manager.shutdown(None)

    asyncio.run(scenario())


def test_a_new_object_waits_for_room_then_fails_saying_the_store_is_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "STORE_FULL_TIMEOUT", 0.05)

    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        try:
            granted = m.ObjectCreated(7, free=(1 << 20) - 600_000)  # and room left
            assert _created(manager, H1, X, 600_000).sent == [granted]
            waiting = _created(manager, H2, Y, 600_000)  # X's room is not spillable
            assert waiting.sent == []
            manager.client_gone(H1, set())  # X's creator left without writing it
            assert waiting.sent == [granted]
            late = _created(manager, H3, X, 600_000)
            await asyncio.sleep(0.2)
            (answer,) = late.sent
            assert isinstance(answer, m.ObjectCreated) and not answer.out_of_disk
            assert "has no room for 600000 bytes" in answer.error and "0.05 s" in answer.error
            too_big = _created(manager, H3, X, 2 << 20)
            (answer,) = too_big.sent
            assert "does not fit in the object store" in answer.error
            assert manager.creating == []
        finally:
            manager.shutdown(None)

    asyncio.run(scenario())


def test_a_creation_waiting_for_room_gets_it_once_the_object_ahead_is_sealed(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        try:
            assert _created(manager, H1, X, 600_000).sent  # granted: X's room is reserved
            waiting = _created(manager, H2, Y, 600_000)  # a reservation cannot be spilled
            assert waiting.sent == []
            _sealed(manager, X, 600_000, H1)  # sealed, X can be spilled: Y gets its room
            assert [msg.error for msg in waiting.sent] == [""]
            assert manager.store.state(X) == "SPILLED"
        finally:
            manager.shutdown(None)

    asyncio.run(scenario())


def test_a_creator_that_leaves_takes_what_it_wrote_with_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        try:
            assert _created(manager, H1, X, 600_000).sent  # granted
            waiting = _created(manager, H1, Y, 600_000)  # not granted
            assert waiting.sent == []
            for object_id in (X, Y):  # both written, neither sealed
                segment.write_segment(manager._segment(object_id), b"x" * 600_000, [])
            manager.client_gone(H1, set())
            assert not os.path.exists(manager._segment(X))
            assert not os.path.exists(manager._segment(Y))
            assert manager.store.stats()["used_bytes"] == 0
        finally:
            manager.shutdown(None)

    asyncio.run(scenario())


def test_room_released_in_the_same_turn_is_used_before_anything_is_spilled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(source: str, destination: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario() -> None:
        manager, _ = _manager(tmp_path)
        try:
            _sealed(manager, X, 600_000, H1)
            monkeypatch.setattr(segment, "copy_file", no_space)  # the disk is full
            manager.release_holds(m.ReleaseHolds([X], H1))  # freed, collected at turn's end
            waiting = _created(manager, H2, Y, 600_000)
            assert waiting.sent == []  # not "out of disk": X's room comes first
            manager._collect()
            assert [msg.error for msg in waiting.sent] == [""]
            assert not manager.store.contains(X)
        finally:
            manager.shutdown(None)

    asyncio.run(scenario())
