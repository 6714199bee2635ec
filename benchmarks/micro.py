"""rtml microbenchmarks: latency and throughput of the core paths.

    python benchmarks/micro.py [--address ADDR] [--quick] [--json FILE]

Starts an embedded cluster with ``rtml.init(num_cpus=2)`` unless ``--address``
is given, and prints one row per metric: median / p90 / p99 in microseconds
(latency rows), a rate (throughput rows) or megabytes (the memory row), with the
budget from docs/DESIGN.md and pass/miss where a budget exists. Row names follow
Ray's ``ray microbenchmark`` where one matches. ``--json FILE`` writes the rows as
a list of dicts.

The body (``bench``) is engine-generic: it takes the ``rtml`` or ``ray`` module and
uses only the API the two share, so benchmarks/compare_ray.py runs the same body on
both. This module imports only the standard library at import time (the engines
and numpy are imported inside functions), so Ray's separate virtualenv can load it.
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
IDLE_SETTLE_S = 2.0
"""Idle time between the warm-up tasks and the memory reading (workers done starting)."""

# Row names (stable: tests and RESULTS.md refer to them), in the order printed.
INIT_FRESH = "rtml.init() to first result (fresh process)"
IDLE_RSS = "idle embedded cluster memory (RSS)"
TASKS_SYNC = "single client tasks sync"
TASKS_ASYNC = "single client tasks async"
MULTI_TASKS_ASYNC = "multi client tasks async"
TASK_CHAIN = "task chain 1k deep by ObjectRef arg (per hop)"
NESTED_TASKS = "task submitting 100 tasks and getting them"
ACTOR_SYNC = "1:1 actor calls sync"
ACTOR_ASYNC = "1:1 actor calls async"
ACTOR_CONCURRENT = "1:1 actor calls concurrent"
ASYNC_ACTOR_ASYNC = "1:1 async-actor calls async"
PUT_GET_SMALL = "single client put+get small"
PUT_CALLS = "single client put calls"
GET_CALLS = "single client get calls"
GET_10K_REFS = "single client get object containing 10k refs"
WAIT_1K_REFS = "single client wait 1k refs"
PUT_GB = "single client put gigabytes"
GET_BIG = "single client get 100MB numpy"
COPY_BIG = "numpy.copy 100MB (reference)"
TASK_BIG_ARG = "single client task 100MB arg by ref"
REMOTE_NODE = "remote task (second node) sync"
TRANSFER = "object transfer 100MB between nodes"

ROW_NAMES = [INIT_FRESH, IDLE_RSS, TASKS_SYNC, TASKS_ASYNC, MULTI_TASKS_ASYNC, TASK_CHAIN,
             NESTED_TASKS, ACTOR_SYNC, ACTOR_ASYNC, ACTOR_CONCURRENT, ASYNC_ACTOR_ASYNC,
             PUT_GET_SMALL, PUT_CALLS, GET_CALLS, GET_10K_REFS, WAIT_1K_REFS, PUT_GB, GET_BIG,
             COPY_BIG, TASK_BIG_ARG, REMOTE_NODE, TRANSFER]

# Budgets from docs/DESIGN.md ("Budgets on this machine"), applied to rtml only.
#   latency budgets: max median in µs; throughput budgets: min rate; memory: max MB.
LATENCY_BUDGET_US = {
    TASKS_SYNC: 150.0,
    REMOTE_NODE: 1000.0,
    ACTOR_SYNC: 100.0,
    INIT_FRESH: 1_000_000.0,
}
RATE_BUDGET = {TASKS_ASYNC: 20_000.0, ACTOR_ASYNC: 30_000.0, TRANSFER: 1.0}
MEMORY_BUDGET_MB = {IDLE_RSS: 300.0}
# Zero copies on get: a get must be at least this many times faster than a
# numpy.copy of the same array.
ZERO_COPY_FACTOR = 50.0

Row = dict[str, Any]


# ---------------------------------------------------------------- helpers

def now_ns() -> int:
    return time.perf_counter_ns()


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(round(q / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def _row(name: str, kind: str, unit: str, note: str) -> Row:
    return {"name": name, "kind": kind, "unit": unit, "samples": None, "median_us": None,
            "p90_us": None, "p99_us": None, "rate": None, "mb": None, "note": note}


def latency_row(name: str, samples_ns: list[int], note: str = "") -> Row:
    us = sorted(s / 1000.0 for s in samples_ns)
    return {**_row(name, "latency", "us", note), "samples": len(us),
            "median_us": percentile(us, 50), "p90_us": percentile(us, 90),
            "p99_us": percentile(us, 99)}


def rate_row(name: str, rate: float, unit: str, note: str = "") -> Row:
    return {**_row(name, "throughput", unit, note), "rate": rate}


def memory_row(name: str, mb: float, note: str = "") -> Row:
    return {**_row(name, "memory", "MB", note), "mb": mb}


def na_row(name: str, reason: str) -> Row:
    """A row that could not be measured, and why (printed as n/a)."""
    return {**_row(name, "n/a", "", reason), "na": True}


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


def best_rate_row(name: str, fn: Callable[[], Any], items: int, unit: str, what: str,
                  repeats: int = 3) -> Row:
    """A throughput row: the best of ``repeats`` runs of ``fn``, all runs in the note."""
    best, rates = best_rate(fn, items, repeats)
    return rate_row(name, best, unit, note=f"{what}, best of {repeats} "
                                           f"({', '.join(f'{r:,.0f}' for r in rates)})")


def _judge(row: Row, ratio: float, miss: str) -> None:
    """``ratio`` <= 1 passes; ``miss`` describes a miss."""
    row["status"] = "pass" if ratio <= 1.0 else "MISS"
    row["missed_by"] = None if ratio <= 1.0 else miss


def apply_budget(row: Row) -> None:
    name = row["name"]
    row.setdefault("budget", None)
    row.setdefault("status", None)
    row.setdefault("missed_by", None)
    if row.get("na"):
        return  # nothing measured to judge
    if name in LATENCY_BUDGET_US:
        b = LATENCY_BUDGET_US[name]
        row["budget"] = f"<= {fmt_us(b)} us median"
        if row["median_us"] is not None:
            _judge(row, row["median_us"] / b, f"{row['median_us'] / b:.1f}x over")
    elif name in RATE_BUDGET:
        b = RATE_BUDGET[name]
        row["budget"] = f">= {b:,.0f} {row['unit']}"
        if row["rate"] is not None:
            _judge(row, b / row["rate"], f"{b / row['rate']:.1f}x under")
    elif name in MEMORY_BUDGET_MB:
        b = MEMORY_BUDGET_MB[name]
        row["budget"] = f"<= {b:,.0f} MB"
        if row["mb"] is not None:
            _judge(row, row["mb"] / b, f"{row['mb'] / b:.1f}x over")
    elif name == GET_BIG:
        row["budget"] = f"zero copies (get >= {ZERO_COPY_FACTOR:.0f}x faster than numpy.copy)"
        ratio = row.get("speedup_vs_copy")
        if ratio:
            _judge(row, ZERO_COPY_FACTOR / ratio, f"only {ratio:.1f}x faster than a copy")


def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}"


def fmt_amount(row: Row) -> str:
    """The rate of a throughput row or the size of a memory row."""
    v = row["rate"] if row["kind"] == "throughput" else row["mb"]
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f} {row['unit']}"
    return f"{v:.2f} {row['unit']}"


def render_table(rows: list[Row]) -> str:
    header = ["metric", "median us", "p90 us", "p99 us", "rate / size", "budget", "pass/miss",
              "note"]
    lines = []
    for r in rows:
        if r.get("na"):
            lines.append([r["name"], "n/a", "n/a", "n/a", "n/a", r.get("budget") or "-",
                          "n/a", r["note"]])
            continue
        lines.append([r["name"], fmt_us(r["median_us"]), fmt_us(r["p90_us"]), fmt_us(r["p99_us"]),
                      fmt_amount(r), r.get("budget") or "-",
                      (r["status"] + (f" ({r['missed_by']})" if r.get("missed_by") else ""))
                      if r.get("status") else "-", r.get("note") or ""])
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


# ---------------------------------------------------------------- engines and processes

def init_kwargs(engine_name: str, address: str | None) -> dict[str, Any]:
    """``init`` arguments: join ``address``, else the same embedded 2-CPU cluster for both."""
    if address is not None:
        return {"address": address}
    if engine_name == "ray":
        return {"num_cpus": 2, "include_dashboard": False}
    return {"num_cpus": 2}


def child_env(engine_name: str) -> dict[str, str]:
    """The environment of a benchmark subprocess: no cluster address from the caller's shell
    (``init_kwargs`` says which cluster), no Ray usage reporting."""
    env = dict(os.environ)
    env.pop("RTML_ADDRESS", None)
    env.pop("RAY_ADDRESS", None)
    if engine_name == "ray":
        env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` in the process tree, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ")"
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid``; 0 once it has exited (or for a zombie, which has none)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------- the benchmark body

FRESH_SCRIPT = r"""
import time
t = time.perf_counter()
import {engine} as engine
engine.init(**{kwargs!r})
@engine.remote
def f():
    return 1
