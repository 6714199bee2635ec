"""Evolution strategies on gymnasium's CartPole-v1: the engine-independent algorithm.

Everything an engine runs remotely lives here as plain module-level functions, so every
engine (serial, ``multiprocessing``, Spark, rtml, Ray) ships the same code and, given the
same seeds, computes bit-identical rewards:

* the policy: linear, ``action = argmax(obs @ W + b)`` with ``W`` 4x2 and ``b`` 2
  (10 parameters, flattened into one float64 vector ``theta``);
* the perturbations: 16 antithetic pairs (32 perturbations) per iteration, the noise of
  pair ``j`` at iteration ``t`` drawn from ``default_rng([seed, t, j])``; both members of a
  pair play the same episode seed (common random numbers);
* ``rollout(params, seed)``: one whole episode with ``gymnasium.make("CartPole-v1")``
  and ``env.reset(seed=seed)``; the return is the episode's total reward;
* ``update(theta, rewards, t)``: the central ES step (centered ranks, antithetic gradient
  estimate, plain SGD step);
* the fine-grained pieces ``start_episode(params, seed) -> state`` and
  ``advance(state, k) -> state``. A state is a small dict (~360 bytes pickled): the policy
  parameters, the CartPole physics vector (float64, 4), steps taken, total reward and a
  done flag. ``advance`` writes the physics vector and the step count into the process's
  ``gymnasium.make`` env (``CartPoleEnv.state``, ``TimeLimit._elapsed_steps``) and steps it
  through the same wrapper stack as ``rollout``, so the dynamics and the per-step cost are
  gymnasium's, not a copy. ``CartPoleEnv.step`` reads only ``state`` (and
  ``steps_beyond_terminated``, which matters only past termination, where ``advance``
  never steps). Chaining ``advance`` from ``start_episode`` to done therefore gives exactly
  ``rollout``'s reward (``python es.py`` checks this). (A gymnasium env also pickles, ~2.6
  kB with its wrappers and RNG, but the physics vector is all the dynamics need.)

The env is cached per process (a worker builds it once); ``reset(seed=seed)`` reseeds it,
so a result never depends on what the process ran before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ENV_ID = "CartPole-v1"
OBS_DIM = 4
N_ACTIONS = 2
DIM = OBS_DIM * N_ACTIONS + N_ACTIONS  # 10 parameters
MAX_STEPS = 500  # CartPole-v1's TimeLimit

N_PERTURBATIONS = 32  # 16 antithetic pairs
SIGMA = 0.1
LEARNING_RATE = 0.03
SEED = 0

State = dict[str, Any]

_env: Any = None  # gymnasium.make("CartPole-v1"), built once per process


def _make_env() -> Any:
    global _env
    if _env is None:
        import gymnasium
        _env = gymnasium.make(ENV_ID)
        _env.reset(seed=0)  # the wrappers refuse a step before the first reset
    return _env


def _time_limit(env: Any) -> Any:
    """The ``TimeLimit`` wrapper of ``gymnasium.make``'s wrapper stack."""
    import gymnasium
    while not isinstance(env, gymnasium.wrappers.TimeLimit):
        env = env.env
    return env


def act(params: np.ndarray, obs: np.ndarray) -> int:
    """The linear policy: argmax over the two action logits."""
    logits = obs @ params[:OBS_DIM * N_ACTIONS].reshape(OBS_DIM, N_ACTIONS) \
        + params[OBS_DIM * N_ACTIONS:]
    return int(logits[1] > logits[0])  # argmax of two, ties -> action 0 like np.argmax


def rollout(params: np.ndarray, seed: int, max_steps: int = MAX_STEPS) -> float:
    """Play one whole episode with ``params``; return its total reward."""
    env = _make_env()
    obs, _ = env.reset(seed=seed)
    total = 0.0
    for _ in range(max_steps):
        obs, reward, terminated, truncated, _ = env.step(act(params, obs))
        total += float(reward)
        if terminated or truncated:
            break
    return total


