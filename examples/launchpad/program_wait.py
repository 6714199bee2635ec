"""Program wait: a program ends when every node has finished, as in Launchpad's program_wait.

    worker_i (PyNode)  computes, tally.add(i, value), returns       -> finished
    tally (CourierNode with run()): once all workers added, saves the
        values and calls lp.stop(); run() returns                    -> finished
    watcher (PyNode)   lp.register_stop_handler(...), lp.wait_for_stop()
        (blocks until the stop), checks lp.stop_event(), returns     -> finished

``handle.wait()`` in the launching process returns once all of them have
returned (nobody is killed: the stop only ends the watcher's wait).

    python examples/launchpad/program_wait.py [--launch-type local_mt|local_mp|rtml]
"""

from __future__ import annotations

import argparse
import json
import math
import threading
from typing import Any

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]

WAIT_TIMEOUT = 60.0  # seconds a node waits for the others before giving up


def work(worker_id: int, tally: Any) -> None:
    """A worker: compute (i + 1)! * 2, hand it to the tally, return."""
    tally.add(worker_id, math.factorial(worker_id + 1) * 2)


class Tally:
    """Collects the workers' values; ``run()`` ends the program once it has them all."""

    def __init__(self, num_workers: int, result_dir: str) -> None:
        self.num_workers = num_workers
        self.result_dir = result_dir
        self._values: dict[int, int] = {}
        self._changed = threading.Condition()

    def add(self, worker_id: int, value: int) -> None:
        with self._changed:
            self._values[worker_id] = value
            self._changed.notify_all()

    def run(self) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._values) == self.num_workers,
                                          WAIT_TIMEOUT):
                raise TimeoutError(f"only {len(self._values)} of {self.num_workers} workers "
                                   f"reported within {WAIT_TIMEOUT:g} s")
        values = [self._values[i] for i in range(self.num_workers)]
        save(self.result_dir, "tally", {"values": values, "total": sum(values)})
        lp.stop()


def watch(result_dir: str) -> None:
    """Wait for the program to stop, the three ways a node can learn of it."""
    handler_ran = threading.Event()
    lp.register_stop_handler(handler_ran.set)
    stopped = lp.wait_for_stop(WAIT_TIMEOUT)
    save(result_dir, "watcher", {
        "wait_for_stop": stopped,
        "stop_event_set": lp.stop_event().is_set(),
        "stop_handler_ran": handler_ran.wait(WAIT_TIMEOUT),
    })


def make_program(result_dir: str, num_workers: int = 3) -> lp.Program:
    program = lp.Program("program_wait")
    tally = program.add_node(lp.CourierNode(Tally, num_workers, result_dir), label="tally")
    with program.group("worker"):
        for i in range(num_workers):
            program.add_node(lp.PyNode(work, i, tally))
    program.add_node(lp.PyNode(watch, result_dir), label="watcher")
    return program


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved."""
    return run_program(make_program, launch_type, timeout, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.launch_type), indent=2))


if __name__ == "__main__":
    main()
