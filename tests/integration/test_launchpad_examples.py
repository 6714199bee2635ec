"""examples/launchpad: every example under local_mt, local_mp and rtml, with the same results.

Each example's ``run(launch_type)`` launches its program, waits for it to end and
returns what its nodes saved. A test checks the values (the greetings, the
sum, batching happened, the RL return improved...) under each launch type and
compares them with the local_mt run (exactly where the example is
deterministic to the bit, within float tolerance where a batched matmul may
round differently). The ``rtml`` runs use the module's 2-CPU ``cluster``.
Last, every example runs once as a script (``python examples/launchpad/x.py``),
where its classes and functions live in ``__main__`` and travel by value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO_ROOT / "examples" / "launchpad"
# The examples are imported as ``examples.launchpad.<name>``: node processes (local_mp) and
# rtml workers import them by that name, from the driver's sys.path (set before rtml.init).
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.launchpad import (  # noqa: E402
    agent_learner,
    batched_inference,
    consumer_producers,
    evolution_strategies,
    hello_world,
    parameter_server,
    program_wait,
)

LAUNCH_TYPES = ["local_mt", "local_mp", "rtml"]
REFERENCE = "local_mt"
RUN_TIMEOUT = 60.0  # seconds; each example takes well under 10 s on 2 cores

_results: dict[tuple[str, str], dict[str, Any]] = {}


@pytest.fixture(params=LAUNCH_TYPES)
def launch_type(request: pytest.FixtureRequest) -> str:
    """Each launch type; ``rtml`` runs on the module's cluster."""
    if request.param == "rtml":
        request.getfixturevalue("cluster")
    return str(request.param)


def run(example: ModuleType, launch_type: str) -> dict[str, Any]:
    """The example's result under ``launch_type`` (each pair runs once per module)."""
    key = (example.__name__, launch_type)
    if key not in _results:
        _results[key] = example.run(launch_type, timeout=RUN_TIMEOUT)
    return _results[key]


def test_hello_world(launch_type: str) -> None:
    result = run(hello_world, launch_type)
    assert result == {"client": {"greetings": ["Hello, Ada!", "Hello, Grace!"]}}


def test_consumer_producers(launch_type: str) -> None:
    result = run(consumer_producers, launch_type)["consumer"]
    n = 200_000
    assert result["total"] == sum(k * k for k in range(n))
    assert [part["producer"] for part in result["parts"]] == [f"producer-{i}" for i in range(4)]
    assert [part["range"] for part in result["parts"]] == [
        [0, 50_000], [50_000, 100_000], [100_000, 150_000], [150_000, 200_000]]
    assert result == run(consumer_producers, REFERENCE)["consumer"]


def test_batched_inference(launch_type: str) -> None:
    result = run(batched_inference, launch_type)["collector"]
    num_clients, num_requests = 4, 25
    weights = batched_inference.make_weights()
    for client_id, outputs in enumerate(result["outputs"]):
        expected = batched_inference.client_inputs(client_id, num_requests) @ weights
        np.testing.assert_allclose(outputs, expected, rtol=1e-12, atol=1e-12)
    assert result["requests"] == num_clients * num_requests
    assert result["batched_calls"] < result["requests"], result  # batching happened
    assert 1 < result["largest_batch"] <= num_clients, result
    reference = run(batched_inference, REFERENCE)["collector"]
    np.testing.assert_allclose(result["outputs"], reference["outputs"], rtol=1e-12, atol=1e-12)


def test_program_wait(launch_type: str) -> None:
    result = run(program_wait, launch_type)
    # Every node returned on its own: the tally saved, then the watcher saw the stop.
    assert result == {
        "tally": {"values": [2, 4, 12], "total": 18},
        "watcher": {"wait_for_stop": True, "stop_event_set": True, "stop_handler_ran": True},
    }


def test_agent_learner_improves_the_return(launch_type: str) -> None:
    result = run(agent_learner, launch_type)["evaluator"]
    returns = result["mean_returns"]
    assert len(returns) == agent_learner.Config().generations + 1
    assert returns[0] < 20, returns  # the all-zero policy always pushes left
    assert returns[-1] > returns[0] + 100, returns
    assert result == run(agent_learner, REFERENCE)["evaluator"]


def test_evolution_strategies(launch_type: str) -> None:
    result = run(evolution_strategies, launch_type)["coordinator"]
    config = evolution_strategies.Config()
    curve = result["objective"]
    assert len(curve) == config.generations + 1
    assert curve[0] == pytest.approx(-4.074, abs=1e-3)
    assert curve[-1] > -1e-3, curve[-5:]
    np.testing.assert_allclose(result["theta"], np.linspace(-1, 1, config.dim), atol=0.01)
    assert result == run(evolution_strategies, REFERENCE)["coordinator"]


def _serial_parameter_server(config: Any) -> np.ndarray:
    """The same synchronous SGD in one process, summing gradients in worker order."""
    data = [parameter_server.worker_data(config, j) for j in range(config.num_workers)]
    theta = np.zeros(config.dim)
    for _ in range(config.steps):
        grads = [2.0 / len(y) * x.T @ (x @ theta - y) for x, y in data]
        theta = theta - config.learning_rate * sum(grads) / config.num_workers
    return theta


def test_parameter_server(launch_type: str) -> None:
    result = run(parameter_server, launch_type)["chief"]
    config = parameter_server.Config()
    np.testing.assert_allclose(result["params"], _serial_parameter_server(config),
                               rtol=1e-12, atol=1e-12)
    assert result["distance_to_true"] < 0.01
    assert result == run(parameter_server, REFERENCE)["chief"]


# What each example's main() prints under local_mt (a line it must contain).
SCRIPT_OUTPUT = {
    "hello_world": '"Hello, Ada!"',
    "consumer_producers": '"total": 2666646666700000',
    "batched_inference": "100 requests served by",
    "program_wait": '"total": 18',
    "agent_learner": "mean return per generation: [9.2,",
    "evolution_strategies": "objective: -4.0741 at the start",
    "parameter_server": "distance to the true parameters:",
}


@pytest.mark.parametrize("name", list(SCRIPT_OUTPUT))
def test_runs_as_a_script(name: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RTML_ADDRESS"}
    proc = subprocess.run([sys.executable, str(EXAMPLES_DIR / f"{name}.py"),
                           "--launch-type", "local_mt"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          cwd=str(REPO_ROOT), env=env)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    assert SCRIPT_OUTPUT[name] in proc.stdout, proc.stdout
