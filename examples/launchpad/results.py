"""What the Launchpad examples share: nodes save their results, ``run_program`` collects them.

Every launch type of these examples runs on this machine, so a node that finishes
the work writes ``<result_dir>/<name>.json`` and the launching process reads the
files once the program has ended.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rtml.launchpad as lp

LAUNCH_TYPES = ("local_mt", "local_mp", "rtml")


def save(result_dir: str, name: str, value: Any) -> None:
    """Save one node's result as ``<result_dir>/<name>.json``."""
    Path(result_dir, f"{name}.json").write_text(json.dumps(value))


def run_program(make_program: Callable[..., lp.Program], launch_type: str = "local_mt",
                timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch ``make_program(result_dir, **options)``, wait for it, return what was saved.

    Raises what a node raised, or TimeoutError if the program is still running
    after ``timeout`` seconds (it is stopped first).
    """
    with tempfile.TemporaryDirectory() as result_dir:
        handle = lp.launch(make_program(result_dir, **options), launch_type=launch_type)
        if not handle.wait(timeout):
            handle.stop()
            handle.wait(handle.grace_period + 5)
            raise TimeoutError(f"the program was still running after {timeout:g} s")
        return {p.stem: json.loads(p.read_text()) for p in Path(result_dir).glob("*.json")}
