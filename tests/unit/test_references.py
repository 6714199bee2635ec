"""ReferenceCounter.process_refops: the holds and releases a batch of changes sends.

The counter is a real, unconnected runtime's; its node manager is the far end of a
socketpair, whose frames the test reads (and answers, for a fence).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rtml.core.references import ReferenceCounter
from rtml.core.runtime import ClientConfig, ClientRuntime
from rtml.rpc import messages as m
from rtml.rpc.framing import FrameDecoder, frame
from rtml.rpc.reactor import Connection

ME = b"c" * 16
X = b"x" * 20


class NodeManager:
    """The far end of the runtime's connection: reads what the counter sends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = FrameDecoder()
        self.sent: list[Any] = []

    def read(self) -> list[Any]:
        """Every message sent so far (a refops batch is sent before process_refops returns)."""
        self.sock.setblocking(False)
        try:
            while data := self.sock.recv(65536):
                self.sent.extend(m.decode(f) for f in self.decoder.feed(data))
        except BlockingIOError:
            pass
        return self.sent

    def next_message(self) -> Any:
        self.sock.setblocking(True)
        self.sock.settimeout(10)
        while not self.sent:
            self.sent.extend(m.decode(f) for f in self.decoder.feed(self.sock.recv(65536)))
        return self.sent.pop(0)

    def reply(self, msg: m.Msg) -> None:
        self.sock.sendall(frame(m.encode(msg)))


@pytest.fixture
def counter() -> Iterator[tuple[ReferenceCounter, NodeManager]]:
    runtime = ClientRuntime(ClientConfig(role="driver", token="t", nm_address="",
                                         head_address="", session_dir="", client_id=ME))
    ours, theirs = socket.socketpair()
    runtime.reactor.start()
    runtime.node_id = b"n" * 16
    runtime.nm = runtime.reactor.add(Connection(runtime.reactor, ours,
                                                runtime._on_nm_message, name="nm"))
    yield runtime.refs, NodeManager(theirs)
    runtime.close()
    theirs.close()


def _holds(nm: NodeManager) -> list[tuple[str, list[bytes]]]:
    return [(type(msg).__name__, msg.object_ids) for msg in nm.read()
            if isinstance(msg, (m.AddHolds, m.ReleaseHolds))]


def test_a_borrow_is_held_once_and_released_when_the_last_ref_goes(counter: tuple[ReferenceCounter, NodeManager]) -> None:
    refs, nm = counter
    refs.refops.extend([(X, 1), (X, 0), (X, 1), (X, 0)])  # two refs unpickled
    refs.process_refops()
    assert _holds(nm) == [("AddHolds", [X])]
    refs.refops.extend([(X, -1)])
    refs.process_refops()
    assert _holds(nm) == [("AddHolds", [X])]  # one ref left
    refs.refops.extend([(X, -1)])
    refs.process_refops()
    assert _holds(nm) == [("AddHolds", [X]), ("ReleaseHolds", [X])]


def test_dropping_and_borrowing_again_in_one_batch_keeps_the_hold(counter: tuple[ReferenceCounter, NodeManager]) -> None:
    # The last ref dropped, then the object unpickled again, before the batch is applied:
    # sent as add-then-release, the node manager (a set of holders) would drop the hold.
    refs, nm = counter
    refs.refops.extend([(X, 1), (X, 0)])
    refs.process_refops()
    nm.read().clear()  # what the first batch sent
    refs.refops.extend([(X, -1), (X, 1), (X, 0)])
    refs.process_refops()
    assert _holds(nm) == []
    refs.refops.extend([(X, -1)])
    refs.process_refops()
    assert _holds(nm) == [("ReleaseHolds", [X])]


def test_a_borrow_dropped_within_its_batch_sends_nothing(counter: tuple[ReferenceCounter, NodeManager]) -> None:
    refs, nm = counter
    refs.refops.extend([(X, 1), (X, 0), (X, -1)])
    refs.process_refops()
    assert _holds(nm) == []


def test_a_result_waits_for_a_fence_under_way_on_another_thread(counter: tuple[ReferenceCounter, NodeManager]) -> None:
    # Another call's fence may cover holds this call sent before it: settle() waits for
    # it, and needs_fence() (what an async actor's call checks) reports it.
    refs, nm = counter
    refs.locations[X] = b"o" * 16  # an object whose primary copy is on another node
    refs.send_holds(m.AddHolds, [X], ME)
    assert nm.next_message() == m.AddHolds([X], ME, b"o" * 16)
    fencer = threading.Thread(target=refs.fence)
    fencer.start()
    fence = nm.next_message()  # its reply held back until the end
    assert fence == m.FenceHolds(fence.req_id, [b"o" * 16])
    assert refs.needs_fence()  # nothing left unconfirmed to send, but a fence runs
    settled = threading.Event()

    def settle() -> None:
        refs.settle()
        settled.set()

    waiter = threading.Thread(target=settle)
    waiter.start()
    assert not settled.wait(0.3)
    nm.reply(m.HoldsFenced(fence.req_id))
    assert settled.wait(10)
    fencer.join(10)
    waiter.join(10)
    assert not refs.needs_fence()
