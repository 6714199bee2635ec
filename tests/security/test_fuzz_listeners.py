"""A bounded fuzz of what the node manager and the head read, before and after the
handshake (issue 17): random bytes, random frames, and well-framed msgpack arrays with
every message tag and random fields. Each connection is refused or closed, or its input
ignored; the daemons keep serving and the node's accounting holds."""

from __future__ import annotations

import socket
import struct

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rtml
from rtml.core import current
from rtml.ids import random_id
from rtml.rpc import messages as m
from rtml.rpc.client import connect_socket, handshake, make_hello

TAGS = sorted({cls.__struct_config__.tag for cls in m.Message.__args__})  # type: ignore[attr-defined]
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                 st.binary(max_size=64), st.text(max_size=32))
value = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
message = st.builds(lambda tag, fields: msgspec.msgpack.encode([tag, *fields]),
                    st.sampled_from(TAGS), st.lists(value, max_size=12))


def _framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


wire_bytes = st.one_of(st.binary(max_size=512), message.map(_framed),
                       st.binary(max_size=64).map(_framed))
"""What a peer may send: raw bytes, a framed message, a framed blob."""


@rtml.remote
def one() -> int:
    return 1


def _exchange(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` and read what comes back until the peer closes or pauses."""
    sock.settimeout(0.3)
    try:
        sock.sendall(data)
        while sock.recv(65536):
            pass
    except (TimeoutError, OSError):
        pass
    finally:
        sock.close()


def _addresses() -> list[str]:
    rt = current.require_runtime()
    return [rt.config.nm_address, rt.config.head_address]


def _still_serving() -> None:
    assert rtml.get([one.remote() for _ in range(4)], timeout=60) == [1] * 4
    assert rtml.available_resources().get("CPU") == 2.0


@FUZZ
@given(data=st.lists(wire_bytes, min_size=1, max_size=3))
def test_before_the_handshake(cluster: None, data: list[bytes]) -> None:
    for address in _addresses():
        sock = connect_socket(address, timeout=5)
        sock.recv(65536)  # the Challenge
        _exchange(sock, b"".join(data))


@FUZZ
@given(data=st.lists(message, min_size=1, max_size=4))
def test_after_the_handshake(cluster: None, data: list[bytes]) -> None:
    rt = current.require_runtime()
    for address in _addresses():
        sock = connect_socket(address, timeout=5)
        handshake(sock, rt.token, make_hello("driver", random_id(), rt.job_id))
        _exchange(sock, b"".join(_framed(d) for d in data))


def test_the_daemons_served_on(cluster: None) -> None:
    """(Run after the fuzz above, in this module's cluster.)"""
    _still_serving()
