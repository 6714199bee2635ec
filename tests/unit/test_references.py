"""ReferenceCounter.process_refops: the holds and releases a batch of changes sends.

The counter is a real runtime's, connected to stand-ins for its node manager and head
service on Unix sockets: each answers the handshake, and the node manager's end is then
read by the test (and answers, for a fence). Redis is never reached (its client connects
on first use, and nothing here writes to it).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rtml.core.references import ReferenceCounter
from rtml.core.runtime import ClientConfig, ClientRuntime
from rtml.rpc import messages as m
from rtml.rpc.auth import challenge, check_hello, sign
from rtml.rpc.framing import FrameDecoder, frame

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


def _answer_hello(listener: socket.socket, token: str, reply: m.HelloReply
                  ) -> socket.socket:
    """Accept one connection, run the listener's side of the handshake for ``token``,
    answering ``reply``; the connection."""
    conn, _ = listener.accept()
    sent = challenge()
    conn.sendall(frame(m.encode(sent)))
    decoder = FrameDecoder()
    while not (frames := decoder.feed(conn.recv(65536))):
        pass
    hello = check_hello(m.decode(frames[0]), token, sent)
    conn.sendall(frame(m.encode(sign(reply, token, hello, sent))))
    return conn


def stand_ins(tmp_path: Path, token: str = "t"
              ) -> tuple[str, str, Callable[[], list[socket.socket]]]:
    """Addresses of a node manager and a head that answer one handshake each, and a
    function returning their ends of the connections once both answered."""
    listeners = []
    for name in ("nm", "head"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / f"{name}.sock"))
        listener.listen(1)
        listeners.append(listener)
    ends: list[socket.socket] = []

    def serve() -> None:
        ends.append(_answer_hello(listeners[0], token, m.HelloReply(
            ok=True, node_id=b"n" * 16, info={"store_dir": str(tmp_path), "node_ip": "127.0.0.1"})))
        ends.append(_answer_hello(listeners[1], token, m.HelloReply(
            ok=True, info={"redis_host": "127.0.0.1", "redis_port": "9"})))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def connections() -> list[socket.socket]:
        thread.join(10)
        for listener in listeners:
            listener.close()
        return ends

    return f"unix:{tmp_path}/nm.sock", f"unix:{tmp_path}/head.sock", connections


@pytest.fixture
def counter(tmp_path: Path) -> Iterator[tuple[ReferenceCounter, NodeManager]]:
    nm_address, head_address, connections = stand_ins(tmp_path)
    runtime = ClientRuntime(ClientConfig(role="driver", token="t", nm_address=nm_address,
                                         head_address=head_address,
                                         session_dir=str(tmp_path), client_id=ME))
    nm_end, head_end = connections()
    yield runtime.refs, NodeManager(nm_end)
    runtime.close()
    nm_end.close()
    head_end.close()


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
