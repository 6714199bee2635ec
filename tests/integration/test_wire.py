"""Wire robustness: every listening socket demands proof of the token first and survives
bad frames."""

from __future__ import annotations

import socket
import struct

import msgspec
import pytest

import rtml
from rtml.rpc import messages as m
from rtml.rpc.auth import answer, challenge_of
from rtml.rpc.framing import FrameDecoder, frame


@rtml.remote
def plus_one(x: int) -> int:
    return x + 1


def _open(address: str) -> socket.socket:
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address[5:])
    else:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return sock


def _read_until_closed(sock: socket.socket) -> list[object]:
    """Every message the peer sends before it closes the connection."""
    decoder = FrameDecoder()
    messages: list[object] = []
    while True:
        data = sock.recv(65536)
        if not data:
            return messages
        messages += [m.decode(f) for f in decoder.feed(data)]


def _challenge(sock: socket.socket) -> m.Challenge:
    """The listener's first frame (alone: it waits for our Hello)."""
    (first,) = FrameDecoder().feed(sock.recv(65536))
    return challenge_of(m.decode(first))


def _addresses() -> list[str]:
    node = rtml.nodes()[0]
    head = rtml.driver._context.address_info["address"]  # type: ignore[union-attr]
    return [node["NodeManagerAddress"], head]


def _hello(sock: socket.socket, token: str, version: int = m.PROTOCOL_VERSION) -> bytes:
    """A Hello answering the Challenge ``sock`` received, proving ``token``."""
    hello = m.Hello(version, "driver", b"x" * 16, 1)
    return frame(m.encode(answer(_challenge(sock), token, hello)))


@pytest.mark.parametrize("which", [0, 1], ids=["node_manager", "head"])
def test_wrong_token_is_refused_and_the_daemon_keeps_serving(cluster: None, which: int) -> None:
    sock = _open(_addresses()[which])
    sock.sendall(_hello(sock, "not-the-token"))
    replies = _read_until_closed(sock)
    assert len(replies) == 1 and isinstance(replies[0], m.HelloReply)
    assert not replies[0].ok and "token" in replies[0].error
    assert rtml.get(plus_one.remote(1), timeout=60) == 2


@pytest.mark.parametrize("which", [0, 1], ids=["node_manager", "head"])
def test_wrong_protocol_version_is_refused(cluster: None, which: int) -> None:
    token = rtml.core.current.require_runtime().token
    sock = _open(_addresses()[which])
    sock.sendall(_hello(sock, token, version=m.PROTOCOL_VERSION + 99))
    replies = _read_until_closed(sock)
    assert not replies[0].ok and "protocol version" in replies[0].error  # type: ignore[attr-defined]


@pytest.mark.parametrize("payload", [
    struct.pack(">I", 0xFFFFFFF0) + b"x",        # oversized length prefix
    frame(b"\xc1\xc1\xc1"),                       # not msgpack
    frame(msgspec.msgpack.encode([10, "junk"])),  # a PushTask before Hello, wrong shape
    frame(m.encode(m.RequestLease(1, {"CPU": 1.0}))),  # well-formed, but not a Hello
], ids=["oversized", "garbage", "malformed", "no-hello"])
def test_bad_first_frame_closes_only_that_connection(cluster: None, payload: bytes) -> None:
    for address in _addresses():
        sock = _open(address)
        _challenge(sock)
        sock.sendall(payload)
        assert all(isinstance(r, m.HelloReply) and not r.ok for r in _read_until_closed(sock))
    assert rtml.get(plus_one.remote(41), timeout=60) == 42


def test_bad_frame_after_a_good_hello_closes_the_connection(cluster: None) -> None:
    token = rtml.core.current.require_runtime().token
    sock = _open(_addresses()[0])
    sock.sendall(_hello(sock, token))
    sock.sendall(frame(b"\xc1 definitely not msgpack"))
    replies = _read_until_closed(sock)
    assert isinstance(replies[0], m.HelloReply) and replies[0].ok
    assert rtml.get(plus_one.remote(2), timeout=60) == 3