assert engine.get(f.remote()) == 1
elapsed = time.perf_counter() - t
print("ELAPSED", repr(elapsed), flush=True)
engine.shutdown()
"""


def bench_fresh_init(engine_name: str, address: str | None, runs: int) -> Row:
    """Import + init + first task result, in a fresh process of this interpreter."""
    script = FRESH_SCRIPT.format(engine=engine_name, kwargs=init_kwargs(engine_name, address))
    samples_ns = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120, env=child_env(engine_name),
                              cwd=str(REPO_ROOT))  # cwd on sys.path: never a stray "rtml" dir
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ELAPSED ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"fresh-process init failed (rc={proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}")
        samples_ns.append(int(float(lines[-1].split()[1]) * 1e9))
    mode = "embedded" if address is None else f"join {address}"
    return latency_row(INIT_FRESH, samples_ns,
                       note=f"{engine_name}, {mode}, import included; median of {runs} "
                            f"subprocess runs")


def make_noop(engine: Any) -> Any:
    @engine.remote
    def noop() -> None:
        return None
    return noop


def bench_idle_memory(engine: Any, address: str | None) -> Row:
    """Total RSS of the idle cluster's processes: the driver's descendants, driver excluded."""
    if address is not None:
        return na_row(IDLE_RSS, "n/a with --address: the cluster's processes are not this "
                                "driver's descendants")
    noop = make_noop(engine)
    engine.get([noop.remote() for _ in range(10)])  # workers started
    time.sleep(IDLE_SETTLE_S)
    pids = descendants(os.getpid())
    cluster_mb = sum(rss_bytes(p) for p in pids) / 1e6
    driver_mb = rss_bytes(os.getpid()) / 1e6
    return memory_row(IDLE_RSS, cluster_mb,
                      note=f"VmRSS summed over the driver's {len(pids)} descendant processes "
                           f"after 10 tasks and {IDLE_SETTLE_S:.0f} s idle; driver excluded "
                           f"({driver_mb:.0f} MB more); pages shared between processes "
                           f"counted in each")


def bench_tasks(engine: Any, quick: bool) -> list[Row]:
    """No-op round trip one at a time, then 5,000 in flight from this driver."""
    noop = make_noop(engine)
    s = time_each(lambda: engine.get(noop.remote()), 300 if quick else 2000, warmup=200)
    rows = [latency_row(TASKS_SYNC, s, note="submit no-op + get, one at a time")]
    n_async = 5000
    engine.get([noop.remote() for _ in range(500)])
    rows.append(best_rate_row(TASKS_ASYNC, lambda: engine.get([noop.remote()
                                                               for _ in range(n_async)]),
                              n_async, "tasks/s", f"{n_async} in flight"))
    return rows


def bench_multi_client(engine: Any, quick: bool) -> list[Row]:
    """No-op tasks from 4 clients at once, as Ray's row: 4 actors (num_cpus=0) each submit a
    batch and get it."""
    noop = make_noop(engine)

    class Client:
        def batch(self, n: int) -> None:
            engine.get([noop.remote() for _ in range(n)])

    client_cls: Any = engine.remote(num_cpus=0)(Client)
    n_clients, n_each = 4, 500 if quick else 2500
    clients = [client_cls.remote() for _ in range(n_clients)]
    engine.get([c.batch.remote(10) for c in clients])  # started and warm
    return [best_rate_row(MULTI_TASKS_ASYNC,
                          lambda: engine.get([c.batch.remote(n_each) for c in clients]),
                          n_clients * n_each, "tasks/s",
                          f"{n_clients} actor clients x {n_each} no-ops, total")]


def bench_task_chain(engine: Any, quick: bool) -> list[Row]:
    """``r = f.remote(r)`` 1,000 times, then get the last: each task waits for the previous."""
    depth = 1000

    @engine.remote
    def hop(x: int) -> int:
        return x + 1

    def chain() -> None:
        r = engine.put(0)
        for _ in range(depth):
            r = hop.remote(r)
        assert engine.get(r) == depth

    runs = 3 if quick else 10
    s = time_each(chain, runs, warmup=1)
    return [latency_row(TASK_CHAIN, [t // depth for t in s],
                        note=f"chain time / {depth}, {runs} chains")]


def bench_nested_tasks(engine: Any, quick: bool) -> list[Row]:
    """A task that submits 100 no-op tasks and gets them, timed end to end from the driver."""
    noop = make_noop(engine)
    fan_out = 100

    @engine.remote
    def submit_and_get(n: int) -> int:
        return len(engine.get([noop.remote() for _ in range(n)]))

    s = time_each(lambda: engine.get(submit_and_get.remote(fan_out)), 20 if quick else 100,
                  warmup=3)
    return [latency_row(NESTED_TASKS, s, note=f"outer task submits {fan_out} no-ops + gets "
                                              f"them; driver submit to result")]


def pipelined_calls_row(engine: Any, name: str, actor: Any, what: str) -> Row:
    """1,000 pipelined no-op calls on ``actor``, best of 3, after a warm-up."""
    n = 1000
    engine.get([actor.noop.remote() for _ in range(100)])  # started and warm
    return best_rate_row(name, lambda: engine.get([actor.noop.remote() for _ in range(n)]), n,
                         "calls/s", f"{n} pipelined, {what}")


def bench_actors(engine: Any, quick: bool) -> list[Row]:
    """Actor call round trip, then 1,000 pipelined calls on a plain, a threaded and an async
    actor."""
    class Actor:
        def noop(self) -> None:
            return None

    class AsyncActor:
        async def noop(self) -> None:
            return None

    actor_cls: Any = engine.remote(Actor)
    actor = actor_cls.remote()
    engine.get(actor.noop.remote())
    s = time_each(lambda: engine.get(actor.noop.remote()), 300 if quick else 2000, warmup=200)
    return [
        latency_row(ACTOR_SYNC, s, note="one call at a time"),
        pipelined_calls_row(engine, ACTOR_ASYNC, actor, "plain actor"),
        pipelined_calls_row(engine, ACTOR_CONCURRENT,
                            actor_cls.options(max_concurrency=16).remote(),
                            "threaded actor (max_concurrency=16)"),
        pipelined_calls_row(engine, ASYNC_ACTOR_ASYNC, engine.remote(AsyncActor).remote(),
                            "actor with an async def method"),
    ]


def bench_small_objects(engine: Any, quick: bool) -> list[Row]:
    """put+get of a small value, put(0) calls, gets of one ready small ref."""
    s = time_each(lambda: engine.get(engine.put(b"x" * 64)), 300 if quick else 2000,
                  warmup=100)
    rows = [latency_row(PUT_GET_SMALL, s, note="64-byte value, put then get")]
    n_calls = 1000 if quick else 5000

    def put_many() -> None:
        for _ in range(n_calls):
            engine.put(0)
    put_many()  # warm-up
    rows.append(best_rate_row(PUT_CALLS, put_many, n_calls, "puts/s", "put(0)"))
    small_ref = engine.put(0)

    def get_many() -> None:
        for _ in range(n_calls):
            engine.get(small_ref)
    get_many()  # warm-up
    rows.append(best_rate_row(GET_CALLS, get_many, n_calls, "gets/s", "get of one small ref"))
    return rows


def bench_many_refs(engine: Any, quick: bool) -> list[Row]:
    """get of an object holding 10,000 refs; wait on 1,000 finished refs."""
    n_refs = 10_000
    outer = engine.put([engine.put(0) for _ in range(n_refs)])
    s = time_each(lambda: engine.get(outer), 10 if quick else 50, warmup=2)
    rows = [latency_row(GET_10K_REFS, s, note=f"put of a list of {n_refs:,} put(0) refs; "
                                              f"get of it")]
    noop = make_noop(engine)
    n_wait = 1000
    refs = [noop.remote() for _ in range(n_wait)]
    engine.get(refs)

    def wait_all() -> None:
        ready, _ = engine.wait(refs, num_returns=n_wait)
        assert len(ready) == n_wait
    s = time_each(wait_all, 20 if quick else 100, warmup=2)
    rows.append(latency_row(WAIT_1K_REFS, s, note=f"wait(num_returns={n_wait}) on {n_wait} "
                                                  f"finished task results"))
    return rows


def bench_big_objects(engine: Any, quick: bool) -> list[Row]:
    """A 100 MB numpy array: put (GB/s), get (zero-copy check against numpy.copy), a task
    taking it by ref."""
    import numpy as np

    arr = np.random.default_rng(0).integers(0, 255, BIG_BYTES, dtype=np.uint8)
    n_big_put = 2 if quick else 5
    put_ns = []
    for _ in range(n_big_put):
        t0 = now_ns()
        ref = engine.put(arr)
        put_ns.append(now_ns() - t0)
        del ref
        time.sleep(0.05)  # let the free reach the store
    put_ns.sort()
    med_put_s = put_ns[len(put_ns) // 2] / 1e9
    rows = [rate_row(PUT_GB, BIG_BYTES / 1e9 / med_put_s, "GB/s",
                     note=f"100 MB numpy put, median of {n_big_put} "
                          f"({med_put_s * 1e3:.0f} ms each)")]

    big_ref = engine.put(arr)
    t0 = now_ns()
    first = engine.get(big_ref)
    first_get_ns = now_ns() - t0
    assert first.nbytes == BIG_BYTES
    del first

    def get_big() -> None:
        v = engine.get(big_ref)
        del v
    s_get = time_each(get_big, 20 if quick else 100)
    s_copy = time_each(lambda: np.copy(arr), 3 if quick else 5, warmup=1)
    get_row = latency_row(GET_BIG, s_get, note=f"first get {first_get_ns / 1e3:,.0f} us")
    copy_row = latency_row(COPY_BIG, s_copy, note="memcpy reference for the get row")
    speedup = copy_row["median_us"] / max(get_row["median_us"], 1e-9)
    get_row["speedup_vs_copy"] = speedup
    get_row["first_get_us"] = first_get_ns / 1e3
    get_row["note"] += f"; {speedup:,.0f}x faster than numpy.copy"
    rows += [get_row, copy_row]

    @engine.remote
    def takes_array(a: Any) -> int:
        return int(a.shape[0])

    s = time_each(lambda: engine.get(takes_array.remote(big_ref)), 5 if quick else 20,
                  warmup=1)
    rows.append(latency_row(TASK_BIG_ARG, s,
                            note="task(ref to 100 MB array) returning its length"))
    return rows


# Each section of the body on the running single-node cluster, with the rows it reports.
SECTIONS: list[tuple[Callable[[Any, bool], list[Row]], list[str]]] = [
    (bench_tasks, [TASKS_SYNC, TASKS_ASYNC]),
    (bench_multi_client, [MULTI_TASKS_ASYNC]),
    (bench_task_chain, [TASK_CHAIN]),
    (bench_nested_tasks, [NESTED_TASKS]),
    (bench_actors, [ACTOR_SYNC, ACTOR_ASYNC, ACTOR_CONCURRENT, ASYNC_ACTOR_ASYNC]),
    (bench_small_objects, [PUT_GET_SMALL, PUT_CALLS, GET_CALLS]),
    (bench_many_refs, [GET_10K_REFS, WAIT_1K_REFS]),
    (bench_big_objects, [PUT_GB, GET_BIG, COPY_BIG, TASK_BIG_ARG]),
]


def run_section(section: Callable[[Any, bool], list[Row]], names: list[str], engine: Any,
                quick: bool) -> list[Row]:
    """The section's rows; n/a rows with the error if it raises (the other sections run)."""
    try:
        return section(engine, quick)
    except Exception as e:  # reported in the table, not hidden
        reason = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        return [{**na_row(name, reason), "error": True} for name in names]


