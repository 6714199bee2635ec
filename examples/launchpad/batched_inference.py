"""Batched inference: concurrent calls of a server's ``infer`` become one matmul per batch.

    client_0 --server.infer(x)--+
    client_1 --server.infer(x)--+--> lp.batched_handler --> x_batch @ W (one matmul)
    client_N --server.infer(x)--+        each client gets its own row back
    every client --collector.report(id, outputs)--> collector (CourierNode with run()):
        once all reported: server.stats() (requests vs batched calls), save, lp.stop()

The server wraps its batch function in ``__init__``, as Launchpad's batching
example does: ``self.infer = lp.batched_handler(batch_size, timeout)(self._infer_batch)``.
A client's call blocks until its batch is full (``batch_size`` calls) or
``timeout`` seconds have passed since the batch's first call.

    python examples/launchpad/batched_inference.py [--launch-type local_mt|local_mp|rtml]
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import numpy as np

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]

DIM_IN, DIM_OUT = 8, 3
SEED = 0
WAIT_TIMEOUT = 60.0  # seconds the collector waits for the clients


def make_weights(seed: int = SEED) -> np.ndarray:
    """The model: one (DIM_IN, DIM_OUT) matrix."""
    return np.random.default_rng(seed).standard_normal((DIM_IN, DIM_OUT))


def client_inputs(client_id: int, num_requests: int, seed: int = SEED) -> np.ndarray:
    """The inputs client ``client_id`` sends, one row per request."""
    return np.random.default_rng([seed, client_id]).standard_normal((num_requests, DIM_IN))


class InferenceServer:
    """Serves ``infer(x)`` for one input row; rows of concurrent calls are batched."""

    def __init__(self, batch_size: int, timeout: float) -> None:
        self.weights = make_weights()
        self.requests = 0
        self.batched_calls = 0
        self.largest_batch = 0
        self._lock = threading.Lock()
        self.infer = lp.batched_handler(batch_size=batch_size, timeout=timeout)(
            self._infer_batch)

    def _infer_batch(self, x: np.ndarray) -> np.ndarray:
        """``x`` holds one row per call (batch, DIM_IN); returns (batch, DIM_OUT)."""
        with self._lock:
            self.requests += len(x)
            self.batched_calls += 1
            self.largest_batch = max(self.largest_batch, len(x))
        return x @ self.weights

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"requests": self.requests, "batched_calls": self.batched_calls,
                    "largest_batch": self.largest_batch}


def query(client_id: int, num_requests: int, server: Any, collector: Any) -> None:
    """A client: one blocking ``infer`` call per input row, then report the outputs."""
    outputs = [server.infer(x) for x in client_inputs(client_id, num_requests)]
    collector.report(client_id, np.stack(outputs).tolist())


class Collector:
    """Gathers the clients' outputs; its ``run()`` saves the result and stops the program."""

    def __init__(self, num_clients: int, server: Any, result_dir: str) -> None:
        self.num_clients = num_clients
        self.server = server
        self.result_dir = result_dir
        self._outputs: dict[int, list[list[float]]] = {}
        self._changed = threading.Condition()

    def report(self, client_id: int, outputs: list[list[float]]) -> None:
        with self._changed:
            self._outputs[client_id] = outputs
            self._changed.notify_all()

    def run(self) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._outputs) == self.num_clients,
                                          WAIT_TIMEOUT):
                raise TimeoutError(f"only {len(self._outputs)} of {self.num_clients} clients "
                                   f"reported within {WAIT_TIMEOUT:g} s")
        outputs = [self._outputs[i] for i in range(self.num_clients)]
        save(self.result_dir, "collector", {"outputs": outputs, **self.server.stats()})
        lp.stop()


def make_program(result_dir: str, num_clients: int = 4, num_requests: int = 25,
                 batch_size: int | None = None, timeout: float = 0.05) -> lp.Program:
    """``batch_size`` defaults to ``num_clients``: one request of each client per batch."""
    program = lp.Program("batched_inference")
    server = program.add_node(
        lp.CourierNode(InferenceServer, batch_size or num_clients, timeout), label="server")
    collector = program.add_node(lp.CourierNode(Collector, num_clients, server, result_dir),
                                 label="collector")
    with program.group("client"):
        for i in range(num_clients):
            program.add_node(lp.PyNode(query, i, num_requests, server, collector))
    return program


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved."""
    return run_program(make_program, launch_type, timeout, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    result = run(args.launch_type, num_clients=args.clients)["collector"]
    print(f"{result['requests']} requests served by {result['batched_calls']} batched calls "
          f"(largest batch {result['largest_batch']})")
    print("first output of each client:", [rows[0] for rows in result["outputs"]])


if __name__ == "__main__":
    main()
