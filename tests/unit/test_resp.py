"""RespClient, rtml's own RESP2 client, against a real throwaway redis-server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from rtml.control_plane import RedisProcess, resp
from rtml.control_plane.resp import (
    AuthError,
    RespBaseError,
    RespClient,
    RespConnectionError,
    RespError,
    Script,
)


@pytest.fixture(scope="module")
def server(plain_redis: RedisProcess) -> RedisProcess:
    """The client is tested against a plain server (its tests use CLIENT KILL, INCR)."""
    return plain_redis


@pytest.fixture
def client(server: RedisProcess) -> Iterator[RespClient]:
    c = RespClient(server.host, server.port, server.password)
    c.execute("FLUSHALL")
    yield c
    c.close()


def test_error_classes_share_a_base() -> None:
    for cls in (AuthError, RespConnectionError, RespError):
        assert issubclass(cls, RespBaseError)


def test_execute_round_trips_replies(client: RespClient) -> None:
    assert client.execute("PING") == b"PONG"
    assert client.execute("SET", "k", b"\x00\xffv") == b"OK"
    assert client.execute("GET", "k") == b"\x00\xffv"
    assert client.execute("GET", "missing") is None
    assert client.execute("INCRBY", "n", 5) == 5
    assert client.execute("RPUSH", "l", "a", 2, 1.5) == 3
    assert client.execute("LRANGE", "l", 0, -1) == [b"a", b"2", b"1.5"]
    with pytest.raises(RespError, match="WRONGTYPE"):
        client.execute("HGET", "l", "x")
    assert client.execute("PING") == b"PONG"  # still in step after an error reply


def test_pipeline_of_a_thousand_commands(client: RespClient) -> None:
    replies = client.pipeline([("SET", f"key{i}", i) for i in range(1000)])
    assert replies == [b"OK"] * 1000
    values = client.pipeline([("GET", f"key{i}") for i in range(1000)])
    assert values == [str(i).encode() for i in range(1000)]
    assert client.pipeline([]) == []


def test_error_reply_inside_a_pipeline(client: RespClient) -> None:
    client.execute("SET", "s", "x")
    commands = [("SET", "a", 1), ("INCR", "s"), ("GET", "a"), ("NOSUCHCOMMAND",)]
    replies = client.pipeline(commands, raise_on_error=False)
    assert replies[0] == b"OK" and replies[2] == b"1"
    assert isinstance(replies[1], RespError) and "not an integer" in str(replies[1])
    assert isinstance(replies[3], RespError)
    with pytest.raises(RespError, match="not an integer"):
        client.pipeline(commands)
    assert client.execute("GET", "a") == b"1"  # every reply was read: still in step


def test_script_falls_back_to_eval_on_noscript(client: RespClient) -> None:
    script = Script(client, "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
    assert script(keys=["k"], args=["v", 41]) == [b"k", b"v", 42]
    assert client.execute("SCRIPT", "FLUSH") == b"OK"
    assert script(keys=["k2"], args=[b"w", 1]) == [b"k2", b"w", 2]  # NOSCRIPT -> EVAL
    assert script(keys=["k3"], args=["x", 2]) == [b"k3", b"x", 3]  # cached again
    failing = Script(client, "return redis.error_reply('boom')")
    with pytest.raises(RespError, match="boom"):
        failing()


def test_wrong_password_raises_auth_error(server: RedisProcess) -> None:
    wrong = RespClient(server.host, server.port, "not-the-password")
    with pytest.raises(AuthError):
        wrong.execute("PING")
    with pytest.raises(AuthError):
        wrong.pipeline([("PING",)])
    wrong.close()


def test_connection_refused_raises_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        client = RespClient("127.0.0.1", port, "pw", connect_timeout=1.0)
        with pytest.raises(RespConnectionError, match="cannot connect") as info:
            client.execute("PING")
        assert info.value.maybe_applied is False
        with pytest.raises(RespConnectionError):
            client.pipeline([("PING",)])
        client.close()


def test_concurrent_use_from_eight_threads(client: RespClient) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(200):
                key = f"t{n}"
                assert client.execute("SET", key, f"{n}:{i}") == b"OK"
                assert client.execute("GET", key) == f"{n}:{i}".encode()
                replies = client.pipeline([("INCR", f"c{n}"), ("GET", key)])
                assert replies == [i + 1, f"{n}:{i}".encode()]
        except BaseException as exc:  # re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert client.pipeline([("GET", f"c{n}") for n in range(8)]) == [b"200"] * 8


def test_reconnects_after_the_server_closes_the_connection(server: RedisProcess,
                                                           client: RespClient) -> None:
    assert client.execute("SET", "k", "v") == b"OK"
    admin = RespClient(server.host, server.port, server.password)
    assert admin.execute("CLIENT", "SETNAME", "admin") == b"OK"
    killed = admin.execute("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed >= 1
    assert client.execute("GET", "k") == b"v"  # transparently reconnected
    admin.execute("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert client.pipeline([("GET", "k"), ("PING",)]) == [b"v", b"PONG"]  # dead before send
    admin.close()


def test_a_broken_connection_is_resent_once_for_execute_never_for_pipeline(
        server: RedisProcess, client: RespClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the idle-socket check blinded, the loss is only seen after sending."""

    class BlindPoll:
        def register(self, *args: object) -> None:
            pass

        def poll(self, timeout: float) -> list[object]:
            return []

    monkeypatch.setattr(resp.select, "poll", BlindPoll)
    admin = RespClient(server.host, server.port, server.password)
    assert client.execute("SET", "k", "v") == b"OK"
    admin.execute("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert client.execute("GET", "k") == b"v"  # resent on a fresh connection
    admin.execute("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    with pytest.raises(RespConnectionError, match="lost") as info:
        client.pipeline([("INCR", "n"), ("INCR", "n")])
    assert info.value.maybe_applied is True
    assert client.execute("PING") == b"PONG"  # reconnected
    admin.execute("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    with pytest.raises(RespConnectionError):
        client.execute("INCR", "n", idempotent=False)
    assert client.execute("GET", "n") is None  # the server never ran them
    admin.close()


def test_a_server_that_never_answers_times_out_once_and_is_not_retried() -> None:
    from rtml.control_plane import ControlPlane
    from rtml.exceptions import RtmlSystemError

    hung = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        hung.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(hung.accept()[0])
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept)
    thread.start()
    port = hung.getsockname()[1]
    try:
        client = RespClient("127.0.0.1", port, "pw", timeout=0.3)
        with pytest.raises(RespConnectionError) as raised:
            client.execute("PING")
        assert raised.value.timed_out and "timed out" in str(raised.value)
        plane = ControlPlane("127.0.0.1", port, "pw")
        plane._client = RespClient("127.0.0.1", port, "pw", timeout=0.3)
        with pytest.raises(RtmlSystemError, match="did not answer in time"):
            plane.check()
        assert len(accepted) == 2  # one connection each: a hung Redis is not asked again
    finally:
        stop.set()
        thread.join()
        hung.close()
        for sock in accepted:
            sock.close()
