"""rtml vs Ray: the same microbenchmark body on both engines, side by side.

    python benchmarks/compare_ray.py [--rounds 2] [--ray-python PY] [--quick] [--json FILE]

Each round runs the benchmark body once per engine, each in its own
subprocess, alternating rtml, ray, rtml, ray, ... so that slow drifts in
machine load hit both engines alike. rtml runs with the current interpreter;
Ray runs with ``--ray-python`` (default: ``$RAY_PYTHON``, else
/work/ray-venv/bin/python), a separate virtualenv: Ray is never a dependency
of rtml. If that interpreter cannot ``import ray``, only rtml is run.

The body is micro.py's ``bench``: one function that receives the engine module
(``import rtml as engine`` or ``import ray as engine``) and uses only the API
the two share (``init(num_cpus=2)``, ``remote``, ``get``, ``put``, ``wait``, actors,
``.options(...)``), so both engines report the same rows. Row names follow Ray's
``ray microbenchmark``. The parent takes the median of each row across rounds per
engine and prints: row | rtml | ray | ratio | winner, where ratio is ray/rtml for
latencies and memory and rtml/ray for rates, so a ratio > 1 always means rtml is
better. A row an engine could not measure prints as n/a with the reason.
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
from pathlib import Path
from typing import Any

# The benchmark body is micro.py's (stdlib only at import, so the Ray venv can load it).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from micro import (  # noqa: E402
    ACTOR_SYNC,
    REPO_ROOT,
    ROW_NAMES,
    TASKS_ASYNC,
    TASKS_SYNC,
    bench,
    child_env,
)

THIS_FILE = Path(__file__).resolve()
DEFAULT_RAY_PYTHON = "/work/ray-venv/bin/python"
ENGINES = ("rtml", "ray")
ROWS_MARK = "COMPARE_ROWS "


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


LOWER_IS_BETTER = ("latency", "memory")


def headline(row: dict[str, Any]) -> float:
    """The one number of a measured row: median latency, rate or size."""
    return {"latency": row["median_us"], "memory": row["mb"]}.get(row["kind"], row["rate"])


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
    """engine -> row name -> median across rounds of the headline (and p90), or the reason
    the row is n/a."""
    agg: dict[str, dict[str, dict[str, Any]]] = {}
    for engine_name, runs in results.items():
        per_row: dict[str, dict[str, Any]] = {}
        for name in ROW_NAMES:
            rows = [r for run in runs for r in run["rows"] if r["name"] == name]
            measured = [r for r in rows if not r.get("na")]
            if not measured:
                per_row[name] = {"na": rows[0]["note"] if rows else "not reported"}
                continue
            per_row[name] = {
                "kind": measured[0]["kind"], "unit": measured[0]["unit"],
                "value": statistics.median(headline(r) for r in measured),
                "p90": (statistics.median(r["p90_us"] for r in measured)
                        if measured[0]["kind"] == "latency" else None),
                "rounds": [headline(r) for r in measured],
            }
        agg[engine_name] = per_row
    return agg


def fmt_cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"  # the engine did not run
    if "na" in entry:
        return f"n/a ({entry['na']})"
    return fmt_value(entry["kind"], entry["unit"], entry["value"], entry["p90"])


def render(agg: dict[str, dict[str, dict[str, Any]]]) -> str:
    rt, ry = agg.get("rtml", {}), agg.get("ray", {})
    header = ["row", "rtml", "ray", "ratio", "winner"]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name in ROW_NAMES:
        a, b = rt.get(name), ry.get(name)
        cells = [name, fmt_cell(a), fmt_cell(b)]
        if a and b and a.get("value") and b.get("value"):
            lower_better = a["kind"] in LOWER_IS_BETTER
            ratio = (b["value"] / a["value"]) if lower_better else (a["value"] / b["value"])
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
    p.add_argument("--quick", action="store_true", help="fewer samples")
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
                if r["name"] in (TASKS_SYNC, TASKS_ASYNC, ACTOR_SYNC) and not r.get("na"))
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
    print("ratio: ray/rtml for latencies and memory, rtml/ray for rates "
          "(> 1 means rtml is better)")
    print(render(agg))
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump({"versions": versions, "results": results, "aggregate": agg}, f, indent=2)
    if failed or not results["rtml"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
