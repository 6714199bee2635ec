"""rtml under faults: how long a real kill interrupts work, and whether results stay right.

    python benchmarks/chaos.py [--rounds N] [--tasks N] [--json FILE]

Each row starts its own embedded cluster (``rtml.init(num_cpus=2)``) and SIGKILLs a
process of it for real:

- ``worker kills``: 2,000 tasks while a worker is killed every 50 ms; every result
  checked, and the time the batch took;
- ``head kill -> task``: a task submitted right after the head service is killed (it
  needs no head: the lease is local), time to its result;
- ``head kill -> actor``: an actor created right after the kill (its placement needs
  the head that takes over), time to its first call's result;
- ``head kill -> nodes()``: ``rtml.nodes()`` right after the kill, time to the answer
  listing the node alive;
- ``redis kill -> actor``: an actor of a new class created right after Redis is
  SIGKILLed (the driver's keeper starts Redis again; the actor's worker loads its class
  from it), time to its first call's result;
- ``node kill -> 100 MB rebuilt``: two nodes (``rtml.testing.Cluster``); a task made a
  100 MB array on the second, which is SIGKILLed; time from the kill to the ``get`` of
  the array (rebuilt on the head by running the task again), beside the time the task
  took the first time (made there, and read across nodes).

- ``redis memory``: Redis's used memory before and after ``--tasks`` no-op tasks
  (default 1,000,000) and the head's next trim of the task table (it keeps the newest
  ``RTML_TASK_RECORDS_KEPT``, default 100,000).

Times are medians over ``--rounds`` kills (one per cluster), in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import rtml
from rtml import driver
from rtml.testing import Cluster

HUNDRED_MB = 100 * 1024 * 1024


@rtml.remote
def square(x: int) -> int:
    return x * x


@rtml.remote
def slow_square(x: int) -> int:
    time.sleep(0.002)
    return x * x


@rtml.remote
def hundred_mb(seed: int) -> np.ndarray:
    return np.full(HUNDRED_MB // 8, seed, dtype=np.int64)


@rtml.remote
class Echo:
    def ping(self) -> int:
        return os.getpid()


def _head_pid() -> int:
    started = driver._embedded
    assert started is not None and started.supervisor is not None
    assert started.supervisor.proc is not None
    return started.supervisor.proc.pid


def _worker_pids() -> list[int]:
    """The node's workers: the children of its worker zygote."""
    import psutil

    started = driver._embedded
    assert started is not None
    (zygote,) = psutil.Process(started.procs[-1].pid).children()
    return [p.pid for p in zygote.children()]


def worker_kills(n_tasks: int = 2000) -> dict[str, Any]:
    rtml.init(num_cpus=2)
    try:
        rtml.get([square.remote(i) for i in range(20)])
        stop = threading.Event()
        kills = 0

        def killer() -> None:
            nonlocal kills
            while not stop.wait(0.05):
                pids = _worker_pids()
                if pids:
                    try:
                        os.kill(random.choice(pids), signal.SIGKILL)
                        kills += 1
                    except ProcessLookupError:
                        pass

        thread = threading.Thread(target=killer, daemon=True)
        start = time.perf_counter()
        thread.start()
        refs = [slow_square.options(max_retries=-1).remote(i) for i in range(n_tasks)]
        values = rtml.get(refs, timeout=600)
        elapsed = time.perf_counter() - start
        stop.set()
        thread.join()
        wrong = sum(v != i * i for i, v in enumerate(values))
        return {"name": "worker kills", "tasks": n_tasks, "kills": kills, "wrong": wrong,
                "seconds": round(elapsed, 2)}
    finally:
        rtml.shutdown()


def _after_head_kill(action: Callable[[], Any], rounds: int) -> list[float]:
    """One kill per cluster: a supervisor gives up on a head that keeps dying."""
    times = []
    for _ in range(rounds):
        rtml.init(num_cpus=2)
        try:
            rtml.get(square.remote(1))
            rtml.get(Echo.remote().ping.remote())
            os.kill(_head_pid(), signal.SIGKILL)
            start = time.perf_counter()
            action()
            times.append((time.perf_counter() - start) * 1000)
        finally:
            rtml.shutdown()
    return times


