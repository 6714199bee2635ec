"""rtml vs Ray: the same microbenchmark body on both engines, side by side.

    python benchmarks/compare_ray.py [--rounds 2] [--ray-python PY] [--quick] [--json FILE]

Each round runs the benchmark body once per engine, each in its own
subprocess, alternating rtml, ray, rtml, ray, ... so that slow drifts in
machine load hit both engines alike. rtml runs with the current interpreter;
Ray runs with ``--ray-python`` (default: ``$RAY_PYTHON``, else
/work/ray-venv/bin/python), a separate virtualenv: Ray is never a dependency
of rtml. If that interpreter cannot ``import ray``, only rtml is run.

The body (``bench``) is one function that receives the engine module
(``import rtml as engine`` or ``import ray as engine``) and uses only the API
the two share: ``init(num_cpus=2)``, ``remote``, ``get``, ``put`` and actors.
Row names follow Ray's ``ray microbenchmark``. The parent takes the median of
each row across rounds per engine and prints: row | rtml | ray | ratio | winner,
where ratio is ray/rtml for latencies and rtml/ray for rates, so a ratio > 1
always means rtml is better.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The timing helpers are micro.py's (stdlib only at import, so the Ray venv can load them).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from micro import (  # noqa: E402
    ACTOR_ASYNC,
    ACTOR_SYNC,
    BIG_BYTES,
    GET_BIG,
    GET_CALLS,
    PUT_CALLS,
    PUT_GB,
    REMOTE_NODE,
    TASKS_ASYNC,
    TASKS_SYNC,
    TRANSFER,
    bench_two_nodes,
    latency_row,
    now_ns,
    rate_row,
    time_each,
)
from micro import best_rate as _best_rate  # noqa: E402


def best_rate(fn: Callable[[], Any], items: int, repeats: int) -> float:
    """Best items/s over ``repeats`` runs of ``fn``."""
    return _best_rate(fn, items, repeats)[0]


REPO_ROOT = Path(__file__).resolve().parent.parent
THIS_FILE = Path(__file__).resolve()
DEFAULT_RAY_PYTHON = "/work/ray-venv/bin/python"
ENGINES = ("rtml", "ray")
ROWS_MARK = "COMPARE_ROWS "

INIT_FRESH = "init to first result"
ROW_NAMES = [TASKS_SYNC, TASKS_ASYNC, ACTOR_SYNC, ACTOR_ASYNC, PUT_CALLS, GET_CALLS,
             PUT_GB, GET_BIG, INIT_FRESH, REMOTE_NODE, TRANSFER]


def init_kwargs(engine_name: str) -> dict[str, Any]:
    """The same cluster shape for both engines: 2 CPUs, embedded."""
    if engine_name == "ray":
        return {"num_cpus": 2, "include_dashboard": False}
    return {"num_cpus": 2}


def child_env(engine_name: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RTML_ADDRESS", None)  # embedded, whatever the caller's shell says
    env.pop("RAY_ADDRESS", None)
    if engine_name == "ray":
        env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


# ---------------------------------------------------------------- the shared body

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


def bench_fresh_init(engine_name: str, runs: int) -> dict[str, Any]:
    """Import + init + first task result, in a fresh process of this interpreter."""
    script = FRESH_SCRIPT.format(engine=engine_name, kwargs=init_kwargs(engine_name))
    samples_ns = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120, env=child_env(engine_name),
                              cwd=str(REPO_ROOT))  # never a stray "rtml" dir on sys.path
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ELAPSED ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"fresh-process init failed (rc={proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}")
        samples_ns.append(int(float(lines[-1].split()[1]) * 1e9))
    return latency_row(INIT_FRESH, samples_ns)


def bench(engine: Any, engine_name: str, quick: bool) -> list[dict[str, Any]]:
    """The benchmark body, identical for both engines: ``engine`` is the module."""
    import numpy as np

    rows: list[dict[str, Any]] = []
    # First, before this process starts its own cluster, so the fresh processes
    # do not compete with a running cluster for the 2 cores.
    rows.append(bench_fresh_init(engine_name, runs=3))

    engine.init(**init_kwargs(engine_name))
    try:
        @engine.remote
        def noop() -> None:
            return None

        @engine.remote
        class Actor:
            def noop(self) -> None:
                return None

        # -- no-op task round trip, one at a time
        n_sync = 300 if quick else 2000
        s = time_each(lambda: engine.get(noop.remote()), n_sync, warmup=200)
        rows.append(latency_row(TASKS_SYNC, s))

        # -- no-op throughput, 5,000 in flight, best of 3
        n_async = 5000
        engine.get([noop.remote() for _ in range(500)])
        rows.append(rate_row(TASKS_ASYNC, best_rate(
            lambda: engine.get([noop.remote() for _ in range(n_async)]), n_async, 3), "tasks/s"))

        # -- actor calls: one at a time, then 1,000 pipelined (best of 3)
        actor = Actor.remote()
        engine.get(actor.noop.remote())
        n_actor = 300 if quick else 2000
        s = time_each(lambda: engine.get(actor.noop.remote()), n_actor, warmup=200)
        rows.append(latency_row(ACTOR_SYNC, s))
        n_pipe = 1000
        rows.append(rate_row(ACTOR_ASYNC, best_rate(
            lambda: engine.get([actor.noop.remote() for _ in range(n_pipe)]), n_pipe, 3),
            "calls/s"))

        # -- small objects: put(0) calls, get of one ready small ref
        n_calls = 1000 if quick else 5000

        def put_many() -> None:
            for _ in range(n_calls):
                engine.put(0)
        put_many()  # warm-up
        rows.append(rate_row(PUT_CALLS, best_rate(put_many, n_calls, 3), "puts/s"))
        small_ref = engine.put(0)

        def get_many() -> None:
            for _ in range(n_calls):
                engine.get(small_ref)
        get_many()  # warm-up
        rows.append(rate_row(GET_CALLS, best_rate(get_many, n_calls, 3), "gets/s"))

        # -- 100 MB numpy array: put (GB/s, median), get (latency)
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
        rows.append(rate_row(PUT_GB, BIG_BYTES / 1e9 / med_put_s, "GB/s"))

        big_ref = engine.put(arr)
        first = engine.get(big_ref)
        assert first.nbytes == BIG_BYTES
        del first
        n_big_get = 20 if quick else 100

        def get_big() -> None:
            v = engine.get(big_ref)
            del v
        rows.append(latency_row(GET_BIG, time_each(get_big, n_big_get)))
    finally:
        engine.shutdown()
    rows += bench_two_nodes(engine, engine_name, quick)
    return rows


def child_main(engine_name: str, quick: bool) -> int:
    if engine_name == "ray":
        import ray as engine
    else:
        import rtml as engine
    version = getattr(engine, "__version__", "?")
    rows = bench(engine, engine_name, quick)
    print(ROWS_MARK + json.dumps({"engine": engine_name, "version": version, "rows": rows}),
          flush=True)
    return 0


# ---------------------------------------------------------------- the parent

def ray_available(python: str) -> str | None:
    """Ray's version under ``python``, or None when it cannot import ray."""
    try:
        proc = subprocess.run([python, "-c", "import ray; print(ray.__version__)"],
                              capture_output=True, text=True, timeout=120,
                              env=child_env("ray"), cwd=str(REPO_ROOT))
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else None


