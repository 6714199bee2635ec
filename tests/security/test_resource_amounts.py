"""Every resource amount is a finite number >= 0 (issue 17, item 6): checked at the API,
the CLI, and again where a shape arrives from the wire (a token holder's hand-made
request), so a NaN cannot freeze a node's accounting and a negative amount cannot add
to it."""

from __future__ import annotations

import contextlib
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import rtml
from rtml.core import current
from rtml.ids import random_id
from rtml.rpc import messages as m
from rtml.rpc.client import connect_socket, handshake, make_hello
from rtml.rpc.framing import FrameDecoder, frame
from rtml.scheduler.resources import bad_amount

BAD = (float("nan"), float("inf"), -1.0, -100)


@rtml.remote
def one() -> int:
    return 1


@rtml.remote
class Box:
    def get(self) -> int:
        return 7


@pytest.mark.parametrize("amount", BAD)
def test_the_api_refuses_a_bad_amount_naming_it(cluster: None, amount: float) -> None:
    for make in (lambda: one.options(num_cpus=amount), lambda: one.options(num_gpus=amount),
                 lambda: one.options(memory=amount),
                 lambda: one.options(resources={"custom": amount}),
                 lambda: Box.options(num_cpus=amount),
                 lambda: Box.options(resources={"custom": amount})):
        with pytest.raises(ValueError, match="finite number >= 0"):
            make().remote()
    assert rtml.get(one.remote(), timeout=60) == 1


def test_a_bad_amount_in_a_hand_made_request_is_refused_and_the_node_keeps_its_cpus(
        cluster: None) -> None:
    rt = current.require_runtime()
    before = rtml.available_resources()
    with _raw(rt.config.nm_address) as (sock, decoder):
        for req_id, amount in enumerate(BAD, 1):
            sock.sendall(frame(m.encode(m.RequestLease(req_id, {"CPU": amount}))))
            (reply,) = _read(sock, decoder, 1)
            assert isinstance(reply, m.LeaseFailed) and reply.req_id == req_id
            assert "lease refused" in reply.reason and "finite number >= 0" in reply.reason
    with _raw(rt.config.head_address) as (sock, decoder):
        for req_id, amount in enumerate(BAD, 1):
            spec = m.ActorSpec(random_id(), rt.job_id, rt.client_id, b"\0" * 20, "Box", (),
                               (), {"CPU": amount}, {"CPU": amount})
            sock.sendall(frame(m.encode(m.CreateActor(req_id, spec))))
            (reply,) = _read(sock, decoder, 1)
            assert isinstance(reply, m.ActorInfo) and reply.state == "DEAD"
            assert reply.req_id == req_id and "actor refused" in reply.error
    assert rtml.get([one.remote() for _ in range(20)], timeout=60) == [1] * 20
    assert rtml.available_resources()["CPU"] == before["CPU"] == 2.0
    assert not math.isnan(rtml.cluster_resources()["CPU"])


@contextlib.contextmanager
def _raw(address: str) -> Iterator[tuple[socket.socket, FrameDecoder]]:
    """A connection to a daemon that proved it holds the cluster token (a token holder's)."""
    rt = current.require_runtime()
    sock = connect_socket(address)
    try:
        handshake(sock, rt.token, make_hello("driver", random_id(), rt.job_id))
        yield sock, FrameDecoder()
    finally:
        sock.close()


def _read(sock: socket.socket, decoder: FrameDecoder, count: int) -> list[object]:
    """The next ``count`` messages, skipping what a daemon pushes unasked (node tables)."""
    got: list[object] = []
    while len(got) < count:
        data = sock.recv(65536)
        assert data, "the daemon closed the connection"
        got += [msg for msg in map(m.decode, decoder.feed(data))
                if not isinstance(msg, m.NodeTable | m.NodeDied)]
    return got


def test_init_and_the_cli_refuse_a_bad_amount(tmp_path: Path) -> None:
    if rtml.is_initialized():
        rtml.shutdown()
    for kwargs in ({"num_cpus": float("nan")}, {"num_gpus": -1},
                   {"resources": {"custom": float("inf")}}):
        with pytest.raises(ValueError, match="finite number >= 0"):
            rtml.init(**kwargs)
        assert not rtml.is_initialized()
    for args in (["--num-cpus", "nan"], ["--num-gpus", "-1"], ["--resources", '{"x": NaN}'],
                 ["--resources", '{"x": Infinity}']):
        refused = subprocess.run(
            [sys.executable, "-m", "rtml.cli.main", "start", "--head", "--port", "0",
             "--session-dir", str(tmp_path / "s"), *args],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert refused.returncode != 0 and "finite number >= 0" in refused.stderr, (
            args, refused.stderr)
        assert not (tmp_path / "s" / "session.json").exists()


def test_bad_amount_names_what_is_wrong() -> None:
    assert bad_amount({"CPU": 1.0, "GPU": 0, "x": 2}) == ""
    assert "'CPU'" in bad_amount({"CPU": float("nan")})
    assert "True" in bad_amount({"x": True})
    assert "str" in bad_amount({3: 1.0})
    assert "'1'" in bad_amount({"x": "1"})
