"""Run the ES-on-CartPole workload (``es.py``) on one engine and time each iteration.

    python benchmarks/rl/run.py --engine serial|mp|rtml|spark|ray --mode episode|fine \
        [--k 10] [--iterations 10] [--json out.json] [--python /path/to/python]

Modes:
* ``episode``: each of the 32 perturbations is one task playing a whole episode;
* ``fine``: each perturbation is a chain of tasks, ``start_episode`` then ``advance(state, K)``
  until the episode is done, each task taking the previous one's output. The driver sees
  each chunk's state (to know whether the chain is done) and submits the next chunk.

Engines (each set up before the timed iterations; one untimed warm-up round first):
* ``serial``: plain Python in this process (fine mode: rounds of K steps over live episodes);
* ``mp``: ``multiprocessing.Pool(2)``, ``apply_async`` per task (chunksize 1 in episode mode,
  i.e. ``starmap(..., chunksize=1)``); in fine mode a chain's next chunk is submitted from
  the result callback's queue as soon as its state comes back, so chains do not wait on
  each other;
* ``rtml``: ``rtml.init(num_cpus=2)``; rollouts as tasks; in fine mode every chunk is a task
  taking the previous chunk's ``ObjectRef``, 32 chains in flight, the driver waits on the
  chains' latest refs with ``rtml.wait``;
* ``ray``: the same program as ``rtml`` with ``import ray`` (``ray.init(num_cpus=2)``), run
  by this interpreter if ``ray`` imports, else by ``--python`` (or ``/work/ray-venv``);
* ``spark``: PySpark ``local[2]``; episode mode is one job per iteration over the 32
  perturbations; fine mode is bulk-synchronous: one job for the starts, then one job per
  K-step round over the live episodes' states. Both use 2 partitions per job by default,
  the fastest of 2/4/8 measured here (``--spark-partitions``, ``--spark-fine-partitions``).

Per-iteration wall time covers the whole iteration: perturbations, rollouts, update.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import es  # noqa: E402
import numpy as np  # noqa: E402

ENGINES = ("serial", "mp", "rtml", "spark", "ray")
Tasks = list[tuple[np.ndarray, int]]


class Serial:
    name = "serial"

    def version(self) -> str:
        return platform.python_version()

    def episodes(self, tasks: Tasks) -> list[float]:
        return [es.rollout(p, s) for p, s in tasks]

    def chains(self, tasks: Tasks, k: int) -> list[float]:
        states = [es.start_episode(p, s) for p, s in tasks]
        live = list(range(len(states)))
        while live:
            for i in live:
                states[i] = es.advance(states[i], k)
            live = [i for i in live if not states[i]["done"]]
        return [st["reward"] for st in states]

    def close(self) -> None:
        pass


class MultiprocessingPool:
    name = "mp"

    def __init__(self, processes: int = 2) -> None:
        import multiprocessing
        self.pool = multiprocessing.Pool(processes)

    def version(self) -> str:
        return platform.python_version()

    def episodes(self, tasks: Tasks) -> list[float]:
        return self.pool.starmap(es.rollout, tasks, chunksize=1)

    def chains(self, tasks: Tasks, k: int) -> list[float]:
        results: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        def submit(i: int, fn: Any, args: tuple[Any, ...]) -> None:
            self.pool.apply_async(fn, args, callback=lambda st: results.put((i, st)),
                                  error_callback=lambda exc: results.put((i, exc)))

        for i, (p, s) in enumerate(tasks):
            submit(i, es.start_episode, (p, s))
        rewards: list[float] = [0.0] * len(tasks)
        left = len(tasks)
        while left:
            i, st = results.get()
            if isinstance(st, BaseException):
                raise st
            if st["done"]:
                rewards[i] = st["reward"]
                left -= 1
            else:
                submit(i, es.advance, (st, k))
        return rewards

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


class RayLike:
    """rtml, or Ray itself: the same program against ``import rtml`` / ``import ray``."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "rtml":
            import rtml as api
        else:
            import ray as api  # type: ignore[import-not-found, no-redef]
        self.api = api
        kwargs: dict[str, Any] = {"num_cpus": 2}
        if name == "ray":
            kwargs.update(include_dashboard=False, log_to_driver=False)
        api.init(**kwargs)
        self.rollout = api.remote(es.rollout)
        self.start = api.remote(es.start_episode)
        self.advance = api.remote(es.advance)
        self.stall_s = 60.0  # a chunk takes milliseconds; fail loudly instead of hanging

    def version(self) -> str:
        return str(getattr(self.api, "__version__", "?"))

    def episodes(self, tasks: Tasks) -> list[float]:
        return self.api.get([self.rollout.remote(p, s) for p, s in tasks])

    def chains(self, tasks: Tasks, k: int) -> list[float]:
        api = self.api
        # A fresh episode is never done, so its first chunk is chained on directly.
        chain_of = {self.advance.remote(self.start.remote(p, s), k): i
                    for i, (p, s) in enumerate(tasks)}
        rewards: list[float] = [0.0] * len(tasks)
        while chain_of:
            pending = list(chain_of)
            ready, rest = api.wait(pending, num_returns=1, timeout=self.stall_s)
            if not ready:
                try:  # tell a lost wake-up (get still works) from a lost task
                    api.get(pending, timeout=5.0)
                    how = "but get() of them returns: wait() missed their completion"
                except Exception as exc:  # noqa: BLE001 - diagnostic only
                    how = f"and get() of them fails too ({type(exc).__name__})"
                raise RuntimeError(f"{self.name}: no chunk of {len(pending)} pending chains "
                                   f"finished within {self.stall_s:.0f} s, {how}")
            if rest:  # take every other chunk that has finished meanwhile, without blocking
                more, _ = api.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref, st in zip(ready, api.get(ready), strict=True):
                i = chain_of.pop(ref)
                if st["done"]:
                    rewards[i] = st["reward"]
                else:
                    chain_of[self.advance.remote(ref, k)] = i  # the next chunk takes the ref
        return rewards

    def close(self) -> None:
        self.api.shutdown()


