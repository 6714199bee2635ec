"""rtml microbenchmarks: latency and throughput of the core paths.

    python benchmarks/micro.py [--address ADDR] [--quick] [--json FILE]

Starts an embedded cluster with ``rtml.init(num_cpus=2)`` unless ``--address``
is given, and prints one row per metric: median / p90 / p99 in microseconds
(latency rows) or a rate (throughput rows), with the budget from
shared/DESIGN.md and pass/miss where a budget exists. Row names follow Ray's
``ray microbenchmark`` where one matches. ``--json FILE`` writes the rows as a
list of dicts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

MB = 1024 * 1024
BIG_BYTES = 100 * MB
NODE_STORE_BYTES = 1024 * MB
FREE_SETTLE_S = 0.5
"""Pause before a timed transfer: freeing the previous 100 MB objects (on both nodes) takes
tens of ms of kernel time on this VM and would land inside the next timed get."""

# Row names (stable: tests and RESULTS.md refer to them).
INIT_FRESH = "rtml.init() to first result (fresh process)"
TASKS_SYNC = "single client tasks sync"
TASKS_ASYNC = "single client tasks async"
ACTOR_SYNC = "1:1 actor calls sync"
ACTOR_ASYNC = "1:1 actor calls async"
PUT_GET_SMALL = "single client put+get small"
PUT_CALLS = "single client put calls"
GET_CALLS = "single client get calls"
PUT_GB = "single client put gigabytes"
GET_BIG = "single client get 100MB numpy"
COPY_BIG = "numpy.copy 100MB (reference)"
TASK_BIG_ARG = "single client task 100MB arg by ref"
REMOTE_NODE = "remote task (second node) sync"
TRANSFER = "object transfer 100MB between nodes"

ROW_NAMES = [INIT_FRESH, TASKS_SYNC, TASKS_ASYNC, ACTOR_SYNC, ACTOR_ASYNC, PUT_GET_SMALL,
             PUT_CALLS, GET_CALLS, PUT_GB, GET_BIG, COPY_BIG, TASK_BIG_ARG, REMOTE_NODE,
             TRANSFER]

# Budgets from shared/DESIGN.md ("Budgets on this machine").
#   latency budgets: max median in µs; throughput budgets: min rate.
LATENCY_BUDGET_US = {
    TASKS_SYNC: 150.0,
    REMOTE_NODE: 1000.0,
    ACTOR_SYNC: 100.0,
    INIT_FRESH: 1_000_000.0,
}
RATE_BUDGET = {TASKS_ASYNC: 20_000.0, TRANSFER: 1.0}
# Zero copies on get: a get must be at least this many times faster than a
# numpy.copy of the same array.
ZERO_COPY_FACTOR = 50.0


# ---------------------------------------------------------------- helpers

def now_ns() -> int:
    return time.perf_counter_ns()


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(round(q / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def latency_row(name: str, samples_ns: list[int], note: str = "") -> dict[str, Any]:
    us = sorted(s / 1000.0 for s in samples_ns)
    return {"name": name, "kind": "latency", "unit": "us", "samples": len(us),
            "median_us": percentile(us, 50), "p90_us": percentile(us, 90),
            "p99_us": percentile(us, 99), "rate": None, "note": note}


def rate_row(name: str, rate: float, unit: str, note: str = "") -> dict[str, Any]:
    return {"name": name, "kind": "throughput", "unit": unit, "samples": None,
            "median_us": None, "p90_us": None, "p99_us": None, "rate": rate, "note": note}


def time_each(fn: Callable[[], Any], n: int, warmup: int = 0) -> list[int]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = now_ns()
        fn()
        out.append(now_ns() - t0)
    return out


def best_rate(fn: Callable[[], Any], items: int, repeats: int) -> tuple[float, list[float]]:
    """Run ``fn`` (which processes ``items`` items) ``repeats`` times; best items/s."""
    rates = []
    for _ in range(repeats):
        t0 = now_ns()
        fn()
        rates.append(items / ((now_ns() - t0) / 1e9))
    return max(rates), rates


def apply_budget(row: dict[str, Any]) -> None:
    name = row["name"]
    row.setdefault("budget", None)
    row.setdefault("status", None)
    row.setdefault("missed_by", None)
    if name in LATENCY_BUDGET_US:
        b = LATENCY_BUDGET_US[name]
        row["budget"] = f"<= {fmt_us(b)} us median"
        if row["median_us"] is not None:
            ratio = row["median_us"] / b
            row["status"] = "pass" if ratio <= 1.0 else "MISS"
            row["missed_by"] = None if ratio <= 1.0 else f"{ratio:.1f}x over"
    elif name in RATE_BUDGET:
        b = RATE_BUDGET[name]
        row["budget"] = f">= {b:,.0f} {row['unit']}"
        if row["rate"] is not None:
            ratio = b / row["rate"]
            row["status"] = "pass" if ratio <= 1.0 else "MISS"
            row["missed_by"] = None if ratio <= 1.0 else f"{ratio:.1f}x under"
    elif name == GET_BIG:
        row["budget"] = f"zero copies (get >= {ZERO_COPY_FACTOR:.0f}x faster than numpy.copy)"
        ratio = row.get("speedup_vs_copy")
        if ratio:
            row["status"] = "pass" if ratio >= ZERO_COPY_FACTOR else "MISS"
            row["missed_by"] = (None if ratio >= ZERO_COPY_FACTOR
                                else f"only {ratio:.1f}x faster than a copy")


def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"


def fmt_rate(row: dict[str, Any]) -> str:
    r = row["rate"]
    if r is None:
        return "-"
    if r >= 100:
        return f"{r:,.0f} {row['unit']}"
    return f"{r:.2f} {row['unit']}"


def render_table(rows: list[dict[str, Any]]) -> str:
    header = ["metric", "median us", "p90 us", "p99 us", "rate", "budget", "pass/miss", "note"]
    lines = []
    for r in rows:
        if r.get("na"):
            lines.append([r["name"], "n/a", "n/a", "n/a", "n/a", r.get("budget") or "-",
                          "n/a", r["note"]])
            continue
        lines.append([r["name"], fmt_us(r["median_us"]), fmt_us(r["p90_us"]), fmt_us(r["p99_us"]),
                      fmt_rate(r), r.get("budget") or "-",
                      (r["status"] + (f" ({r['missed_by']})" if r.get("missed_by") else ""))
                      if r.get("status") else "-", r.get("note") or ""])
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


# ---------------------------------------------------------------- benchmarks

FRESH_SCRIPT = r"""
import time
t = time.perf_counter()
import rtml
rtml.init({init_args})
@rtml.remote
def f():
    return 1
