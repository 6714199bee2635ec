"""Agent / learner RL on CartPole-v1: actors, a replay node, a learner and an evaluator.

    learner (CourierNode, run() trains)        replay (CourierNode)
      params(g) -> (mean, std) of generation g     add(trajectory)
      run(): for each generation g:                sample(g, n): generation g's n
        publish g, replay.sample(g, n),              trajectories, in (actor, episode)
        cross-entropy update -> g + 1                order, once all have arrived
    actor_i (PyNode): per generation, learner.params(g), run episodes with
        policies drawn around them, replay.add(each trajectory)
    evaluator (PyNode): learner.params(g) for every g, mean return of the mean
        policy over fixed episodes; saves the curve, lp.stop()

The policy is linear: ``action = obs @ w + b > 0`` (5 parameters). The learner
runs the cross-entropy method: the mean and spread of the best quarter of each
generation's policies become the next generation's. Every random draw is
seeded from (seed, generation, actor, episode) and the learner sorts what it
samples, so the run is the same under every launch type, however the nodes
interleave.

    python examples/launchpad/agent_learner.py [--launch-type local_mt|local_mp|rtml]
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]

NUM_PARAMS = 5  # 4 weights and a bias
EVAL_SEED = 10_000  # the evaluator's episodes use seeds EVAL_SEED, EVAL_SEED + 1, ...
WAIT_TIMEOUT = 60.0  # seconds a node waits for another's data before giving up


@dataclass(frozen=True)
class Config:
    num_actors: int = 2
    episodes_per_actor: int = 10  # per generation
    generations: int = 10
    elite_fraction: float = 0.25
    extra_std: float = 0.1  # added to the elites' spread so the search keeps exploring
    eval_episodes: int = 5
    seed: int = 0

    @property
    def population(self) -> int:
        return self.num_actors * self.episodes_per_actor


@dataclass
class Trajectory:
    generation: int
    actor: int
    episode: int
    params: np.ndarray
    rewards: np.ndarray  # one per step


def make_env() -> Any:
    """A CartPole-v1 env (each actor and the evaluator steps its own)."""
    import gymnasium

    return gymnasium.make("CartPole-v1")


def rollout(env: Any, params: np.ndarray, seed: int) -> np.ndarray:
    """Play one episode of ``env`` with the linear policy ``params``; its rewards."""
    obs, _ = env.reset(seed=seed)
    rewards = []
    done = False
    while not done:
        action = int(obs @ params[:4] + params[4] > 0)
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        done = terminated or truncated
    return np.asarray(rewards)


class Replay:
    """Holds trajectories until the learner samples their generation."""

    def __init__(self) -> None:
        self._by_generation: dict[int, list[Trajectory]] = {}
        self._changed = threading.Condition()

    def add(self, trajectory: Trajectory) -> None:
        with self._changed:
            self._by_generation.setdefault(trajectory.generation, []).append(trajectory)
            self._changed.notify_all()

    def sample(self, generation: int, count: int) -> list[Trajectory]:
        """The ``count`` trajectories of ``generation`` in (actor, episode) order (removed)."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: len(self._by_generation.get(generation, [])) >= count,
                    WAIT_TIMEOUT):
                raise TimeoutError(f"generation {generation}: fewer than {count} "
                                   f"trajectories after {WAIT_TIMEOUT:g} s")
            batch = self._by_generation.pop(generation)
        return sorted(batch, key=lambda t: (t.actor, t.episode))


class Learner:
    """Publishes each generation's search distribution; ``run()`` trains."""

    def __init__(self, replay: Any, config: Config) -> None:
        self.replay = replay
        self.config = config
        self._published: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._changed = threading.Condition()

    def params(self, generation: int) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of ``generation``, once the learner has computed it."""
        with self._changed:
            if not self._changed.wait_for(lambda: generation in self._published,
                                          WAIT_TIMEOUT):
                raise TimeoutError(f"generation {generation} not published within "
                                   f"{WAIT_TIMEOUT:g} s")
            return self._published[generation]

    def run(self) -> None:
        mean, std = np.zeros(NUM_PARAMS), np.ones(NUM_PARAMS)
        for generation in range(self.config.generations):
            self._publish(generation, mean, std)
            batch = self.replay.sample(generation, self.config.population)
            mean, std = self._update(batch)
        self._publish(self.config.generations, mean, std)
        lp.wait_for_stop()  # keep serving params() until the evaluator is done

    def _publish(self, generation: int, mean: np.ndarray, std: np.ndarray) -> None:
        with self._changed:
            self._published[generation] = (mean, std)
            self._changed.notify_all()

    def _update(self, batch: list[Trajectory]) -> tuple[np.ndarray, np.ndarray]:
        """Cross-entropy step: the elites' mean and spread (ties keep sample order)."""
        returns = np.array([t.rewards.sum() for t in batch])
        num_elites = max(1, round(self.config.elite_fraction * len(batch)))
        elites = np.stack([batch[i].params
                           for i in np.argsort(-returns, kind="stable")[:num_elites]])
        return elites.mean(axis=0), elites.std(axis=0) + self.config.extra_std


def act(actor_id: int, learner: Any, replay: Any, config: Config) -> None:
    """An actor: each generation, play episodes with policies drawn around the learner's."""
    env = make_env()
    for generation in range(config.generations):
        mean, std = learner.params(generation)
        for episode in range(config.episodes_per_actor):
            rng = np.random.default_rng([config.seed, generation, actor_id, episode])
            params = mean + std * rng.standard_normal(NUM_PARAMS)
            rewards = rollout(env, params, seed=int(rng.integers(2**31)))
            replay.add(Trajectory(generation, actor_id, episode, params, rewards))


def evaluate(learner: Any, config: Config, result_dir: str) -> None:
    """The mean return of every generation's mean policy; saves the curve and stops."""
    env = make_env()
    mean_returns: list[float] = []
    for generation in range(config.generations + 1):
        mean, _ = learner.params(generation)
        returns = [rollout(env, mean, EVAL_SEED + j).sum() for j in range(config.eval_episodes)]
        mean_returns.append(float(np.mean(returns)))
    save(result_dir, "evaluator", {"mean_returns": mean_returns, "final_params": mean.tolist()})
    lp.stop()


def make_program(result_dir: str, config: Config | None = None) -> lp.Program:
    config = config or Config()
    program = lp.Program("agent_learner")
    replay = program.add_node(lp.CourierNode(Replay), label="replay")
    learner = program.add_node(lp.CourierNode(Learner, replay, config), label="learner")
    with program.group("actor"):
        for i in range(config.num_actors):
            program.add_node(lp.PyNode(act, i, learner, replay, config))
    program.add_node(lp.PyNode(evaluate, learner, config, result_dir), label="evaluator")
    return program


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved."""
    return run_program(make_program, launch_type, timeout, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    parser.add_argument("--generations", type=int, default=Config.generations)
    args = parser.parse_args(argv)
    result = run(args.launch_type, config=Config(generations=args.generations))["evaluator"]
    print("mean return per generation:", [round(r, 1) for r in result["mean_returns"]])


if __name__ == "__main__":
    main()