def _after_redis_kill(rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        rtml.init(num_cpus=2)
        try:
            rtml.get(square.remote(1))
            started = driver._embedded
            assert started is not None and started.keeper is not None
            os.kill(started.keeper.pid, signal.SIGKILL)
            start = time.perf_counter()

            @rtml.remote
            class Fresh:
                def ping(self) -> int:
                    return os.getpid()

            assert rtml.get(Fresh.remote().ping.remote(), timeout=120) > 0
            times.append((time.perf_counter() - start) * 1000)
        finally:
            rtml.shutdown()
    return times


@rtml.remote
def noop() -> None:
    return None


def redis_memory(n_tasks: int) -> dict[str, Any]:
    from rtml.config import TRIM_INTERVAL
    from rtml.core import current

    rtml.init(num_cpus=2)
    try:
        plane = current.require_runtime().plane
        rtml.get([noop.remote() for _ in range(1000)])
        before = plane.memory_used()
        marks = []
        for done in range(0, n_tasks, 10_000):
            rtml.get([noop.remote() for _ in range(min(10_000, n_tasks - done))])
            if done % (n_tasks // 4 or 1) < 10_000:
                marks.append(plane.memory_used())
        current.require_runtime().writer.flush()
        time.sleep(TRIM_INTERVAL + 1)  # the head's next trim
        after = plane.memory_used()
        return {"name": "redis memory", "tasks": n_tasks, "before_mb": round(before / 1e6, 1),
                "during_mb": [round(x / 1e6, 1) for x in marks],
                "after_mb": round(after / 1e6, 1)}
    finally:
        rtml.shutdown()


def _check_task() -> None:
    assert rtml.get(square.remote(7), timeout=120) == 49


def _check_actor() -> None:
    assert rtml.get(Echo.remote().ping.remote(), timeout=120) > 0


def _check_nodes() -> None:
    assert all(node["Alive"] for node in rtml.nodes())


def node_kill_rebuild(rounds: int) -> dict[str, Any]:
    made, rebuilt = [], []
    for seed in range(rounds):
        cluster = Cluster(head_node_args={"num_cpus": 2})
        try:
            node2 = cluster.add_node(num_cpus=2)
            cluster.connect()
            there = rtml.NodeAffinitySchedulingStrategy(node2.node_id, soft=True)
            start = time.perf_counter()
            first = rtml.get(hundred_mb.options(scheduling_strategy=there).remote(seed))
            made.append((time.perf_counter() - start) * 1000)
            assert int(first[0]) == seed
            del first
            ref = hundred_mb.options(scheduling_strategy=there).remote(seed)
            rtml.wait([ref], timeout=120, fetch_local=False)
            cluster.remove_node(node2, allow_graceful=False)
            start = time.perf_counter()
            value = rtml.get(ref, timeout=120)
            rebuilt.append((time.perf_counter() - start) * 1000)
            assert value.nbytes == HUNDRED_MB and int(value[-1]) == seed
            del value
        finally:
            cluster.shutdown()
    return {"name": "node kill -> 100 MB rebuilt", "median_ms": round(statistics.median(rebuilt), 1),
            "max_ms": round(max(rebuilt), 1), "first_run_ms": round(statistics.median(made), 1),
            "rounds": rounds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    logging.getLogger("rtml").setLevel(logging.ERROR)  # the kills' warnings are expected
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  load {os.getloadavg()[0]:.2f}")
    rows: list[dict[str, Any]] = [worker_kills()]
    print(f"| worker kills | {rows[0]['tasks']} tasks, {rows[0]['kills']} workers killed, "
          f"{rows[0]['wrong']} wrong results, {rows[0]['seconds']} s |")
    for name, check in (("head kill -> task", _check_task),
                        ("head kill -> actor", _check_actor),
                        ("head kill -> nodes()", _check_nodes)):
        times = _after_head_kill(check, args.rounds)
        row = {"name": name, "median_ms": round(statistics.median(times), 1),
               "max_ms": round(max(times), 1), "rounds": len(times)}
        rows.append(row)
        print(f"| {name} | median {row['median_ms']} ms, max {row['max_ms']} ms "
              f"over {row['rounds']} kills |")
    times = _after_redis_kill(args.rounds)
    row = {"name": "redis kill -> actor", "median_ms": round(statistics.median(times), 1),
           "max_ms": round(max(times), 1), "rounds": len(times)}
    rows.append(row)
    print(f"| {row['name']} | median {row['median_ms']} ms, max {row['max_ms']} ms "
          f"over {row['rounds']} kills |")
    row = node_kill_rebuild(args.rounds)
    rows.append(row)
    print(f"| {row['name']} | median {row['median_ms']} ms, max {row['max_ms']} ms over "
          f"{row['rounds']} kills (the task's first run, read across nodes: "
          f"{row['first_run_ms']} ms) |")
    row = redis_memory(args.tasks)
    rows.append(row)
    print(f"| {row['name']} | {row['before_mb']} MB before {row['tasks']:,} tasks, "
          f"{' / '.join(str(x) for x in row['during_mb'])} MB on the way, "
          f"{row['after_mb']} MB after the next trim |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