def bench_two_nodes(engine: Any, engine_name: str, quick: bool) -> list[Row]:
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
        def make(n: int) -> Any:
            return np.ones(n, dtype=np.uint8)

        remote_noop = make_noop(engine).options(scheduling_strategy=pinned)
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


def bench(engine: Any, engine_name: str, quick: bool, address: str | None = None) -> list[Row]:
    """Every row, in ROW_NAMES order, on ``engine`` (the ``rtml`` or ``ray`` module).

    Embedded ``init(num_cpus=2)`` cluster unless ``address`` is given (then the memory and
    two-node rows are n/a). No budgets applied: see ``apply_budget``.
    """
    # Measured first, before this process starts its own cluster, so the fresh
    # processes do not compete with a running cluster for the 2 cores.
    rows = [bench_fresh_init(engine_name, address, runs=3)]
    engine.init(**init_kwargs(engine_name, address))
    try:
        rows.append(bench_idle_memory(engine, address))  # first, while the cluster is idle
        for section, names in SECTIONS:
            rows += run_section(section, names, engine, quick)
    finally:
        engine.shutdown()
    if address is None:
        rows += bench_two_nodes(engine, engine_name, quick)
    else:
        reason = "n/a with --address: measured on a two-node cluster this process starts"
        rows += [na_row(REMOTE_NODE, reason), na_row(TRANSFER, reason)]
    order = {n: i for i, n in enumerate(ROW_NAMES)}
    rows.sort(key=lambda r: order[r["name"]])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="join this cluster instead of starting one")
    p.add_argument("--quick", action="store_true", help="fewer samples (< 1 min)")
    p.add_argument("--json", dest="json_file", default=None, help="write rows as JSON here")
    args = p.parse_args(argv)

    import rtml

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    rows = bench(rtml, "rtml", args.quick, args.address)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    for r in rows:
        apply_budget(r)

    print(f"rtml microbenchmark ({'quick' if args.quick else 'full'}; "
          f"{os.cpu_count()} cpus; Python {platform.python_version()}; "
          f"{'embedded cluster' if args.address is None else 'cluster ' + args.address}; "
          f"wall {wall:.1f} s; 1-min load avg {load_before:.2f} before, {load_after:.2f} after)")
    print(render_table(rows))
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(rows, f, indent=2)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
