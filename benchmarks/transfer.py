"""Node-to-node object transfer throughput: one object pulled over loopback, by each path.

    python benchmarks/transfer.py [--mb 100] [--repeats 15] [--dest-dir /dev/shm]

A child process (spawned, as a second node manager would be) writes a numpy array of
``--mb`` MiB into its ``/dev/shm`` store with ``write_segment`` and serves it with two
``TransferServer``s: one as a node runs it (objects of ``STREAM_MIN_BYTES`` or more go on a
side stream), one with side streams turned off (every object through the chunked ``Pull``
RPC). The parent pulls the object once by each path into ``--dest-dir`` and checks the copy
with ``read_segment``, then ``--repeats`` rounds of timed pulls, one by each path per round
(so a busy machine slows every path alike):

    side stream (splice)  what ``pull`` does for a large object
    side stream (mmap)    the same, received with ``recv_into`` an ``mmap`` of the file
    chunked Pull          the gRPC stream of chunks, for comparison
    chunked Pull, TLS     what a pull does in a cluster started with ``--tls``

For each it prints the median, best and worst rate in GB/s (10^9 bytes per second, counting
the segment file's bytes) and the CPU time each side spent per GB moved, which is steadier
than the rate on a busy machine. Budget: >= 1 GB/s median for 100 MiB via the side stream.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import pickle
import resource
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rtml.objectstore import (  # noqa: E402
    read_segment,
    segment_path,
    transfer_stream,
    write_segment,
)
from rtml.objectstore.private import create_store_dir, remove_store_dir  # noqa: E402
from rtml.objectstore.transfer import TransferServer, close_channels, pull  # noqa: E402
from rtml.rpc.tls import make_certificate  # noqa: E402

MiB = 1024 * 1024
TOKEN = "bench-token"
BUDGET_GBPS = 1.0


class Way(NamedTuple):
    """One way of pulling: its label, the holder address to use, the side-stream receiver,
    and the holder's TLS certificate (b"": plain)."""

    label: str
    address: str
    receiver: str
    root_cert: bytes = b""


class Result(NamedTuple):
    rates: list[float]  # GB/s of each pull
    client_cpu: float  # our CPU seconds inside the pulls
    server_cpu: float  # the holder's CPU seconds meanwhile


def _array(mb: int) -> np.ndarray:
    return np.arange(mb * MiB // 8, dtype=np.int64)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve(conn: Connection, object_id: bytes, mb: int) -> None:
    """Child: store the object in a private store directory of its own and serve it three
    times (side streams on, off, TLS); sends the addresses and the TLS certificate, then
    answers "cpu" with its CPU seconds until "stop"."""
    store = create_store_dir(os.urandom(12).hex())
    path = segment_path(store, object_id)
    buffers: list[pickle.PickleBuffer] = []
    inband = pickle.dumps(_array(mb), protocol=5, buffer_callback=buffers.append)
    write_segment(path, inband, buffers)
    locate = lambda oid: path if oid == object_id else None  # noqa: E731
    cert_dir = tempfile.mkdtemp()
    cert, key = make_certificate(cert_dir)
    servers = [TransferServer("127.0.0.1", TOKEN, locate) for _ in range(2)]
    servers[1].stream_min_bytes = 2**63  # never: every object through Pull
    servers.append(TransferServer("127.0.0.1", TOKEN, locate, tls_files=(cert, key)))
    try:
        conn.send([server.start() for server in servers] + [Path(cert).read_bytes()])
        while conn.recv() == "cpu":
            conn.send(_cpu_seconds())
    finally:
        for server in servers:
            server.stop(0)
        remove_store_dir(store)
        shutil.rmtree(cert_dir)


def _server_cpu(conn: Connection) -> float:
    conn.send("cpu")
    return float(conn.recv())


def _pull_once(way: Way, object_id: bytes, dest: str) -> float:
    """One timed pull by ``way``; returns its rate in GB/s."""
    transfer_stream.STREAM_RECEIVER = way.receiver
    start = time.perf_counter()
    size = pull(way.address, TOKEN, object_id, dest, requester_node=b"bench",
                root_cert=way.root_cert)
    rate = size / (time.perf_counter() - start) / 1e9
    os.unlink(dest)
    return rate


def _warm_up(way: Way, object_id: bytes, dest: str, mb: int) -> None:
    """One untimed pull whose copy must read back as the original array."""
    transfer_stream.STREAM_RECEIVER = way.receiver
    pull(way.address, TOKEN, object_id, dest, root_cert=way.root_cert)
    inband, buffers = read_segment(dest)
    if not np.array_equal(pickle.loads(inband, buffers=buffers), _array(mb)):
        raise SystemExit(f"{way.label}: pulled copy at {dest} differs from the original")
    del inband, buffers
    os.unlink(dest)


def _measure(conn: Connection, ways: list[Way], object_id: bytes, dest: str,
             repeats: int) -> dict[str, Result]:
    """``repeats`` rounds of one pull by each way, interleaved."""
    results = {way.label: Result([], 0.0, 0.0) for way in ways}
    for _ in range(repeats):
        for way in ways:
            server_before, cpu_before = _server_cpu(conn), _cpu_seconds()
            rate = _pull_once(way, object_id, dest)
            client_cpu = _cpu_seconds() - cpu_before
            server_cpu = _server_cpu(conn) - server_before
            old = results[way.label]
            old.rates.append(rate)
            results[way.label] = Result(old.rates, old.client_cpu + client_cpu,
                                        old.server_cpu + server_cpu)
    return results


def _run(conn: Connection, object_id: bytes, args: argparse.Namespace) -> None:
    streaming, chunked, tls, cert = conn.recv()
    ways = [Way("side stream (splice)", streaming, "splice"),
            Way("side stream (mmap)", streaming, "mmap"),
            Way("chunked Pull", chunked, "splice"),
            Way("chunked Pull, TLS", tls, "splice", cert)]
    dest = os.path.join(args.dest_dir, f"rtml-benchpull-{object_id.hex()}")
    try:
        for way in ways:
            _warm_up(way, object_id, dest, args.mb)
        results = _measure(conn, ways, object_id, dest, args.repeats)
    finally:
        if os.path.exists(dest):
            os.unlink(dest)
    print(f"pull {args.mb} MiB over loopback, {args.repeats} pulls per path, interleaved:")
    for label, result in results.items():
        _report(label, args.mb, result, budget=label == ways[0].label)


def _report(label: str, mb: int, result: Result, budget: bool) -> None:
    rates = result.rates
    median = statistics.median(rates)
    gigabytes = len(rates) * mb * MiB / 1e9
    verdict = (f"; budget >= {BUDGET_GBPS} GB/s: {'pass' if median >= BUDGET_GBPS else 'MISS'}"
               if budget else "")
    print(f"  {label:21s} median {median:.2f} GB/s (best {max(rates):.2f}, worst "
          f"{min(rates):.2f}); CPU per GB: puller {result.client_cpu / gigabytes:.2f} s, "
          f"holder {result.server_cpu / gigabytes:.2f} s{verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="object size in MiB")
    parser.add_argument("--repeats", type=int, default=15, help="timed pulls per path")
    parser.add_argument("--dest-dir", default="/dev/shm", help="where pulled copies land")
    args = parser.parse_args(argv)
    object_id = os.urandom(20)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, object_id, args.mb))
    proc.start()
    child.close()  # so a holder that dies turns our recv() into EOFError, not a hang
    try:
        _run(parent, object_id, args)
    finally:
        close_channels()  # before the holder stops, so it sends no GOAWAY to a live channel
        with contextlib.suppress(OSError):
            parent.send("stop")
        proc.join(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
