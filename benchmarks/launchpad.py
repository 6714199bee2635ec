"""rtml.launchpad benchmarks: a courier call's round trip and a batched handler's throughput.

    python benchmarks/launchpad.py [--launch-types local_mt,local_mp,rtml] [--calls N]
                                   [--callers K] [--dim D] [--rounds R] [--json FILE]

For each launch type, two programs run (each node where that launch type puts
it: a thread, a process, an rtml actor on an embedded 2-CPU cluster):

* round trip: a PyNode calls ``Echo.ping(b"x")`` of a CourierNode one call at a
  time (``--calls`` timed calls after a warm-up); median and p90 in µs.
* batched throughput: a PyNode runs K threads (``--callers``), each calling
  ``Model.infer(x)`` (x: ``--dim`` floats, 64; the batch is one matmul) in a loop;
  ``infer`` is ``lp.batched_handler(batch_size=K)``. Calls/s over all threads,
  the mean batch size, and the same callers on an unbatched ``infer_one`` as a
  reference.

The measuring node saves its figures as JSON in a temporary directory (every
launch type runs on this machine). ``--rounds`` rounds go through the launch
types in turn; the table shows, per launch type, the median of each figure
across rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import rtml.launchpad as lp

LAUNCH_TYPES = ("local_mt", "local_mp", "rtml")
DEFAULT_DIM = 64
BATCH_TIMEOUT = 0.01  # seconds a batch waits to fill (full batches never wait)
WARMUP_CALLS = 200


class Echo:
    def ping(self, payload: bytes) -> bytes:
        return payload


class Model:
    """``infer`` is batched (up to ``batch_size`` concurrent calls, one matmul)."""

    def __init__(self, batch_size: int, dim: int) -> None:
        self.weights = np.random.default_rng(0).standard_normal((dim, dim))
        self.batched_calls = 0
        self._lock = threading.Lock()
        self.infer = lp.batched_handler(batch_size=batch_size, timeout=BATCH_TIMEOUT)(
            self._infer_batch)

    def _infer_batch(self, x: np.ndarray) -> np.ndarray:
        with self._lock:
            self.batched_calls += 1
        return np.tanh(x @ self.weights)

    def infer_one(self, x: np.ndarray) -> np.ndarray:
        """The unbatched reference: one matmul per call."""
        return np.tanh(x @ self.weights)

    def batched_call_count(self) -> int:
        with self._lock:
            return self.batched_calls


def time_round_trips(server: Any, calls: int, result_path: str) -> None:
    """Time ``calls`` one-at-a-time ``ping`` calls (after a warm-up); save the ns."""
    for _ in range(WARMUP_CALLS):
        server.ping(b"x")
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        server.ping(b"x")
        samples.append(time.perf_counter_ns() - start)
    Path(result_path).write_text(json.dumps({"samples_ns": samples}))
    lp.stop()


def drive(server: Any, callers: int, calls: int, dim: int, result_path: str) -> None:
    """K caller threads: first on ``infer`` (batched), then on ``infer_one``; save rates."""
    x = np.random.default_rng(1).standard_normal(dim)
    result = {}
    for method in ("infer", "infer_one"):
        call = getattr(server, method)
        for _ in range(WARMUP_CALLS // callers + 1):
            call(x)
        batched_before = server.batched_call_count()
        seconds = _run_threads(call, x, callers, calls // callers)
        result[method] = {"calls": calls // callers * callers, "seconds": seconds,
                          "batched_calls": server.batched_call_count() - batched_before}
    Path(result_path).write_text(json.dumps(result))
    lp.stop()


def _run_threads(call: Any, x: np.ndarray, threads: int, calls_each: int) -> float:
    """Seconds for ``threads`` threads to make ``calls_each`` calls each, all started at once."""
    start = threading.Barrier(threads + 1)

    def loop() -> None:
        start.wait()
        for _ in range(calls_each):
            call(x)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    return time.perf_counter() - began


def round_trip_program(calls: int, result_path: str) -> lp.Program:
    program = lp.Program("bench_round_trip")
    server = program.add_node(lp.CourierNode(Echo), label="server")
    program.add_node(lp.PyNode(time_round_trips, server, calls, result_path), label="caller")
    return program


def throughput_program(callers: int, calls: int, dim: int, result_path: str) -> lp.Program:
    program = lp.Program("bench_batched")
    server = program.add_node(lp.CourierNode(Model, callers, dim), label="server")
    program.add_node(lp.PyNode(drive, server, callers, calls, dim, result_path),
                     label="caller")
    return program


def launch_and_read(program: lp.Program, launch_type: str, result_path: str) -> Any:
    """Run ``program`` to its end; what its measuring node saved. Raises TimeoutError."""
    handle = lp.launch(program, launch_type=launch_type)
    if not handle.wait(300):
        handle.stop()
        raise TimeoutError(f"{program.name} under {launch_type} still running after 300 s")
    return json.loads(Path(result_path).read_text())


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an already sorted list."""
    rank = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def measure(launch_type: str, calls: int, callers: int, dim: int) -> dict[str, Any]:
    """Both benchmarks under ``launch_type``: one table row."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        trips = launch_and_read(round_trip_program(calls, path), launch_type, path)
        rates = launch_and_read(throughput_program(callers, calls, dim, path), launch_type, path)
    us = sorted(ns / 1000 for ns in trips["samples_ns"])
    batched, one = rates["infer"], rates["infer_one"]
    return {
        "launch_type": launch_type, "round_trip_median_us": statistics.median(us),
        "round_trip_p90_us": percentile(us, 90), "round_trip_calls": len(us),
        "callers": callers, "batched_calls_per_s": batched["calls"] / batched["seconds"],
        "mean_batch": batched["calls"] / max(1, batched["batched_calls"]),
        "unbatched_calls_per_s": one["calls"] / one["seconds"],
    }


def median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median across rounds of one launch type."""
    row = dict(rounds[0])
    for key, value in rounds[0].items():
        if isinstance(value, float):
            row[key] = statistics.median(r[key] for r in rounds)
    return row


