"""Parameter server: K shard nodes hold slices of the parameters, M workers train on them.

    worker_j (PyNode, holds [shard_0 .. shard_K-1], a list of handles): each step t
        theta = concat(shard_k.pull(t) for every shard)       (futures, all at once)
        grad  = gradient of its own least-squares data at theta
        shard_k.push(t, j, grad[slice_k]) for every shard      (futures, then wait)
    shard_k (CourierNode): once all M gradients of step t are in, applies their
        mean (summed in worker order), which makes version t + 1 for pull()
    chief (PyNode): pulls version T from every shard, saves it, lp.stop()

Training is synchronous (a pull of step t waits for every push of step t - 1)
and each shard sums the gradients in worker-id order, so the final
parameters are the same, bit for bit, under every launch type.

    python examples/launchpad/parameter_server.py [--launch-type local_mt|local_mp|rtml]
"""

from __future__ import annotations

import argparse
import itertools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]

WAIT_TIMEOUT = 60.0  # seconds a pull waits for its version before giving up


@dataclass(frozen=True)
class Config:
    num_shards: int = 3
    num_workers: int = 3
    dim: int = 12
    samples_per_worker: int = 64
    steps: int = 40
    learning_rate: float = 0.1
    seed: int = 0

    def bounds(self) -> list[int]:
        """Shard k holds ``theta[bounds[k]:bounds[k + 1]]``."""
        return [self.dim * k // self.num_shards for k in range(self.num_shards + 1)]


def true_params(config: Config) -> np.ndarray:
    return np.random.default_rng(config.seed).standard_normal(config.dim)


def worker_data(config: Config, worker_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``worker_id``'s share of a noisy linear-regression data set."""
    rng = np.random.default_rng([config.seed, worker_id])
    x = rng.standard_normal((config.samples_per_worker, config.dim))
    y = x @ true_params(config) + 0.01 * rng.standard_normal(config.samples_per_worker)
    return x, y


class Shard:
    """One slice of the parameters; versions advance once every worker has pushed."""

    def __init__(self, size: int, num_workers: int, learning_rate: float) -> None:
        self.num_workers = num_workers
        self.learning_rate = learning_rate
        self._params = np.zeros(size)
        self._version = 0
        self._grads: dict[int, np.ndarray] = {}
        self._changed = threading.Condition()

    def pull(self, version: int) -> np.ndarray:
        """The slice at ``version`` (waits until every gradient before it is applied)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._version >= version, WAIT_TIMEOUT):
                raise TimeoutError(f"version {version} not reached within {WAIT_TIMEOUT:g} s "
                                   f"(at {self._version})")
            if self._version != version:
                raise RuntimeError(f"pull({version}) after the shard moved to {self._version}")
            return self._params.copy()

    def push(self, step: int, worker_id: int, grad: np.ndarray) -> None:
        with self._changed:
            if step != self._version:
                raise RuntimeError(f"worker {worker_id} pushed step {step} to a shard at "
                                   f"version {self._version}")
            self._grads[worker_id] = grad
            if len(self._grads) == self.num_workers:
                total = sum(self._grads[j] for j in sorted(self._grads))  # fixed order
                self._params = self._params - self.learning_rate * total / self.num_workers
                self._grads.clear()
                self._version += 1
                self._changed.notify_all()


def pull_all(shards: list[Any], version: int) -> np.ndarray:
    """The whole parameter vector at ``version``, pulled from every shard at once."""
    return np.concatenate([f.result() for f in [s.futures.pull(version) for s in shards]])


def train(worker_id: int, shards: list[Any], config: Config) -> None:
    """A worker: ``config.steps`` synchronous steps of gradient descent on its data."""
    x, y = worker_data(config, worker_id)
    bounds = config.bounds()
    for step in range(config.steps):
        theta = pull_all(shards, step)
        grad = 2.0 / len(y) * x.T @ (x @ theta - y)
        pushes = [shard.futures.push(step, worker_id, grad[lo:hi])
                  for shard, (lo, hi) in zip(shards, itertools.pairwise(bounds), strict=True)]
        for push in pushes:
            push.result()  # re-raises a shard's error here


def chief(shards: list[Any], config: Config, result_dir: str) -> None:
    """Wait for the final parameters, save them with their error, stop the program."""
    theta = pull_all(shards, config.steps)
    save(result_dir, "chief", {
        "params": theta.tolist(),
        "distance_to_true": float(np.linalg.norm(theta - true_params(config))),
    })
    lp.stop()


def make_program(result_dir: str, config: Config | None = None) -> lp.Program:
    config = config or Config()
    program = lp.Program("parameter_server")
    bounds = config.bounds()
    with program.group("shard"):
        shards = [program.add_node(lp.CourierNode(Shard, hi - lo, config.num_workers,
                                                  config.learning_rate))
                  for lo, hi in itertools.pairwise(bounds)]
    with program.group("worker"):
        for j in range(config.num_workers):
            program.add_node(lp.PyNode(train, j, shards, config))
    program.add_node(lp.PyNode(chief, shards, config, result_dir), label="chief")
    return program


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved."""
    return run_program(make_program, launch_type, timeout, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    args = parser.parse_args(argv)
    result = run(args.launch_type)["chief"]
    print(f"distance to the true parameters: {result['distance_to_true']:.3e}")
    print("params:", np.round(result["params"], 4).tolist())


if __name__ == "__main__":
    main()
