"""rtml's own Redis is fenced (issue 17, item 3): a maintained server; no default user; the
cluster token is not its password; rtml's user may run only the control plane's commands
on rtml's keys; connections that never log in, or never read, cannot exhaust its memory.
Each attack is made on a real cluster's Redis and the cluster is checked to run on."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

import rtml
from rtml.control_plane import OWN_USER, find_redis_server, own_password
from rtml.control_plane.resp import AuthError, RespClient, RespError
from rtml.core import current


@rtml.remote
def add(a: int, b: int) -> int:
    return a + b


@pytest.fixture
def redis(cluster: None) -> Iterator[tuple[str, int, str]]:
    """The embedded cluster's Redis: host, port, and the cluster token."""
    rt = current.require_runtime()
    yield rt.plane.host, rt.plane.port, rt.token
    assert rtml.get(add.remote(20, 22), timeout=60) == 42  # the cluster runs on


def test_the_server_is_a_current_valkey() -> None:
    version = subprocess.run([find_redis_server(), "--version"], capture_output=True,
                             text=True, check=True).stdout
    assert version.startswith("Valkey server v="), version
    major, minor, _patch = (int(x) for x in version.split("v=")[1].split()[0].split("."))
    assert (major, minor) >= (8, 1), version  # CVE-2025-49844 (Lua) is fixed from 8.1.4/9.0


def test_nobody_logs_in_without_rtmls_login(redis: tuple[str, int, str]) -> None:
    host, port, token = redis
    anonymous = RespClient(host, port, None)
    with pytest.raises(AuthError, match="NOAUTH"):
        anonymous.execute("PING")
    anonymous.close()
    for user, password in (("", token), ("default", token), (OWN_USER, token),
                           ("", own_password(token))):
        client = RespClient(host, port, password, username=user)
        with pytest.raises(AuthError, match="WRONGPASS"):
            client.execute("PING")
        client.close()


@pytest.mark.parametrize("command", [
    ("CONFIG", "SET", "dir", "/tmp"), ("CONFIG", "GET", "*"), ("BGSAVE",), ("SAVE",),
    ("MODULE", "LOAD", "/tmp/x.so"), ("DEBUG", "SLEEP", "0"), ("REPLICAOF", "10.0.0.1", "1"),
    ("FLUSHALL",), ("KEYS", "*"), ("SCAN", "0"), ("CLIENT", "LIST"), ("ACL", "LIST"),
    ("SHUTDOWN",), ("SET", "elsewhere", "x"), ("GET", "other:key"), ("SUBSCRIBE", "c"),
    ("EVAL", "return redis.call('CONFIG', 'GET', 'dir')", "0"),
    ("EVAL", "return redis.call('SET', 'elsewhere', 'x')", "0"),
])
def test_rtmls_user_runs_only_the_control_planes_commands_on_its_keys(
        redis: tuple[str, int, str], command: tuple[str, ...]) -> None:
    host, port, token = redis
    client = RespClient(host, port, own_password(token), username=OWN_USER)
    try:
        assert client.execute("SET", "rtml:probe", "1") == b"OK"  # its own keys: yes
        with pytest.raises(RespError, match="NOPERM|not allowed|No permissions"):
            client.execute(*command)
    finally:
        client.execute("DEL", "rtml:probe")
        client.close()


def _server(port: int) -> psutil.Process:
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens on port {port}")


def test_connections_that_never_log_in_or_never_read_cannot_exhaust_it(
        redis: tuple[str, int, str]) -> None:
    host, port, token = redis
    server = _server(port)
    assert [c.laddr.ip for c in server.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN] == ["127.0.0.1"]  # embedded: loopback only
    before = server.memory_info().rss
    # Eight connections announce a 1 GiB argument and start sending it, without logging in.
    floods = [socket.create_connection((host, port), timeout=5) for _ in range(8)]
    chunk = b"x" * (1 << 20)
    closed = 0
    for sock in floods:
        try:
            sock.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1073741824\r\n")
            for _ in range(64):
                sock.sendall(chunk)
        except OSError:  # the server closed it
            closed += 1
    assert closed == len(floods)
    # One connection sends commands without logging in and never reads the replies.
    deaf = socket.create_connection((host, port), timeout=5)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    pings, started = b"PING\r\n" * 100_000, time.monotonic()
    with pytest.raises(OSError):  # closed once its unread replies pass the limit
        while time.monotonic() - started < 60:
            deaf.sendall(pings)
    # A token holder's connection asks for a 1 MiB value 1,500 times and never reads.
    writer = RespClient(host, port, own_password(token), username=OWN_USER)
    writer.execute("SET", "rtml:big", b"v" * (1 << 20))
    greedy = socket.create_connection((host, port), timeout=5)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    greedy.sendall(f"AUTH {OWN_USER} {own_password(token)}\r\n".encode())
    with contextlib.suppress(OSError):  # (closed while it sends: as good)
        for _ in range(15):
            greedy.sendall(b"GET rtml:big\r\n" * 100)
            time.sleep(0.05)
    writer.execute("DEL", "rtml:big")
    writer.close()
    grown = server.memory_info().rss - before
    assert grown < 200 << 20, f"Redis grew {grown >> 20} MiB"
    for sock in (*floods, deaf, greedy):
        sock.close()
