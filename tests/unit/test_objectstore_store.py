"""The sans-I/O store core: holds, deferred deletion, cascades, LRU spilling, waiters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rtml.objectstore import Delete, NotifyLost, NotifyReady, Restore, Spill, StoreCore
from rtml.objectstore.store import RESTORING, SEALED, SPILLED

A, B, C, D = b"obj-a", b"obj-b", b"obj-c", b"obj-d"
CLIENT, OTHER = b"client-1", b"client-2"


def test_seal_hold_release_collect_lifecycle() -> None:
    store = StoreCore(capacity=1000)
    assert store.seal(A, 100, CLIENT) == []
    assert store.contains(A) and store.state(A) == SEALED
    store.add_holds([A], OTHER)
    assert store.release_holds([A], CLIENT) == []
    assert store.collect() == []  # OTHER still holds it
    store.release_holds([A], OTHER)
    assert store.contains(A)  # deletion waits for collect
    assert store.collect() == [Delete(A, spilled=False)]
    assert not store.contains(A) and store.state(A) is None
    assert store.stats()["used_bytes"] == 0
    assert store.collect() == []


def test_hold_arriving_before_collect_wins() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 10, CLIENT)
    store.release_holder(CLIENT)
    store.add_holds([A], OTHER)  # same loop turn as the release
    assert store.collect() == []
    assert store.contains(A)


def test_releasing_an_unknown_hold_is_a_noop() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 10, CLIENT)
    store.release_holds([A, B], OTHER)
    store.release_holder(b"nobody")
    assert store.collect() == [] and store.contains(A)


def test_holds_arriving_before_seal_are_kept() -> None:
    store = StoreCore(capacity=1000)
    store.add_holds([A], OTHER)
    assert not store.contains(A) and store.state(A) is None
    assert store.collect() == []  # a placeholder is never deleted
    store.seal(A, 10, CLIENT)
    store.release_holder(CLIENT)
    assert store.collect() == []  # OTHER's early hold keeps it
    store.release_holder(OTHER)
    assert store.collect() == [Delete(A, spilled=False)]


def test_placeholder_released_before_seal_is_dropped() -> None:
    store = StoreCore(capacity=1000)
    store.add_holds([A], OTHER)
    store.release_holds([A], OTHER)
    assert store.collect() == []
    store.seal(A, 10, CLIENT)
    assert store.stats()["num_objects"] == 1


def test_cascade_release_through_containers() -> None:
    store = StoreCore(capacity=1000)
    store.seal(B, 10, CLIENT)
    store.seal(C, 10, CLIENT)
    store.seal(D, 10, CLIENT)
    store.seal(A, 10, CLIENT)
    store.add_holds([B, C], A)  # A's value holds refs to B and C
    store.add_holds([D], B)  # B holds D
    store.release_holds([B, C, D], CLIENT)
    assert store.collect() == []  # all reachable from A
    store.release_holds([A], CLIENT)
    deleted = [c.object_id for c in store.collect()]
    assert deleted[0] == A and sorted(deleted) == sorted([A, B, C, D])
    assert store.stats()["num_objects"] == 0 and store.stats()["used_bytes"] == 0


def test_cascade_spares_objects_with_other_holders() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 10, CLIENT)
    store.seal(B, 10, OTHER)
    store.add_holds([B], A)
    store.release_holder(CLIENT)
    assert store.collect() == [Delete(A, spilled=False)]
    assert store.contains(B)


def test_lru_spill_order_when_over_capacity() -> None:
    store = StoreCore(capacity=300)
    for oid in (A, B, C):
        store.seal(oid, 100, CLIENT)
    store.touch(A)  # B is now the least recently used, then C
    assert store.seal(D, 150, CLIENT) == [Spill(B, 100), Spill(C, 100)]
    assert store.state(B) == SPILLED and store.state(C) == SPILLED
    assert store.state(A) == SEALED and store.state(D) == SEALED
    assert store.stats()["used_bytes"] == 250


def test_wait_on_sealed_counts_as_access() -> None:
    store = StoreCore(capacity=200)
    store.seal(A, 100, CLIENT)
    store.seal(B, 100, CLIENT)
    assert store.wait(A, 7) == [NotifyReady(A, (7,))]
    assert store.seal(C, 100, CLIENT) == [Spill(B, 100)]


def test_object_bigger_than_capacity_is_kept() -> None:
    store = StoreCore(capacity=100)
    store.seal(A, 50, CLIENT)
    assert store.seal(B, 500, CLIENT) == [Spill(A, 50)]
    assert store.state(B) == SEALED and store.stats()["used_bytes"] == 500


def test_spilled_confirmation_does_not_double_count() -> None:
    store = StoreCore(capacity=100)
    store.seal(A, 80, CLIENT)
    store.seal(B, 80, CLIENT)  # spills A
    store.spilled(A)
    assert store.stats()["used_bytes"] == 80
    store.spilled(B)  # a spill the shell did on its own
    assert store.state(B) == SPILLED and store.stats()["used_bytes"] == 0


def test_wait_on_spilled_restores_after_making_room() -> None:
    store = StoreCore(capacity=200)
    store.seal(A, 100, CLIENT)
    store.seal(B, 100, CLIENT)
    store.seal(C, 100, CLIENT)  # spills A
    store.spilled(A)
    assert store.wait(A, 1) == [Spill(B, 100), Restore(A, 100)]
    assert store.wait(A, 2) == []  # already restoring: no second Restore
    assert store.stats()["num_waiters"] == 2
    assert store.restored(A) == [NotifyReady(A, (1, 2))]
    assert store.state(A) == SEALED and store.state(B) == SPILLED
    assert store.stats()["used_bytes"] == 200 and store.stats()["num_waiters"] == 0


def test_wait_on_spilled_with_room_just_restores() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 100, CLIENT)
    store.spilled(A)
    assert store.wait(A, 1) == [Restore(A, 100)]
    assert store.restored(A) == [NotifyReady(A, (1,))]


def test_restoring_object_is_deleted_only_after_restored() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 100, CLIENT)
    store.spilled(A)
    store.wait(A, 1)
    store.release_holder(CLIENT)
    assert store.collect() == []
    store.restored(A)
    assert store.collect() == [Delete(A, spilled=False)]


def test_delete_of_spilled_object_says_so() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 100, CLIENT)
    store.spilled(A)
    store.release_holder(CLIENT)
    assert store.collect() == [Delete(A, spilled=True)]


def test_waiters_on_unknown_object_woken_by_seal() -> None:
    store = StoreCore(capacity=1000)
    assert store.wait(A, 1) == []
    assert store.wait(A, 2) == []
    store.cancel_waiter(2)
    assert store.stats()["num_waiters"] == 1 and not store.contains(A)
    assert store.seal(A, 10, CLIENT) == [NotifyReady(A, (1,))]
    assert store.stats()["num_waiters"] == 0


def test_cancelled_only_waiter_drops_placeholder() -> None:
    store = StoreCore(capacity=1000)
    store.wait(A, 1)
    store.cancel_waiter(1)
    assert store.stats() == {
        "num_objects": 0,
        "num_placeholders": 0,
        "used_bytes": 0,
        "capacity": 1000,
        "num_spilled": 0,
        "spilled_bytes": 0,
        "num_waiters": 0,
    }


def test_lost_notifies_waiters_and_releases_nested() -> None:
    store = StoreCore(capacity=1000)
    store.seal(B, 10, A)  # B is held only by container A
    store.seal(A, 100, CLIENT)
    store.spilled(A)
    store.wait(A, 3)
    assert store.lost(A, "spill file missing") == [
        Delete(A, spilled=True),
        NotifyLost(A, (3,), "spill file missing"),
    ]
    assert store.collect() == [Delete(B, spilled=False)]


def test_stats_values() -> None:
    store = StoreCore(capacity=250)
    store.seal(A, 100, CLIENT)
    store.seal(B, 100, CLIENT)
    store.seal(C, 100, CLIENT)  # spills A
    store.wait(D, 9)
    assert store.stats() == {
        "num_objects": 3,
        "num_placeholders": 1,  # D: awaited, not sealed
        "used_bytes": 200,
        "capacity": 250,
        "num_spilled": 1,
        "spilled_bytes": 100,
        "num_waiters": 1,
    }


# ---- property ---------------------------------------------------------------------

OIDS = [b"o%d" % i for i in range(6)]
CLIENTS = [b"c0", b"c1"]
HOLDERS = CLIENTS + OIDS  # objects can be containers of other objects

_ops = st.one_of(
    st.tuples(
        st.just("seal"), st.sampled_from(OIDS), st.integers(1, 120), st.sampled_from(CLIENTS)
    ),
    st.tuples(
        st.just("add"), st.lists(st.sampled_from(OIDS), max_size=3), st.sampled_from(HOLDERS)
    ),
    st.tuples(
        st.just("release"), st.lists(st.sampled_from(OIDS), max_size=3), st.sampled_from(HOLDERS)
    ),
    st.tuples(st.just("release_holder"), st.sampled_from(HOLDERS)),
    st.tuples(st.just("touch"), st.sampled_from(OIDS)),
    st.tuples(
        st.just("collect"),
    ),
    st.tuples(st.just("wait"), st.sampled_from(OIDS), st.integers(0, 3)),
    st.tuples(st.just("restored"), st.sampled_from(OIDS)),
    st.tuples(st.just("spilled"), st.sampled_from(OIDS)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ops, max_size=60))
def test_accounting_and_no_held_object_is_deleted(ops: list[tuple]) -> None:
    """``used_bytes`` is the size of what is in shm (SEALED, or RESTORING with its
    room reserved; with no waits that is exactly the SEALED objects), and only
    objects without holders are ever deleted."""
    store = StoreCore(capacity=250)
    holders: dict[bytes, set[bytes]] = {}  # model: object -> holders
    sizes: dict[bytes, int] = {}
    early: set[tuple[bytes, bytes]] = set()  # released before the seal naming the holder
    for op in ops:
        commands = _apply(store, op, holders, sizes, early)
        for command in commands:
            if isinstance(command, Delete):
                assert not holders.get(command.object_id), "deleted an object with holders"
                holders.pop(command.object_id, None)
                del sizes[command.object_id]
                for held in holders.values():  # the cascade
                    held.discard(command.object_id)
        in_shm = sum(sizes[o] for o in sizes if store.state(o) in (SEALED, RESTORING))
        assert store.stats()["used_bytes"] == in_shm
        assert all(store.contains(o) for o in sizes)


def _apply(
    store: StoreCore, op: tuple, holders: dict[bytes, set[bytes]], sizes: dict[bytes, int],
    early: set[tuple[bytes, bytes]],
) -> list:
    kind = op[0]
    if kind == "seal":
        _, oid, size, client = op
        if (oid, client) in early:  # its holder let go of it before the seal came
            early.discard((oid, client))
        else:
            holders.setdefault(oid, set()).add(client)
        sizes.setdefault(oid, size)
        return store.seal(oid, size, client)
    if kind == "add":
        for oid in op[1]:
            holders.setdefault(oid, set()).add(op[2])
            early.discard((oid, op[2]))
        return store.add_holds(op[1], op[2])
    if kind == "release":
        for oid in op[1]:
            if op[2] not in holders.get(oid, set()) and oid not in sizes:
                early.add((oid, op[2]))
            holders.get(oid, set()).discard(op[2])
        return store.release_holds(op[1], op[2])
    if kind == "release_holder":
        for held in holders.values():
            held.discard(op[1])
        return store.release_holder(op[1])
    if kind == "touch":
        store.touch(op[1])
        return []
    if kind == "wait":
        return store.wait(op[1], op[2])
    if kind == "restored":
        return store.restored(op[1])
    if kind == "spilled":
        store.spilled(op[1])
        return []
    return store.collect()


def test_public_interface_does_not_drift() -> None:
    import importlib

    import rtml.objectstore as objectstore

    modules = ["private", "remote", "segment", "store", "transfer"]
    assert sorted(objectstore.__all__) == sorted(
        [
            *modules,
            "segment_path",
            "spill_path",
            "write_segment",
            "read_segment",
            "copy_file",
            "check_store_dir",
            "create_store_dir",
            "existing_size",
            "open_private",
            "remove_store_dir",
            "store_dir_of",
            "store_dirs",
            "StoreCore",
            "Spill",
            "Restore",
            "Delete",
            "NotifyReady",
            "NotifyLost",
        ]
    )
    for name in objectstore.__all__:
        if name in modules:
            importlib.import_module(f"rtml.objectstore.{name}")
        assert hasattr(objectstore, name), name


def test_seal_without_holder_is_freed_by_collect_unless_held() -> None:
    core = StoreCore(capacity=1000)
    core.seal(b"lonely", 10, b"")
    core.add_holds([b"kept"], b"borrower")
    core.seal(b"kept", 10, b"")
    deleted = [c.object_id for c in core.collect() if isinstance(c, Delete)]
    assert deleted == [b"lonely"]
    assert core.contains(b"kept") and not core.contains(b"lonely")


def test_take_holds_moves_a_placeholders_holders_out_and_keeps_its_waiters() -> None:
    store = StoreCore(capacity=1000)
    store.add_holds([A], CLIENT)
    store.add_holds([A], b"container")
    store.wait(A, 1)
    assert store.stats()["num_placeholders"] == 1
    assert store.take_holds(A) == {CLIENT, b"container"}
    assert store.take_holds(A) == set()
    assert store.waiting_on(A)  # still awaited here: woken when pulled and sealed
    store.release_holder(CLIENT)  # its holds are elsewhere now: nothing here to release
    assert store.seal(A, 10, b"copy") == [NotifyReady(A, (1,))]
    store.release_holds([A], b"copy")
    assert store.collect() == [Delete(A, spilled=False)]


def test_take_holds_leaves_a_sealed_object_alone() -> None:
    store = StoreCore(capacity=1000)
    store.seal(A, 10, CLIENT)
    assert store.take_holds(A) == set()
    store.add_holds([B], CLIENT)
    assert store.take_holds(B) == {CLIENT}
    assert store.stats()["num_placeholders"] == 0  # nothing held it or waited: gone
    store.release_holder(CLIENT)
    assert store.collect() == [Delete(A, spilled=False)]


def test_a_release_that_overtakes_its_seal_is_not_undone_by_it() -> None:
    # A worker seals its result for the owner on one connection; the owner, done with
    # it, releases on another: the release may come first.
    store = StoreCore(capacity=1000)
    store.release_holds([A], CLIENT)
    store.seal(A, 10, CLIENT)
    assert store.collect() == [Delete(A, spilled=False)]
    # Released early, then held again (a new borrow): the seal then holds it.
    store.release_holds([B], CLIENT)
    store.add_holds([B], CLIENT)
    store.seal(B, 10, CLIENT)
    assert store.collect() == []
    store.release_holds([B], CLIENT)
    assert store.collect() == [Delete(B, spilled=False)]
    # A release of a sealed object's unknown hold remembers nothing.
    store.seal(C, 10, OTHER)
    store.release_holds([C], CLIENT)
    store.release_holds([C], OTHER)
    assert store.collect() == [Delete(C, spilled=False)]
    store.seal(C, 10, CLIENT)  # (sealed again: a retried task's result)
    assert store.collect() == []


def test_room_reserved_for_a_creation_is_counted_once_and_given_back_if_unsealed() -> None:
    store = StoreCore(capacity=300)
    store.seal(A, 100, CLIENT)
    assert store.make_room(250) == [Spill(A, 100)]  # LRU spilled before the new object
    assert store.reserve(B, 250, CLIENT)
    assert not store.reserve(C, 100, OTHER)  # 250 reserved + 100 > 300, nothing to spill
    assert store.stats()["used_bytes"] == 250
    store.seal(B, 240, CLIENT)  # its reservation becomes the object (a little smaller)
    assert store.stats()["used_bytes"] == 240
    assert store.reserve(C, 50, OTHER)
    store.unreserve(OTHER)  # its creator left before writing it
    assert store.stats()["used_bytes"] == 240
    assert store.reserve(B, 250, OTHER)  # B exists already: a retried task's return
    assert store.stats()["used_bytes"] == 240


def test_an_object_whose_spill_failed_stays_sealed_and_counted() -> None:
    store = StoreCore(capacity=200)
    store.seal(A, 100, CLIENT)
    store.seal(B, 100, CLIENT)
    assert store.make_room(100) == [Spill(A, 100)]
    store.spill_failed(A)  # the shell could not write it to disk
    assert store.state(A) == SEALED and store.stats()["used_bytes"] == 200
    assert not store.reserve(C, 100, CLIENT)
    assert store.make_room(100) == [Spill(B, 100)]  # A was just put back: spilled last
    assert store.wait(A, 1) == [NotifyReady(A, (1,))]


def test_has_candidates_says_whether_collect_would_delete_something() -> None:
    store = StoreCore(capacity=300)
    store.seal(A, 100, CLIENT)
    store.seal(B, 100, CLIENT)
    store.add_holds([B], OTHER)
    assert not store.has_candidates()
    store.release_holds([A, B], CLIENT)  # B is still held by OTHER
    assert store.has_candidates()
    assert store.collect() == [Delete(A, spilled=False)]
    assert not store.has_candidates()
