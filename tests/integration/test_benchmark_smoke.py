"""benchmarks/micro.py --quick runs to completion and reports every row (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MICRO = REPO_ROOT / "benchmarks" / "micro.py"

EXPECTED_ROWS = [
    "rtml.init() to first result (fresh process)",
    "single client tasks sync",
    "single client tasks async",
    "1:1 actor calls sync",
    "1:1 actor calls async",
    "single client put+get small",
    "single client put calls",
    "single client get calls",
    "single client put gigabytes",
    "single client get 100MB numpy",
    "numpy.copy 100MB (reference)",
    "single client task 100MB arg by ref",
    "remote task (second node) sync",
    "object transfer 100MB between nodes",
]


@pytest.mark.timeout(330)
def test_micro_quick_reports_every_row(tmp_path: Path) -> None:
    out = tmp_path / "micro.json"
    env = {k: v for k, v in os.environ.items() if k != "RTML_ADDRESS"}
    proc = subprocess.run([sys.executable, str(MICRO), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO_ROOT),
                          env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    rows = json.loads(out.read_text())
    assert isinstance(rows, list)
    by_name = {r["name"]: r for r in rows}
    missing = [n for n in EXPECTED_ROWS if n not in by_name]
    assert not missing, f"rows missing from the JSON: {missing}"

    for name in EXPECTED_ROWS:
        row = by_name[name]
        if row["kind"] == "latency":
            for key in ("median_us", "p90_us", "p99_us"):
                assert isinstance(row[key], (int, float)) and row[key] > 0, (name, key, row)
        else:
            assert row["kind"] == "throughput", row
            assert isinstance(row["rate"], (int, float)) and row["rate"] > 0, (name, row)
        # every row is printed in the table too
        assert name in proc.stdout