def start_episode(params: np.ndarray, seed: int, max_steps: int = MAX_STEPS) -> State:
    """Reset an episode (same reset as ``rollout``) and return its state, no step taken."""
    env = _make_env()
    env.reset(seed=seed)
    physics = np.array(env.unwrapped.state, dtype=np.float64)
    return {"params": np.asarray(params, dtype=np.float64), "physics": physics, "steps": 0,
            "max_steps": max_steps, "reward": 0.0, "done": False}


def advance(state: State, k: int) -> State:
    """Advance an episode by up to ``k`` steps (fewer if it ends); return the new state."""
    if state["done"]:
        return state
    env = _make_env()
    core = env.unwrapped  # gymnasium's CartPoleEnv itself
    core.state = np.array(state["physics"], dtype=np.float64)
    core.steps_beyond_terminated = None
    _time_limit(env)._elapsed_steps = state["steps"]
    params = state["params"]
    obs = np.array(core.state, dtype=np.float32)  # what reset()/step() return as observation
    steps, total, done, limit = state["steps"], state["reward"], False, state["max_steps"]
    for _ in range(k):
        obs, reward, terminated, truncated, _ = env.step(act(params, obs))
        steps += 1
        total += float(reward)
        if terminated or truncated or steps >= limit:
            done = True
            break
    return {"params": params, "physics": np.array(core.state, dtype=np.float64),
            "steps": steps, "max_steps": limit, "reward": total, "done": done}


# --- the ES algorithm (central, on the driver) ------------------------------------------------

def initial_theta(seed: int = SEED) -> np.ndarray:
    return np.random.default_rng([seed, 10**6]).standard_normal(DIM) * 0.1


def noise(t: int, pair: int, seed: int = SEED) -> np.ndarray:
    return np.random.default_rng([seed, t, pair]).standard_normal(DIM)


def episode_seed(t: int, pair: int, seed: int = SEED) -> int:
    return (seed * 1_000_003 + t * 1_009 + pair) % 2**31


def perturbations(theta: np.ndarray, t: int, seed: int = SEED) -> list[tuple[np.ndarray, int]]:
    """The 32 ``(params, episode seed)`` pairs of iteration ``t``, in perturbation order."""
    out = []
    for i in range(N_PERTURBATIONS):
        pair, sign = divmod(i, 2)
        eps = noise(t, pair, seed)
        out.append((theta + SIGMA * (1.0 - 2.0 * sign) * eps, episode_seed(t, pair, seed)))
    return out


def centered_ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x), dtype=np.float64)
    return ranks / (len(x) - 1) - 0.5


def update(theta: np.ndarray, rewards: list[float], t: int, seed: int = SEED) -> np.ndarray:
    """One ES step from the 32 rewards of iteration ``t`` (in perturbation order)."""
    shaped = centered_ranks(np.asarray(rewards, dtype=np.float64))
    grad = np.zeros(DIM)
    for pair in range(N_PERTURBATIONS // 2):
        grad += (shaped[2 * pair] - shaped[2 * pair + 1]) * noise(t, pair, seed)
    grad /= N_PERTURBATIONS * SIGMA
    return theta + LEARNING_RATE * grad


def _self_check(iterations: int = 3, ks: tuple[int, ...] = (1, 7, 10, 50)) -> None:
    """Chained ``advance`` reproduces ``rollout`` exactly on real ES perturbations."""
    theta = initial_theta()
    for t in range(iterations):
        tasks = perturbations(theta, t)
        rewards = [rollout(p, s) for p, s in tasks]
        for k in ks:
            for (p, s), want in zip(tasks, rewards, strict=True):
                st = start_episode(p, s)
                while not st["done"]:
                    st = advance(st, k)
                assert st["reward"] == want, (t, k, st["reward"], want)
        print(f"iteration {t}: mean reward {np.mean(rewards):.1f}; advance == rollout for k={ks}")
        theta = update(theta, rewards, t)


if __name__ == "__main__":
    _self_check()