class Spark:
    name = "spark"

    def __init__(self, episode_partitions: int, fine_partitions: int) -> None:
        # Spark's Python workers must import ``es`` by name, like every other engine's.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark import SparkConf, SparkContext
        conf = (SparkConf().setMaster("local[2]").setAppName("rtml-rl-es")
                .set("spark.ui.enabled", "false")
                .set("spark.python.worker.reuse", "true")
                .set("spark.ui.showConsoleProgress", "false"))
        self.sc = SparkContext(conf=conf)
        self.sc.setLogLevel("ERROR")
        self.episode_partitions = episode_partitions
        self.fine_partitions = fine_partitions

    def version(self) -> str:
        return str(self.sc.version)

    def episodes(self, tasks: Tasks) -> list[float]:
        rdd = self.sc.parallelize(tasks, min(self.episode_partitions, len(tasks)))
        return rdd.map(lambda ps: es.rollout(ps[0], ps[1])).collect()

    def chains(self, tasks: Tasks, k: int) -> list[float]:
        n = self.fine_partitions
        states = self.sc.parallelize(tasks, min(n, len(tasks))) \
            .map(lambda ps: es.start_episode(ps[0], ps[1])).collect()
        live = list(range(len(states)))
        while live:  # one bulk-synchronous job per K-step round
            batch = [states[i] for i in live]
            out = self.sc.parallelize(batch, min(n, len(batch))) \
                .map(lambda st: es.advance(st, k)).collect()
            for i, st in zip(live, out, strict=True):
                states[i] = st
            live = [i for i in live if not states[i]["done"]]
        return [st["reward"] for st in states]

    def close(self) -> None:
        self.sc.stop()


