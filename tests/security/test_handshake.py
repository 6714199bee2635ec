"""A handshake that proves both sides and cannot be replayed (issue 17, item 5): the token
never crosses the wire; a captured handshake opens nothing; a client refuses a listener
that does not hold the token (an impostor's socket); the join hint keeps the token out of
every command line."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import rtml
from rtml.core import current
from rtml.core.runtime import ClientConfig, ClientRuntime
from rtml.exceptions import ProtocolError, RtmlSystemError
from rtml.ids import random_id
from rtml.objectstore.transfer import call_metadata
from rtml.rpc import messages as m
from rtml.rpc.auth import answer, challenge
from rtml.rpc.client import FramedClient, connect_socket, handshake, make_hello
from rtml.rpc.framing import FrameDecoder, frame


@rtml.remote
def plus(a: int, b: int) -> int:
    return a + b


def _addresses() -> list[str]:
    rt = current.require_runtime()
    return [rt.config.nm_address, rt.config.head_address]


def _frames(sock: socket.socket, decoder: FrameDecoder, count: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < count:
        data = sock.recv(65536)
        assert data, "closed"
        got += [bytes(f) for f in decoder.feed(data)]
    return got


class Impostor:
    """A listener that speaks the handshake without the cluster token (it made the socket
    a client was pointed at): it records what clients send it, and answers ``ok``."""

    def __init__(self, path: str) -> None:
        self.received = bytearray()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(frame(m.encode(challenge())))
                decoder = FrameDecoder()
                hello: list[bytes | memoryview] = []
                while not hello:
                    data = conn.recv(65536)
                    if not data:
                        break
                    self.received += data
                    hello = decoder.feed(data)
                if not hello:
                    continue
                assert isinstance(m.decode(hello[0]), m.Hello)
                conn.sendall(frame(m.encode(m.HelloReply(ok=True, proof=b"\0" * 32,
                                                         info={"store_dir": "/tmp"}))))
                conn.recv(1)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def impostor(tmp_path: Path) -> Iterator[Impostor]:
    fake = Impostor(str(tmp_path / "nm.sock"))
    yield fake
    fake.close()


def test_a_captured_handshake_opens_no_connection(cluster: None) -> None:
    token = current.require_runtime().token
    for address in _addresses():
        first = connect_socket(address)
        decoder = FrameDecoder()
        (sent,) = _frames(first, decoder, 1)
        original = m.decode(sent)
        assert isinstance(original, m.Challenge)
        captured = frame(m.encode(answer(original, token, make_hello("driver", random_id()))))
        first.sendall(captured)
        (accepted,) = _frames(first, decoder, 1)
        assert m.decode(accepted).ok  # type: ignore[attr-defined]
        first.close()
        replay = connect_socket(address)  # the eavesdropper sends the same bytes again
        decoder = FrameDecoder()
        (fresh,) = _frames(replay, decoder, 1)
        assert m.decode(fresh).nonce != original.nonce  # type: ignore[attr-defined]
        replay.sendall(captured)
        (refused,) = _frames(replay, decoder, 1)
        reply = m.decode(refused)
        assert isinstance(reply, m.HelloReply) and not reply.ok
        assert "wrong cluster token" in reply.error
        assert replay.recv(1) == b""  # and closed
        replay.close()
    assert rtml.get(plus.remote(40, 2), timeout=60) == 42


def test_the_token_never_crosses_the_wire(impostor: Impostor, tmp_path: Path) -> None:
    token = "s3cret-" + random_id().hex()
    sock = connect_socket(f"unix:{tmp_path}/nm.sock")
    with pytest.raises(ProtocolError, match="did not prove it holds the cluster token"):
        handshake(sock, token, make_hello("driver", random_id()))
    sock.close()
    impostor.thread.join(0.5)
    assert len(impostor.received) > 0
    for form in (token.encode(), token.encode().hex().encode()):
        assert form not in bytes(impostor.received)
    assert token not in str(call_metadata(token))  # nor in an object pull's metadata


def test_every_client_refuses_an_impostor(impostor: Impostor, tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/nm.sock"

    async def asyncio_client() -> None:
        await FramedClient.connect(address, "t" * 32, make_hello("node", random_id()))

    with pytest.raises(ProtocolError, match="not this cluster's"):
        asyncio.run(asyncio_client())
    with pytest.raises(RtmlSystemError, match="not this cluster's"):
        ClientRuntime(ClientConfig("driver", "t" * 32, address, f"unix:{tmp_path}/h.sock",
                                   str(tmp_path)))


def test_the_join_hint_keeps_the_token_off_the_command_line(tmp_path: Path) -> None:
    from tests.integration import test_cli

    session = tmp_path / "head"
    started = test_cli.rtml("start", "--head", "--port", str(test_cli._free_port()),
                            "--num-cpus", "1", "--session-dir", str(session), cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    try:
        token = (session / "token").read_text().strip()
        for line in started.stdout.splitlines():
            if "rtml start --address" in line:
                assert token not in line.split("rtml start", 1)[1], line
        hint = next(line for line in started.stdout.splitlines()
                    if line.strip().startswith("RTML_TOKEN=") and "rtml start" in line)
        assert hint.strip().startswith(f"RTML_TOKEN={token} rtml start --address ")
        copy = tmp_path / "token-copy"
        copy.write_text(token + "\n")
        address = next(line.split("=", 1)[1] for line in started.stdout.splitlines()
                       if line.startswith("RTML_ADDRESS="))
        joined = test_cli.rtml("start", "--address", address, "--token-file", str(copy),
                               "--num-cpus", "1", "--session-dir", str(tmp_path / "node"),
                               cwd=tmp_path)
        assert joined.returncode == 0, joined.stderr
        test_cli._stop(tmp_path / "node", tmp_path)
        missing = test_cli.rtml("start", "--address", address, "--token-file",
                                str(tmp_path / "nope"), "--session-dir",
                                str(tmp_path / "node2"), cwd=tmp_path)
        assert missing.returncode == 1 and "--token-file" in missing.stderr
    finally:
        test_cli._stop(session, tmp_path)
