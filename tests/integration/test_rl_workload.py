"""benchmarks/rl: serial and rtml compute the same ES rewards on CartPole-v1 (no timing checks).

Runs ``benchmarks/rl/run.py`` as scripts (as a user would): 2 iterations of whole-episode
mode and 1 iteration of fine-grained mode (K = 50) on each engine, then compares the
per-iteration rewards exactly. Needs gymnasium, not pyspark or ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gymnasium")

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = REPO_ROOT / "benchmarks" / "rl" / "run.py"


def _run(tmp_path: Path, engine: str, mode: str, iterations: int) -> dict[str, Any]:
    out = tmp_path / f"{engine}-{mode}.json"
    env = {k: v for k, v in os.environ.items() if k != "RTML_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, str(RUN), "--engine", engine, "--mode", mode, "--k", "50",
         "--iterations", str(iterations), "--no-warmup", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT), env=env)
    assert proc.returncode == 0, f"{engine} {mode} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


@pytest.mark.timeout(240)
def test_serial_and_rtml_compute_identical_rewards(tmp_path: Path) -> None:
    runs = {(engine, mode): _run(tmp_path, engine, mode, 2 if mode == "episode" else 1)
            for engine in ("serial", "rtml") for mode in ("episode", "fine")}

    serial_ep, rtml_ep = runs["serial", "episode"], runs["rtml", "episode"]
    assert len(serial_ep["rewards"]) == 2
    for rewards in serial_ep["rewards"]:
        assert len(rewards) == 32
        assert all(1.0 <= r <= 500.0 and r == int(r) for r in rewards)
    assert len(set(serial_ep["rewards"][0])) > 1  # the perturbations really differ
    assert rtml_ep["rewards"] == serial_ep["rewards"]
    assert rtml_ep["theta"] == serial_ep["theta"]

    serial_fine, rtml_fine = runs["serial", "fine"], runs["rtml", "fine"]
    assert len(serial_fine["rewards"]) == len(rtml_fine["rewards"]) == 1
    assert rtml_fine["rewards"] == serial_fine["rewards"]
    assert rtml_fine["theta"] == serial_fine["theta"]
    # Chained K-step tasks replay exactly the whole episodes of iteration 0.
    assert serial_fine["rewards"][0] == serial_ep["rewards"][0]
