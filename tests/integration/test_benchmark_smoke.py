"""benchmarks/micro.py --quick and benchmarks/chaos.py run to completion and report every
row with a real value.

No timing assertions: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MICRO = REPO_ROOT / "benchmarks" / "micro.py"
CHAOS = REPO_ROOT / "benchmarks" / "chaos.py"

EXPECTED_ROWS = [
    "rtml.init() to first result (fresh process)",
    "idle embedded cluster memory (RSS)",
    "single client tasks sync",
    "single client tasks async",
    "multi client tasks async",
    "task chain 1k deep by ObjectRef arg (per hop)",
    "task submitting 100 tasks and getting them",
    "1:1 actor calls sync",
    "1:1 actor calls async",
    "1:1 actor calls concurrent",
    "1:1 async-actor calls async",
    "single client put+get small",
    "single client put calls",
    "single client get calls",
    "single client get object containing 10k refs",
    "single client wait 1k refs",
    "single client put gigabytes",
    "single client get 100MB numpy",
    "numpy.copy 100MB (reference)",
    "single client task 100MB arg by ref",
    "remote task (second node) sync",
    "object transfer 100MB between nodes",
]

VALUE_KEYS = {"latency": ("median_us", "p90_us", "p99_us"), "throughput": ("rate",),
              "memory": ("mb",)}


def is_real(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


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
    assert [r["name"] for r in rows] == EXPECTED_ROWS, "rows missing, extra or out of order"

    for row in rows:
        assert not row.get("na"), f"row not measured: {row}"
        assert row["kind"] in VALUE_KEYS, row
        for key in VALUE_KEYS[row["kind"]]:
            assert is_real(row[key]), (row["name"], key, row)
        # every row is printed in the table too
        assert f"| {row['name']} |" in proc.stdout


@pytest.mark.timeout(330)
def test_chaos_reports_right_results_and_real_times(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    env = {k: v for k, v in os.environ.items() if k != "RTML_ADDRESS"}
    proc = subprocess.run([sys.executable, str(CHAOS), "--rounds", "1", "--tasks", "20000",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO_ROOT),
                          env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    kills, *head_rows = json.loads(out.read_text())
    assert kills["name"] == "worker kills" and kills["wrong"] == 0 and kills["kills"] > 0
    assert [r["name"] for r in head_rows] == [
        "head kill -> task", "head kill -> actor", "head kill -> nodes()",
        "redis kill -> actor", "node kill -> 100 MB rebuilt", "redis memory"]
    *timed, memory = head_rows
    assert all(is_real(r["median_ms"]) and r["rounds"] == 1 for r in timed)
    assert is_real(timed[-1]["first_run_ms"])
    assert memory["tasks"] == 20000 and 0 < memory["before_mb"] <= memory["during_mb"][-1]