def make_engine(args: argparse.Namespace) -> Any:
    if args.engine == "serial":
        return Serial()
    if args.engine == "mp":
        return MultiprocessingPool(2)
    if args.engine in ("rtml", "ray"):
        return RayLike(args.engine)
    if args.engine == "spark":
        return Spark(args.spark_partitions, args.spark_fine_partitions)
    raise ValueError(args.engine)


def run(engine: Any, mode: str, k: int, iterations: int, warmup: bool = True,
        verbose: bool = True) -> dict[str, Any]:
    """Run ``iterations`` ES iterations on ``engine``; return the timings and rewards."""
    theta = es.initial_theta()

    def evaluate(tasks: Tasks) -> list[float]:
        return engine.episodes(tasks) if mode == "episode" else engine.chains(tasks, k)

    if warmup:  # start workers / JVM / imports; results discarded (every reset is seeded)
        evaluate(es.perturbations(theta, 0)[:4])
    times_ms: list[float] = []
    rewards: list[list[float]] = []
    for t in range(iterations):
        t0 = time.perf_counter()
        r = [float(x) for x in evaluate(es.perturbations(theta, t))]
        theta = es.update(theta, r, t)
        times_ms.append((time.perf_counter() - t0) * 1e3)
        rewards.append(r)
        if verbose:
            print(f"  iteration {t}: {times_ms[-1]:8.1f} ms  mean reward {np.mean(r):6.2f}"
                  f"  (max {max(r):.0f}, {int(sum(r))} env steps)", flush=True)
    return {"times_ms": times_ms, "median_ms": statistics.median(times_ms),
            "rewards": rewards, "mean_rewards": [float(np.mean(r)) for r in rewards],
            "theta": [float(x) for x in theta]}


def _reexec(python: str, argv: list[str]) -> int:
    """Run this script with another interpreter (one with ray), without ``--python``."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--python":
            skip = True
            continue
        if a.startswith("--python="):
            continue
        rest.append(a)
    return subprocess.call([python, str(Path(__file__).resolve()), *rest])


def _ray_imports() -> bool:
    try:
        import ray  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=ENGINES, required=True)
    ap.add_argument("--mode", choices=("episode", "fine"), default="episode")
    ap.add_argument("--k", type=int, default=10, help="steps per task in fine mode")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--json", type=Path, help="write timings and rewards here")
    ap.add_argument("--python", help="interpreter to run the ray engine with")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--spark-partitions", type=int, default=2,
                    help="partitions of the episode-mode job (default 2)")
    ap.add_argument("--spark-fine-partitions", type=int, default=2,
                    help="partitions of each fine-mode round's job (default 2)")
    args = ap.parse_args(argv)

    if args.python and os.path.realpath(args.python) != os.path.realpath(sys.executable):
        return _reexec(args.python, argv)
    if args.engine == "ray" and not _ray_imports():
        fallback = Path("/work/ray-venv/bin/python")
        if fallback.exists():
            return _reexec(str(fallback), argv)
        print("ray engine: `ray` does not import here and no --python given; skipped",
              file=sys.stderr)
        return 2

    label = f"{args.engine} {args.mode}" + (f" K={args.k}" if args.mode == "fine" else "")
    t0 = time.perf_counter()
    engine = make_engine(args)
    setup_s = time.perf_counter() - t0
    version = engine.version()
    print(f"{label}: {engine.name} {version}, setup {setup_s:.2f} s", flush=True)
    try:
        result = run(engine, args.mode, args.k, args.iterations, warmup=not args.no_warmup)
    finally:
        engine.close()
    print(f"{label}: median {result['median_ms']:.1f} ms per iteration over "
          f"{args.iterations}; mean reward per iteration "
          f"{[round(x, 2) for x in result['mean_rewards']]}", flush=True)
    if args.json:
        record = {"engine": args.engine, "version": version,
                  "mode": args.mode, "k": args.k if args.mode == "fine" else None,
                  "iterations": args.iterations, "python": platform.python_version(),
                  "setup_s": setup_s, **result}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
