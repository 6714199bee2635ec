"""What Ray's API breadth costs in rtml (issue 19): the new paths, timed.

    python benchmarks/ray_api.py [--rounds N]

Rows (medians over ``--rounds``, on one embedded 2-CPU cluster unless said):

- ``generator first item``: from ``.remote()`` of a generator task to ``get`` of its
  first item, while the task still runs (it waits after the first yield);
- ``generator items/s``: a task yielding 10,000 small items, consumed as they come;
- ``placement group ready``: ``placement_group([{"CPU": 1}] * 2).ready()`` to its get,
  and ``remove_placement_group`` until both CPUs are free again;
- ``task in a bundle``: a no-op task's round trip in a placement group bundle, beside a
  plain one's (the same lease path under other resource names);
- ``max_calls=1 task``: round trip of a task whose worker exits after it (a fork of the
  node's zygote per task), beside a plain one's;
- ``runtime_env first task``: a task with ``env_vars`` (a worker of its own is started),
  then the next one (reusing it);
- ``job submit``: ``rtml job submit`` of a one-task script on an ``rtml start --head``
  cluster, to SUCCEEDED (the driver's start included).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import rtml
from rtml.util import placement_group, remove_placement_group
from rtml.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@rtml.remote
def noop() -> None:
    return None


@rtml.remote
class Gate:
    def __init__(self) -> None:
        self.opened = False

    def open(self) -> None:
        self.opened = True

    def is_open(self) -> bool:
        return self.opened


@rtml.remote
def first_then_wait(gate: Any):  # noqa: ANN201 - a generator task
    yield 1
    while not rtml.get(gate.is_open.remote()):
        time.sleep(0.001)


@rtml.remote
def many(n: int):  # noqa: ANN201
    yield from range(n)


def median_ms(times: list[float]) -> str:
    return f"{statistics.median(times) * 1e3:.2f} ms"


def timed(run: Callable[[], Any], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def generator_rows(rounds: int) -> None:
    firsts = []
    for _ in range(rounds):
        gate = Gate.remote()
        rtml.get(gate.is_open.remote())
        started = time.perf_counter()
        gen = first_then_wait.remote(gate)
        rtml.get(next(gen))
        firsts.append(time.perf_counter() - started)
        gate.open.remote()
        for _ in gen:
            pass
    print(f"generator first item        {median_ms(firsts)}")
    rates = []
    for _ in range(max(1, rounds // 4)):
        started = time.perf_counter()
        count = sum(1 for ref in many.remote(10_000) if rtml.get(ref) is not None)
        rates.append(count / (time.perf_counter() - started))
    print(f"generator items/s           {statistics.median(rates):,.0f}")


def group_rows(rounds: int) -> None:
    ready, freed = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        pg = placement_group([{"CPU": 1}] * 2, strategy="PACK")
        rtml.get(pg.ready())
        ready.append(time.perf_counter() - started)
        started = time.perf_counter()
        remove_placement_group(pg)
        while rtml.available_resources().get("CPU", 0) < 2:
            time.sleep(0.005)
        freed.append(time.perf_counter() - started)
    print(f"placement group ready       {median_ms(ready)}   removed, CPUs free: "
          f"{median_ms(freed)}")
    pg = placement_group([{"CPU": 1}], strategy="PACK")
    rtml.get(pg.ready())
    in_bundle = noop.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0))
    rtml.get(in_bundle.remote())
    bundle = timed(lambda: rtml.get(in_bundle.remote()), rounds * 20)
    plain = timed(lambda: rtml.get(noop.remote()), rounds * 20)
    print(f"task in a bundle            {median_ms(bundle)}   plain: {median_ms(plain)}")
    remove_placement_group(pg)


def retire_rows(rounds: int) -> None:
    once = noop.options(max_calls=1)
    rtml.get(once.remote())
    retiring = timed(lambda: rtml.get(once.remote()), rounds * 4)
    plain = timed(lambda: rtml.get(noop.remote()), rounds * 4)
    print(f"max_calls=1 task            {median_ms(retiring)}   plain: {median_ms(plain)}")


def env_rows(rounds: int) -> None:
    firsts, nexts = [], []
    for i in range(rounds):
        task = noop.options(runtime_env={"env_vars": {"RTML_BENCH_ROUND": str(i)}})
        firsts += timed(lambda t=task: rtml.get(t.remote()), 1)
        nexts += timed(lambda t=task: rtml.get(t.remote()), 5)
    print(f"runtime_env first task      {median_ms(firsts)}   next: {median_ms(nexts)}")


def job_row(rounds: int) -> None:
    rtml_cli = shutil.which("rtml") or f"{sys.executable} -m rtml.cli.main"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TMPDIR": tmp}
        env.pop("RTML_ADDRESS", None)
        subprocess.run([*rtml_cli.split(), "start", "--head", "--port", str(port),
                        "--num-cpus", "2", "--node-ip-address", "127.0.0.1"], env=env,
                       check=True, capture_output=True, timeout=120)
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write("import rtml\n@rtml.remote\ndef f():\n    return 1\n"
                    "print(rtml.get(f.remote()))\n")
        try:
            times = timed(lambda: subprocess.run(
                [*rtml_cli.split(), "job", "submit", "--", sys.executable, script], env=env,
                check=True, capture_output=True, timeout=120), rounds)
        finally:
            subprocess.run([*rtml_cli.split(), "stop"], env=env, capture_output=True,
                           timeout=120)
    print(f"job submit -> SUCCEEDED     {median_ms(times)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"rtml {rtml.BUILD}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    rtml.init(num_cpus=2)
    try:
        generator_rows(args.rounds)
        group_rows(args.rounds)
        retire_rows(args.rounds)
        env_rows(args.rounds)
    finally:
        rtml.shutdown()
    job_row(args.rounds)


if __name__ == "__main__":
    main()
