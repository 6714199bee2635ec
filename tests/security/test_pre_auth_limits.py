"""Deadlines and caps before authentication (issue 17, item 4): a connection that does not
prove the token in time is closed; a first frame is a few KiB at most; idle connections,
however many, neither exhaust a daemon's descriptors nor keep a driver out; refusals are
logged at a bounded rate. Made on loopback against a real cluster's node manager and head
(bounded: 3,000 connections)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil

import rtml
from rtml.core import current
from rtml.rpc import messages as m
from rtml.rpc.admission import HELLO_TIMEOUT
from rtml.rpc.client import connect_socket
from rtml.rpc.framing import FrameDecoder
from rtml.rpc.server import MAX_PENDING

FLOOD = 3000


@rtml.remote
def square(x: int) -> int:
    return x * x


def _open(address: str) -> socket.socket:
    return connect_socket(address, timeout=HELLO_TIMEOUT + 5)


def _daemons() -> list[tuple[str, psutil.Process]]:
    """(address, process) of the node manager and the head service."""
    rt = current.require_runtime()
    found = []
    for address in (rt.config.nm_address, rt.config.head_address):
        module = "rtml.node.main" if address.startswith("unix:") else "rtml.head.main"
        procs = [p for p in psutil.process_iter(["cmdline"])
                 if module in " ".join(p.info["cmdline"] or []) and
                 rt.config.session_dir in " ".join(p.info["cmdline"] or [])]
        assert len(procs) == 1, (module, procs)
        found.append((address, procs[0]))
    return found


def test_a_silent_connection_is_closed_at_its_deadline(cluster: None) -> None:
    for address, _proc in _daemons():
        sock = _open(address)
        started = time.monotonic()
        decoder = FrameDecoder()
        got = []
        while data := sock.recv(65536):
            got += [m.decode(f) for f in decoder.feed(data)]
        waited = time.monotonic() - started
        assert [type(msg) for msg in got] == [m.Challenge], got
        assert HELLO_TIMEOUT - 0.5 < waited < HELLO_TIMEOUT + 3, waited
        sock.close()


def test_a_first_frame_may_be_a_few_kib_at_most(cluster: None) -> None:
    for address, proc in _daemons():
        before = proc.memory_info().rss
        socks = [_open(address) for _ in range(50)]
        for sock in socks:  # a frame announcing 1 MiB, and its first KiB
            sock.recv(65536)  # (the Challenge)
            sock.sendall(struct.pack(">I", 1 << 20) + os.urandom(1 << 10))
        for sock in socks:
            decoder, replies = FrameDecoder(), []
            while data := sock.recv(65536):
                replies += [m.decode(f) for f in decoder.feed(data)]
            assert len(replies) == 1 and not replies[0].ok  # type: ignore[attr-defined]
            assert "exceeds" in replies[0].error  # type: ignore[attr-defined]
            sock.close()
        assert proc.memory_info().rss - before < 32 << 20
    assert rtml.get(square.remote(7), timeout=60) == 49


def test_thousands_of_idle_connections_keep_no_driver_out(cluster: None,
                                                          tmp_path: Path) -> None:
    rt = current.require_runtime()
    daemons = _daemons()
    fds_before = [proc.num_fds() for _address, proc in daemons]
    idle = [_open(address) for _ in range(FLOOD // len(daemons)) for address, _ in daemons]
    try:
        time.sleep(0.5)
        for (_address, proc), before in zip(daemons, fds_before, strict=True):
            assert proc.num_fds() - before < MAX_PENDING + 64  # not one per connection
        env = {**os.environ, "RTML_TOKEN": rt.token}
        driver = subprocess.run(
            [sys.executable, "-c",
             "import rtml\n"
             f"rtml.init(address={rt.config.head_address!r})\n"
             "@rtml.remote\ndef square(x):\n    return x * x\n"
             "print(sum(rtml.get([square.remote(i) for i in range(100)], timeout=60)))\n"
             "rtml.shutdown()\n"],
            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert driver.returncode == 0, driver.stderr
        assert driver.stdout.split() == [str(sum(i * i for i in range(100)))]
        assert rtml.get([square.remote(i) for i in range(10)], timeout=60) == [
            i * i for i in range(10)]
    finally:
        for sock in idle:
            sock.close()
    log = Path(rt.config.session_dir) / "logs" / "node_manager.log"
    assert log.stat().st_size < 1 << 20  # refusals summarized, not one line each
    assert "refused" in log.read_text()