def run_child(engine_name: str, python: str, quick: bool) -> dict[str, Any] | None:
    cmd = [python, str(THIS_FILE), "--child", engine_name] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env=child_env(engine_name), cwd=str(REPO_ROOT))
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(ROWS_MARK)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        print(f"  {engine_name}: FAILED (rc={proc.returncode}, {wall:.0f} s)\n{tail}",
              file=sys.stderr, flush=True)
        return None
    out = json.loads(lines[-1][len(ROWS_MARK):])
    out["wall_s"] = wall
    return out


def headline(row: dict[str, Any]) -> float:
    return row["median_us"] if row["kind"] == "latency" else row["rate"]


def fmt_us(v: float) -> str:
    if v >= 100_000:
        return f"{v / 1e6:.2f} s"
    if v >= 10_000:
        return f"{v / 1e3:.1f} ms"
    return f"{v:,.0f} us" if v >= 100 else f"{v:.1f} us"


def fmt_value(kind: str, unit: str, v: float | None, p90: float | None = None) -> str:
    if v is None:
        return "-"
    if kind == "latency":
        s = fmt_us(v)
        return s if p90 is None else f"{s} (p90 {fmt_us(p90)})"
    return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.2f} {unit}"


def aggregate(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """engine -> row name -> median across rounds of the headline (and p90)."""
    agg: dict[str, dict[str, dict[str, Any]]] = {}
    for engine_name, runs in results.items():
        per_row: dict[str, dict[str, Any]] = {}
        for name in ROW_NAMES:
            rows = [r for run in runs for r in run["rows"] if r["name"] == name]
            if not rows:
                continue
            per_row[name] = {
                "kind": rows[0]["kind"], "unit": rows[0]["unit"],
                "value": statistics.median(headline(r) for r in rows),
                "p90": (statistics.median(r["p90_us"] for r in rows)
                        if rows[0]["kind"] == "latency" else None),
                "rounds": [headline(r) for r in rows],
            }
        agg[engine_name] = per_row
    return agg


def render(agg: dict[str, dict[str, dict[str, Any]]]) -> str:
    rt, ry = agg.get("rtml", {}), agg.get("ray", {})
    header = ["row", "rtml", "ray", "ratio", "winner"]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name in ROW_NAMES:
        a, b = rt.get(name), ry.get(name)
        ref = a or b
        if ref is None:
            continue
        kind, unit = ref["kind"], ref["unit"]
        cells = [name,
                 fmt_value(kind, unit, a["value"], a["p90"]) if a else "-",
                 fmt_value(kind, unit, b["value"], b["p90"]) if b else "-"]
        if a and b and a["value"] and b["value"]:
            ratio = (b["value"] / a["value"]) if kind == "latency" else (a["value"] / b["value"])
            winner = "tie" if 0.95 <= ratio <= 1.05 else ("rtml" if ratio > 1 else "ray")
            cells += [f"{ratio:.2f}x", winner]
        else:
            cells += ["-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of rtml, ray (default 2)")
    p.add_argument("--ray-python", default=os.environ.get("RAY_PYTHON") or DEFAULT_RAY_PYTHON,
                   help="interpreter of the virtualenv that has ray "
                        "(default: $RAY_PYTHON or %(default)s)")
    p.add_argument("--quick", action="store_true", help="fewer samples (whole run < ~2 min)")
    p.add_argument("--json", dest="json_file", default=None, help="write raw results here")
    p.add_argument("--child", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        return child_main(args.child, args.quick)

    ray_ver = ray_available(args.ray_python)
    engines: list[tuple[str, str]] = [("rtml", sys.executable)]
    if ray_ver is None:
        print(f"Ray is unavailable ({args.ray_python} cannot import ray): running rtml only.")
    else:
        engines.append(("ray", args.ray_python))

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in engines}
    versions: dict[str, str] = {}
    failed = False
    for rnd in range(1, args.rounds + 1):
        for name, python in engines:
            print(f"round {rnd}/{args.rounds}: {name} ...", end=" ", flush=True)
            res = run_child(name, python, args.quick)
            if res is None:
                failed = True
                continue
            results[name].append(res)
            versions[name] = res["version"]
            summary = ", ".join(
                f"{r['name'].replace('single client ', '')} "
                f"{fmt_value(r['kind'], r['unit'], headline(r))}" for r in res["rows"]
                if r["name"] in (TASKS_SYNC, TASKS_ASYNC, ACTOR_SYNC))
            print(f"{res['wall_s']:.0f} s ({summary})", flush=True)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()

    agg = aggregate(results)
    vs = " vs ".join(f"{n} {versions.get(n, '?')}" for n, _ in engines)
    print()
    print(f"{vs}: {'quick' if args.quick else 'full'}; {args.rounds} round(s) alternating "
          f"{', '.join(n for n, _ in engines)}; median across rounds; num_cpus=2; "
          f"{os.cpu_count()} cpus; Python {platform.python_version()} (rtml); "
          f"wall {wall:.0f} s; load avg {'/'.join(f'{x:.2f}' for x in load_before)} before, "
          f"{'/'.join(f'{x:.2f}' for x in load_after)} after")
    print("ratio: ray/rtml for latencies, rtml/ray for rates (> 1 means rtml is better)")
    print(render(agg))
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump({"versions": versions, "results": results, "aggregate": agg}, f, indent=2)
    if failed or not results["rtml"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