assert rtml.get(f.remote()) == 1
elapsed = time.perf_counter() - t
print("ELAPSED", repr(elapsed), flush=True)
rtml.shutdown()
"""


def bench_fresh_init(address: str | None, runs: int) -> dict[str, Any]:
    init_args = "num_cpus=2" if address is None else f"address={address!r}"
    env = dict(os.environ)
    if address is None:
        env.pop("RTML_ADDRESS", None)  # embedded, whatever the caller's shell says
    samples_ns = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", FRESH_SCRIPT.format(init_args=init_args)],
                              capture_output=True, text=True, timeout=60, env=env,
                              cwd=str(REPO_ROOT))  # cwd on sys.path: never a stray "rtml" dir
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ELAPSED ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"fresh-process init failed (rc={proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}")
        samples_ns.append(int(float(lines[-1].split()[1]) * 1e9))
    mode = "embedded" if address is None else f"join {address}"
    return latency_row(INIT_FRESH, samples_ns,
                       note=f"{mode}; median of {runs} subprocess runs")


def na_row(name: str, kind: str, unit: str) -> dict[str, Any]:
    return {"name": name, "kind": kind, "unit": unit, "samples": 0, "median_us": None,
            "p90_us": None, "p99_us": None, "rate": None, "na": True,
            "note": "n/a with --address: measured on a two-node rtml.testing.Cluster"}


def bench_two_nodes(engine: Any, engine_name: str, quick: bool) -> list[dict[str, Any]]:
    """Remote task round trip and 100 MB transfer on a two-node cluster on this machine.

    ``engine`` is the ``rtml`` or ``ray`` module; each engine's own helper makes the
    cluster (``rtml.testing.Cluster`` / ``ray.cluster_utils.Cluster``), so compare_ray.py
    runs this same body on both.
    """
    import numpy as np

    if engine_name == "ray":
        from ray.cluster_utils import Cluster
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as Pin
    else:
        from rtml.testing import Cluster  # type: ignore[assignment]
        Pin = engine.NodeAffinitySchedulingStrategy
    # Stores of 1 GiB (Cluster's test default is 256 MiB): room for a few 100 MB objects
    # in flight, so the transfer row measures transfers, not spilling.
    store = {"object_store_memory": NODE_STORE_BYTES}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **store})
    node2 = cluster.add_node(num_cpus=1, **store)
    if engine_name == "ray":
        engine.init(address=cluster.address)
        cluster.wait_for_nodes()
    else:
        cluster.connect()
    try:
        pinned = Pin(node2.node_id, soft=False)

        @engine.remote
        def noop() -> None:
            return None

        @engine.remote
        def make(n: int) -> Any:
            return np.ones(n, dtype=np.uint8)

        remote_noop = noop.options(scheduling_strategy=pinned)
        n_sync = 300 if quick else 2000
        s = time_each(lambda: engine.get(remote_noop.remote()), n_sync, warmup=200)
        rows = [latency_row(REMOTE_NODE, s, note="no-op pinned to a second node, one at a "
                                                  "time")]
        gets = []
        for _ in range(3 if quick else 7):
            ref = make.options(scheduling_strategy=pinned).remote(BIG_BYTES)
            engine.wait([ref], fetch_local=False)  # made there, not yet pulled here
            time.sleep(FREE_SETTLE_S)
            t0 = now_ns()
            value = engine.get(ref)
            gets.append(now_ns() - t0)
            assert value.nbytes == BIG_BYTES
            del value, ref
        gets.sort()
        median_s = gets[len(gets) // 2] / 1e9
        rows.append(rate_row(TRANSFER, BIG_BYTES / 1e9 / median_s, "GB/s",
                             note=f"get on the head of 100 MB made on node 2, "
                                  f"median of {len(gets)} ({median_s * 1e3:.0f} ms each)"))
        return rows
    finally:
        engine.shutdown()
        cluster.shutdown()


def run(address: str | None, quick: bool) -> list[dict[str, Any]]:
    import numpy as np

    import rtml

    rows: list[dict[str, Any]] = []

    # Measured first, before this process starts its own cluster, so the fresh
    # processes do not compete with a running cluster for the 2 cores.
    rows.append(bench_fresh_init(address, runs=3))

    if address is None:
        rtml.init(num_cpus=2)
    else:
        rtml.init(address=address)
    try:
        @rtml.remote
        def noop() -> None:
            return None

        @rtml.remote
        def takes_array(a: Any) -> int:
            return int(a.shape[0])

        @rtml.remote
        class Actor:
            def noop(self) -> None:
                return None

        # -- local task round trip, one at a time
        n_sync = 300 if quick else 2000
        s = time_each(lambda: rtml.get(noop.remote()), n_sync, warmup=200)
        rows.append(latency_row(TASKS_SYNC, s, note="submit no-op + get, one at a time"))

        # -- no-op throughput from one driver, 5,000 in flight, best of 3
        n_async = 5000
        rtml.get([noop.remote() for _ in range(500)])
        best, rates = best_rate(lambda: rtml.get([noop.remote() for _ in range(n_async)]),
                                n_async, 3)
        rows.append(rate_row(TASKS_ASYNC, best, "tasks/s",
                             note=f"{n_async} in flight, best of 3 "
                                  f"({', '.join(f'{r:,.0f}' for r in rates)})"))

        # -- actor calls
        actor = Actor.remote()
        rtml.get(actor.noop.remote())
        n_actor = 300 if quick else 2000
        s = time_each(lambda: rtml.get(actor.noop.remote()), n_actor, warmup=200)
        rows.append(latency_row(ACTOR_SYNC, s, note="one call at a time"))
        n_pipe = 1000
        best, rates = best_rate(lambda: rtml.get([actor.noop.remote() for _ in range(n_pipe)]),
                                n_pipe, 3)
        rows.append(rate_row(ACTOR_ASYNC, best, "calls/s",
                             note=f"{n_pipe} pipelined, best of 3 "
                                  f"({', '.join(f'{r:,.0f}' for r in rates)})"))

        # -- small objects
        n_small = 300 if quick else 2000
        s = time_each(lambda: rtml.get(rtml.put(b"x" * 64)), n_small, warmup=100)
        rows.append(latency_row(PUT_GET_SMALL, s, note="64-byte value, put then get"))
        n_calls = 1000 if quick else 5000

        def put_many() -> None:
            for _ in range(n_calls):
                rtml.put(0)
        best, _ = best_rate(put_many, n_calls, 3)
        rows.append(rate_row(PUT_CALLS, best, "puts/s", note="rtml.put(0), best of 3"))
        small_ref = rtml.put(0)

        def get_many() -> None:
            for _ in range(n_calls):
                rtml.get(small_ref)
        best, _ = best_rate(get_many, n_calls, 3)
        rows.append(rate_row(GET_CALLS, best, "gets/s", note="get of one small ref, best of 3"))

        # -- 100 MB numpy array: put (GB/s), get (zero-copy check), task arg by ref
        arr = np.random.default_rng(0).integers(0, 255, BIG_BYTES, dtype=np.uint8)
        n_big_put = 2 if quick else 5
        put_ns = []
        for _ in range(n_big_put):
            t0 = now_ns()
            ref = rtml.put(arr)
            put_ns.append(now_ns() - t0)
            del ref
            time.sleep(0.05)  # let the free reach the store
        put_ns.sort()
        med_put_s = put_ns[len(put_ns) // 2] / 1e9
        rows.append(rate_row(PUT_GB, BIG_BYTES / 1e9 / med_put_s, "GB/s",
                             note=f"100 MB numpy put, median of {n_big_put} "
                                  f"({med_put_s * 1e3:.0f} ms each)"))

        big_ref = rtml.put(arr)
        t0 = now_ns()
        first = rtml.get(big_ref)
        first_get_ns = now_ns() - t0
        assert first.nbytes == BIG_BYTES
        del first
        n_big_get = 20 if quick else 100

        def get_big() -> None:
            v = rtml.get(big_ref)
            del v
        s_get = time_each(get_big, n_big_get)
        n_copy = 3 if quick else 5
        s_copy = time_each(lambda: np.copy(arr), n_copy, warmup=1)
        get_row = latency_row(GET_BIG, s_get,
                              note=f"first get {first_get_ns / 1e3:,.0f} us")
        copy_row = latency_row(COPY_BIG, s_copy, note="memcpy reference for the get row")
        speedup = copy_row["median_us"] / max(get_row["median_us"], 1e-9)
        get_row["speedup_vs_copy"] = speedup
        get_row["first_get_us"] = first_get_ns / 1e3
        get_row["note"] += f"; {speedup:,.0f}x faster than numpy.copy"
        rows.append(get_row)
        rows.append(copy_row)

        assert rtml.get(takes_array.remote(big_ref)) == BIG_BYTES  # warm-up
        n_arg = 5 if quick else 20
        s = time_each(lambda: rtml.get(takes_array.remote(big_ref)), n_arg, warmup=1)
        rows.append(latency_row(TASK_BIG_ARG, s,
                                note="task(ref to 100 MB array) returning its length"))
    finally:
        rtml.shutdown()

    if address is None:
        rows += bench_two_nodes(rtml, "rtml", quick)
    else:
        rows += [na_row(REMOTE_NODE, "latency", "us"), na_row(TRANSFER, "throughput", "GB/s")]

    for r in rows:
        apply_budget(r)
    order = {n: i for i, n in enumerate(ROW_NAMES)}
    rows.sort(key=lambda r: order.get(r["name"], len(order)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="join this cluster instead of starting one")
    p.add_argument("--quick", action="store_true", help="fewer samples (~40 s)")
    p.add_argument("--json", dest="json_file", default=None, help="write rows as JSON here")
    args = p.parse_args(argv)

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    rows = run(args.address, args.quick)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0]

    print(f"rtml microbenchmark ({'quick' if args.quick else 'full'}; "
          f"{os.cpu_count()} cpus; Python {platform.python_version()}; "
          f"{'embedded cluster' if args.address is None else 'cluster ' + args.address}; "
          f"wall {wall:.1f} s; 1-min load avg {load_before:.2f} before, {load_after:.2f} after)")
    print(render_table(rows))
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
