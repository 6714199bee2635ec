"""The compiled hot path or its source (rtml._native), chosen alike in a driver and its workers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import rtml
from rtml._native import GROUP, changed_since_build

ROOT = Path(rtml.__file__).resolve().parent.parent
BUILT = importlib.util.find_spec(f"{GROUP}__mypyc") is not None
"""A compiled build is installed; without a C compiler the install is pure Python."""

PROBE = """
import json, rtml
import rtml.core.owner

@rtml.remote
def where():
    import rtml.worker.executor
    return rtml.BUILD, rtml.worker.executor.__file__

rtml.init(num_cpus=1)
try:
    worker = rtml.get(where.remote(), timeout=60)
finally:
    rtml.shutdown()
print(json.dumps({"driver": [rtml.BUILD, rtml.core.owner.__file__], "worker": worker}))
"""


def _probe(**env: str) -> dict[str, list[str]]:
    clean = {k: v for k, v in os.environ.items() if k != "RTML_PURE_PYTHON"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, env={**clean, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_rtml_pure_python_runs_the_source_in_the_driver_and_its_workers() -> None:
    seen = _probe(RTML_PURE_PYTHON="1")
    expected = "source" if BUILT else "pure"
    assert seen["driver"][0] == seen["worker"][0] == expected
    assert seen["driver"][1].endswith("owner.py")
    assert seen["worker"][1].endswith("executor.py")


def test_a_build_runs_compiled_everywhere_unless_its_sources_changed() -> None:
    seen = _probe()
    if not BUILT:
        expected, suffix = "pure", ".py"
    elif changed_since_build(ROOT):
        expected, suffix = "source", ".py"
    else:
        expected, suffix = "compiled", ".so"
    assert seen["driver"][0] == seen["worker"][0] == expected
    assert seen["driver"][1].endswith(suffix)
    assert seen["worker"][1].endswith(suffix)


def test_an_edit_since_the_build_runs_the_source_and_says_what_to_do() -> None:
    script = """
import warnings, rtml._native as native
native.changed_since_build = lambda root: ["rtml/ids.py"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(native.choose())
import rtml.core.owner
print(rtml.core.owner.__file__)
print(" | ".join(str(w.message) for w in caught))
"""
    clean = {k: v for k, v in os.environ.items() if k != "RTML_PURE_PYTHON"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env=clean)
    assert out.returncode == 0, out.stderr
    choice, owner_file, warned = out.stdout.splitlines()
    if not BUILT:
        assert (choice, warned) == ("pure", "")
        return
    assert choice == "source"
    assert owner_file.endswith("owner.py")
    assert "the compiled build does not match the source (rtml/ids.py)" in warned
    assert "pip install -e ." in warned