def render_table(rows: list[dict[str, Any]]) -> str:
    k = rows[0]["callers"] if rows else 0
    header = ["launch type", "round trip median us", "p90 us",
              f"batched calls/s (K={k}, batch_size={k})", "mean batch",
              f"unbatched calls/s (K={k})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        cells = [r["launch_type"], f"{r['round_trip_median_us']:,.0f}",
                 f"{r['round_trip_p90_us']:,.0f}", f"{r['batched_calls_per_s']:,.0f}",
                 f"{r['mean_batch']:.1f}", f"{r['unbatched_calls_per_s']:,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-types", default=",".join(LAUNCH_TYPES),
                        help="comma-separated, from " + ", ".join(LAUNCH_TYPES))
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per benchmark")
    parser.add_argument("--callers", type=int, default=8, help="K concurrent callers")
    parser.add_argument("--dim", type=int, default=DEFAULT_DIM,
                        help="x has dim floats; the model is one dim x dim matmul")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--json", dest="json_file", default=None, help="write rows here")
    args = parser.parse_args(argv)
    launch_types = [t for t in args.launch_types.split(",") if t]
    if "rtml" in launch_types:
        import rtml

        os.environ.pop("RTML_ADDRESS", None)  # an embedded cluster, whatever the shell says
        rtml.init(num_cpus=2)

    load_before, began = os.getloadavg()[0], time.perf_counter()
    rounds = [[measure(t, args.calls, args.callers, args.dim) for t in launch_types]
              for _ in range(args.rounds)]
    rows = [median_row([r[i] for r in rounds]) for i in range(len(launch_types))]
    print(f"rtml.launchpad benchmark ({os.cpu_count()} cpus; Python "
          f"{platform.python_version()}; {args.calls} calls per row; median of "
          f"{args.rounds} round(s); wall "
          f"{time.perf_counter() - began:.1f} s; 1-min load avg {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after)")
    print(render_table(rows))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
