"""Markdown table of median ms per iteration from ``run.py --json`` files, with speedups.

    python benchmarks/rl/summarize.py benchmarks/rl/results/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = [("episode", None), ("fine", 10), ("fine", 50)]
ENGINES = ["serial", "mp", "rtml", "ray", "spark"]


def main(paths: list[str]) -> int:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    median = {(r["engine"], r["mode"], r["k"]): r["median_ms"] for r in runs}
    heads = ["whole episode", "fine K=10", "fine K=50"]
    print("| engine | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for engine in ENGINES:
        if not any(key[0] == engine for key in median):
            continue
        cells = [f"{median[(engine, m, k)]:,.0f}" if (engine, m, k) in median else "n/a"
                 for m, k in COLUMNS]
        print(f"| {engine} | " + " | ".join(cells) + " |")
    print()
    print("| rtml speedup vs | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for other in ["serial", "mp", "ray", "spark"]:
        cells = []
        for m, k in COLUMNS:
            a, b = median.get(("rtml", m, k)), median.get((other, m, k))
            cells.append(f"{b / a:.2f}x" if a and b else "n/a")
        if any(c != "n/a" for c in cells):
            print(f"| {other} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
