"""Evolution strategies: a coordinator and N worker CourierNodes.

    coordinator (PyNode): for each generation
        worker_i.futures.evaluate(theta, g)  -- to every worker at once
        <- [(noise seed, f(theta + sigma eps), f(theta - sigma eps)), ...] per worker
        rebuild each eps from its seed, theta += lr * (centered-rank weighted eps)
    worker_i (CourierNode): draws its perturbations from (seed, g, i, j) and
        scores them on the objective

Only seeds and scores travel back, as in Salimans et al. (2017): the
coordinator regenerates the noise. The objective is a tiny deterministic
one, ``f(theta) = -||theta - target||^2``; the results are gathered in worker
order, so the final ``theta`` is the same under every launch type.

    python examples/launchpad/evolution_strategies.py [--launch-type local_mt|local_mp|rtml]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]



@dataclass(frozen=True)
class Config:
    num_workers: int = 3
    pairs_per_worker: int = 8  # antithetic pairs each worker scores per generation
    generations: int = 60
    dim: int = 10
    sigma: float = 0.1
    learning_rate: float = 0.01
    seed: int = 0


def objective(theta: np.ndarray) -> float:
    """What ES maximizes: 0 at ``target``, negative elsewhere."""
    target = np.linspace(-1.0, 1.0, len(theta))
    return -float(np.sum((theta - target) ** 2))


def noise(config: Config, generation: int, worker_id: int, pair: int) -> np.ndarray:
    """The perturbation of one antithetic pair, regenerated from its indices."""
    return np.random.default_rng([config.seed, generation, worker_id, pair]).standard_normal(
        config.dim)


class Worker:
    """Scores perturbations of ``theta``; only the scores go back."""

    def __init__(self, worker_id: int, config: Config) -> None:
        self.worker_id = worker_id
        self.config = config

    def evaluate(self, theta: np.ndarray, generation: int) -> list[tuple[float, float]]:
        """(f(theta + sigma eps_j), f(theta - sigma eps_j)) for each of this worker's pairs."""
        scores = []
        for pair in range(self.config.pairs_per_worker):
            eps = self.config.sigma * noise(self.config, generation, self.worker_id, pair)
            scores.append((objective(theta + eps), objective(theta - eps)))
        return scores


def centered_ranks(scores: np.ndarray) -> np.ndarray:
    """Scores replaced by their ranks, scaled to [-0.5, 0.5] (robust to their scale)."""
    ranks = np.empty(scores.size)
    ranks[np.argsort(scores.ravel(), kind="stable")] = np.arange(scores.size)
    return (ranks / (scores.size - 1) - 0.5).reshape(scores.shape)


def coordinate(workers: list[Any], config: Config, result_dir: str) -> None:
    """Run ES for ``config.generations``; save the objective curve and theta, stop."""
    theta = np.zeros(config.dim)
    curve = [objective(theta)]
    for generation in range(config.generations):
        futures = [worker.futures.evaluate(theta, generation) for worker in workers]
        scores = np.array([f.result() for f in futures])  # (worker, pair, +/-), worker order
        weights = centered_ranks(scores)
        step = np.zeros(config.dim)
        for worker_id in range(config.num_workers):
            for pair in range(config.pairs_per_worker):
                plus, minus = weights[worker_id, pair]
                step += (plus - minus) * noise(config, generation, worker_id, pair)
        num_pairs = config.num_workers * config.pairs_per_worker
        theta = theta + config.learning_rate / (num_pairs * config.sigma) * step
        curve.append(objective(theta))
    save(result_dir, "coordinator", {"objective": curve, "theta": theta.tolist()})
    lp.stop()


def make_program(result_dir: str, config: Config | None = None) -> lp.Program:
    config = config or Config()
    program = lp.Program("evolution_strategies")
    with program.group("worker"):
        workers = [program.add_node(lp.CourierNode(Worker, i, config))
                   for i in range(config.num_workers)]
    program.add_node(lp.PyNode(coordinate, workers, config, result_dir), label="coordinator")
    return program


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved."""
    return run_program(make_program, launch_type, timeout, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    parser.add_argument("--workers", type=int, default=Config.num_workers)
    args = parser.parse_args(argv)
    result = run(args.launch_type, config=Config(num_workers=args.workers))["coordinator"]
    curve = result["objective"]
    print(f"objective: {curve[0]:.4f} at the start, {curve[-1]:.2e} after "
          f"{len(curve) - 1} generations")
    print("theta:", np.round(result["theta"], 3).tolist())


if __name__ == "__main__":
    main()
