"""Check that runs of ``run.py --json`` computed identical rewards.

    python benchmarks/rl/check_same.py out/*.json

Every run starts from the same theta and seeds, so all of them (any engine, any mode, any K)
must produce the same 32 rewards at every iteration they share, and, if they ran the same
number of iterations, the same final parameters (compared exactly, not approximately).
Exits 1 on any difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def label(run: dict[str, Any]) -> str:
    return f"{run['engine']} {run['mode']}" + (f" K={run['k']}" if run["mode"] == "fine" else "")


def compare(runs: list[dict[str, Any]]) -> list[str]:
    """Differences between the runs and the first one (an empty list: all identical)."""
    problems = []
    ref = runs[0]
    for run in runs[1:]:
        n = min(len(ref["rewards"]), len(run["rewards"]))
        for t in range(n):
            if ref["rewards"][t] != run["rewards"][t]:
                problems.append(f"{label(run)} differs from {label(ref)} at iteration {t}: "
                                f"{run['rewards'][t]} vs {ref['rewards'][t]}")
                break
        if len(ref["rewards"]) == len(run["rewards"]) and ref["theta"] != run["theta"]:
            problems.append(f"{label(run)}: final theta differs from {label(ref)}")
    return problems


def main(paths: list[str]) -> int:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    if len(runs) < 2:
        print("need at least two JSON files", file=sys.stderr)
        return 2
    problems = compare(runs)
    for run in runs:
        print(f"{label(run):<22} {len(run['rewards']):>2} iterations  mean reward "
              f"{[round(x, 2) for x in run['mean_rewards']]}")
    if problems:
        print("DIFFERENT:\n  " + "\n  ".join(problems))
        return 1
    total = sum(len(r["rewards"]) * len(r["rewards"][0]) for r in runs)
    print(f"IDENTICAL: {len(runs)} runs, {total} episode rewards, all equal per iteration "
          f"(and final theta equal where the iteration counts match)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
