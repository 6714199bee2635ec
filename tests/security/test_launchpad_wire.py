"""Launchpad's wire (issue 17, items 5 and 7): both ends prove the program token without
sending it; idle connections cannot pile up threads or keep a caller out; the accept loop
outlives a failure; a frame's announced size allocates nothing; a frame that does not
unpickle closes its connection. Made against a real courier server on loopback."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from rtml.launchpad import wire
from rtml.launchpad.courier import CourierServer

TOKEN = "program-" + os.urandom(8).hex()


class Adder:
    def add(self, a: int, b: int) -> int:
        return a + b


@pytest.fixture
def server() -> Iterator[CourierServer]:
    courier = CourierServer(Adder(), "adder", "127.0.0.1", TOKEN)
    yield courier
    courier.close()


def _call(address: str, token: str = TOKEN) -> int:
    sock = wire.connect(address, token)
    try:
        wire.send_obj(sock, (1, "add", (40, 2), {}))
        req_id, ok, value = wire.recv_obj(sock)
        assert (req_id, ok) == (1, True)
        return int(value)
    finally:
        sock.close()


def _authenticated(address: str) -> socket.socket:
    sock = wire.connect(address, TOKEN)
    sock.settimeout(10)
    return sock


def test_only_a_token_holder_is_admitted_and_the_token_never_travels(
        server: CourierServer) -> None:
    assert _call(server.address) == 42
    with pytest.raises(OSError):  # refused: closed before any reply
        _call(server.address, "not-the-token")
    fake = socket.create_server(("127.0.0.1", 0))  # an impostor that lacks the token
    received = bytearray()

    def impostor() -> None:
        conn, _ = fake.accept()
        conn.sendall(os.urandom(16))
        while len(received) < 48:
            received.extend(conn.recv(64))
        conn.sendall(os.urandom(32))
        conn.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(wire.WireError, match="did not prove it holds the program's token"):
        wire.connect(f"127.0.0.1:{fake.getsockname()[1]}", TOKEN)
    thread.join(5)
    fake.close()
    assert len(received) == 48 and TOKEN.encode() not in bytes(received)
    assert _call(server.address) == 42


def test_idle_connections_neither_pile_up_threads_nor_keep_a_caller_out(
        server: CourierServer) -> None:
    me = psutil.Process()
    before = me.num_threads()
    idle = []
    for _ in range(1000):
        idle.append(socket.create_connection(("127.0.0.1", int(server.address.split(":")[1]))))
    time.sleep(0.5)
    assert me.num_threads() - before <= wire.MAX_PENDING_PER_PEER + 8
    started = time.monotonic()
    assert _call(server.address) == 42  # while the 1,000 are held
    assert time.monotonic() - started < wire.HELLO_TIMEOUT
    for sock in idle:
        sock.close()


def test_the_accept_loop_outlives_a_thread_that_cannot_start(
        server: CourierServer, monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = threading.Thread.start
    failures = [0]

    def start_once_failing(thread: threading.Thread) -> None:
        if thread.name.startswith("lp-adder") and not failures[0]:
            failures[0] += 1
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_failing)
    first = socket.create_connection(("127.0.0.1", int(server.address.split(":")[1])))
    first.settimeout(5)
    assert first.recv(64) == b""  # that one was dropped
    first.close()
    assert failures == [1]
    assert _call(server.address) == 42  # and the next is served


def test_an_announced_size_allocates_nothing_and_a_bad_pickle_closes_the_connection(
        server: CourierServer) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    liars = [_authenticated(server.address) for _ in range(8)]
    for sock in liars:  # 1 GiB announced, 1 KiB sent
        sock.sendall(struct.pack(">I", wire.MAX_FRAME) + b"x" * 1024)
    time.sleep(0.3)
    assert me.memory_info().rss - before < 64 << 20
    for sock in liars:
        sock.close()
    bad = _authenticated(server.address)
    payload = pickle.dumps(("not", "a", "call"))[:-3] + b"junk"
    bad.sendall(struct.pack(">I", len(payload)) + payload)
    assert bad.recv(64) == b""  # closed
    bad.close()
    assert _call(server.address) == 42
