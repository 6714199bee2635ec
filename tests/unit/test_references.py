"""ReferenceCounter.process_refops: the holds and releases a batch of changes sends.

The counter talks to its node manager through ``runtime.nm.send``; here that is a
list, and the runtime a stand-in with the few fields the counter reads.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from rtml.core.memory_store import MemoryStore
from rtml.core.references import ReferenceCounter
from rtml.rpc import messages as m

ME = b"c" * 16
X = b"x" * 20


def _counter(request: Any = None) -> tuple[ReferenceCounter, list[Any]]:
    sent: list[Any] = []
    runtime = SimpleNamespace(
        nm=SimpleNamespace(send=sent.append), node_id=b"n" * 16, client_id=ME,
        store=MemoryStore(), submitter=SimpleNamespace(records={}), lock=threading.RLock(),
        request=request)
    return ReferenceCounter(runtime), sent  # type: ignore[arg-type]


def _holds(sent: list[Any]) -> list[tuple[str, list[bytes]]]:
    return [(type(msg).__name__, msg.object_ids) for msg in sent
            if isinstance(msg, (m.AddHolds, m.ReleaseHolds))]


def test_a_borrow_is_held_once_and_released_when_the_last_ref_goes() -> None:
    refs, sent = _counter()
    refs.refops.extend([(X, 1), (X, 0), (X, 1), (X, 0)])  # two refs unpickled
    refs.process_refops()
    assert _holds(sent) == [("AddHolds", [X])]
    refs.refops.extend([(X, -1)])
    refs.process_refops()
    assert _holds(sent) == [("AddHolds", [X])]  # one ref left
    refs.refops.extend([(X, -1)])
    refs.process_refops()
    assert _holds(sent) == [("AddHolds", [X]), ("ReleaseHolds", [X])]


def test_dropping_and_borrowing_again_in_one_batch_keeps_the_hold() -> None:
    # The last ref dropped, then the object unpickled again, before the batch is applied:
    # sent as add-then-release, the node manager (a set of holders) would drop the hold.
    refs, sent = _counter()
    refs.refops.extend([(X, 1), (X, 0)])
    refs.process_refops()
    sent.clear()
    refs.refops.extend([(X, -1), (X, 1), (X, 0)])
    refs.process_refops()
    assert _holds(sent) == []
    refs.refops.extend([(X, -1)])
    refs.process_refops()
    assert _holds(sent) == [("ReleaseHolds", [X])]


def test_a_borrow_dropped_within_its_batch_sends_nothing() -> None:
    refs, sent = _counter()
    refs.refops.extend([(X, 1), (X, 0), (X, -1)])
    refs.process_refops()
    assert _holds(sent) == []


def test_a_result_waits_for_a_fence_under_way_on_another_thread() -> None:
    # Another call's fence may cover holds this call sent before it: settle() waits for
    # it, and needs_fence() (what an async actor's call checks) reports it.
    entered, answer = threading.Event(), threading.Event()

    def request(conn: Any, make: Any) -> None:  # the fence's reply, held back
        entered.set()
        answer.wait(10)

    refs, _ = _counter(request)
    refs.locations[X] = b"o" * 16  # an object whose primary copy is on another node
    refs.send_holds(m.AddHolds, [X], ME)
    fencer = threading.Thread(target=refs.fence)
    fencer.start()
    assert entered.wait(10)
    assert refs.needs_fence()  # nothing left unconfirmed to send, but a fence runs
    settled = threading.Event()

    def settle() -> None:
        refs.settle()
        settled.set()

    waiter = threading.Thread(target=settle)
    waiter.start()
    assert not settled.wait(0.3)
    answer.set()
    assert settled.wait(10)
    fencer.join(10)
    waiter.join(10)
    assert not refs.needs_fence()
