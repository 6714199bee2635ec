"""Node-to-node object transfer throughput: one object pulled over loopback gRPC.

    python benchmarks/transfer.py [--mb 100] [--repeats 15] [--dest-dir /dev/shm]

A child process (spawned, as a second node manager would be) writes a numpy array of
``--mb`` MiB into its ``/dev/shm`` store with ``write_segment`` and serves it with
``TransferServer``; the parent pulls it once into ``--dest-dir`` and checks the copy with
``read_segment``, then pulls it ``--repeats`` more times, timing each pull. It prints the
median, best and worst rate in GB/s (10^9 bytes per second, counting the segment file's
bytes) and the CPU time each side spent per GB moved, which is steadier than the rate on a
busy machine. Budget: >= 1 GB/s median for 100 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import pickle
import resource
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rtml.objectstore import read_segment, segment_path, write_segment  # noqa: E402
from rtml.objectstore.transfer import TransferServer, close_channels, pull  # noqa: E402

MiB = 1024 * 1024
TOKEN = "bench-token"
BUDGET_GBPS = 1.0


def _array(mb: int) -> np.ndarray:
    return np.arange(mb * MiB // 8, dtype=np.int64)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve(conn: Connection, namespace: str, object_id: bytes, mb: int) -> None:
    """Child: store the object and serve it; answers "cpu" with its CPU seconds until "stop"."""
    path = segment_path(namespace, object_id)
    buffers: list[pickle.PickleBuffer] = []
    inband = pickle.dumps(_array(mb), protocol=5, buffer_callback=buffers.append)
    write_segment(path, inband, buffers)
    server = TransferServer("127.0.0.1", TOKEN, lambda oid: path if oid == object_id else None)
    try:
        conn.send(server.start())
        while conn.recv() == "cpu":
            conn.send(_cpu_seconds())
    finally:
        server.stop(0)
        os.unlink(path)


def _server_cpu(conn: Connection) -> float:
    conn.send("cpu")
    return float(conn.recv())


def _warm_up(address: str, object_id: bytes, dest: str, mb: int) -> None:
    """One untimed pull whose copy must read back as the original array."""
    pull(address, TOKEN, object_id, dest)
    inband, buffers = read_segment(dest)
    if not np.array_equal(pickle.loads(inband, buffers=buffers), _array(mb)):
        raise SystemExit(f"pulled copy at {dest} differs from the original")
    del inband, buffers
    os.unlink(dest)


def _measure(address: str, object_id: bytes, dest: str, repeats: int) -> tuple[list[float], float]:
    """Timed pulls; returns (GB/s of each, our CPU seconds spent inside them)."""
    rates = []
    cpu = 0.0
    for _ in range(repeats):
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        size = pull(address, TOKEN, object_id, dest, requester_node=b"bench")
        rates.append(size / (time.perf_counter() - start) / 1e9)
        cpu += _cpu_seconds() - cpu_before
        os.unlink(dest)
    return rates, cpu


def _run(conn: Connection, object_id: bytes, args: argparse.Namespace) -> None:
    address = conn.recv()
    dest = os.path.join(args.dest_dir, f"rtml-benchpull-{object_id.hex()}")
    try:
        _warm_up(address, object_id, dest, args.mb)
        server_before = _server_cpu(conn)
        rates, client_cpu = _measure(address, object_id, dest, args.repeats)
        server_cpu = _server_cpu(conn) - server_before
    finally:
        if os.path.exists(dest):
            os.unlink(dest)
    _report(args.mb, rates, client_cpu, server_cpu)


def _report(mb: int, rates: list[float], client_cpu: float, server_cpu: float) -> None:
    median = statistics.median(rates)
    gigabytes = len(rates) * mb * MiB / 1e9
    print(f"pull {mb} MiB over loopback gRPC, {len(rates)} pulls: median {median:.2f} GB/s "
          f"(best {max(rates):.2f}, worst {min(rates):.2f}); budget >= {BUDGET_GBPS} GB/s: "
          f"{'pass' if median >= BUDGET_GBPS else 'MISS'}")
    print(f"CPU per GB: puller {client_cpu / gigabytes:.2f} s, "
          f"holder {server_cpu / gigabytes:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="object size in MiB")
    parser.add_argument("--repeats", type=int, default=15, help="timed pulls")
    parser.add_argument("--dest-dir", default="/dev/shm", help="where pulled copies land")
    args = parser.parse_args(argv)
    object_id = os.urandom(20)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, f"bench{os.getpid()}", object_id, args.mb))
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
