"""Consumer and producers: one consumer fans work out to N producers with futures.

    consumer (PyNode) --producer_i.futures.sum_of_squares(lo, hi)--> producer_i (CourierNode)
                      <-- a concurrent.futures.Future per producer, gathered in order

Each producer sums ``k * k`` over its slice of ``range(n)``; the consumer sends
every request before it waits for any answer (``client.futures.method`` does not
block), checks the total against the closed form ``(n-1) n (2n-1) / 6``, saves
it and stops the program.

    python examples/launchpad/consumer_producers.py [--launch-type local_mt|local_mp|rtml]
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]



class Producer:
    """Does the work it is sent; ``name`` tells the answers apart."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sum_of_squares(self, lo: int, hi: int) -> dict[str, Any]:
        return {"producer": self.name, "range": [lo, hi],
                "sum": sum(k * k for k in range(lo, hi))}


def consume(producers: list[Any], n: int, result_dir: str) -> None:
    """Split ``range(n)`` among the producers, gather their sums, check, save, stop."""
    bounds = [n * i // len(producers) for i in range(len(producers) + 1)]
    futures = [producer.futures.sum_of_squares(lo, hi)
               for producer, (lo, hi) in zip(producers, itertools.pairwise(bounds), strict=True)]
    parts = [future.result() for future in futures]  # in producer order: deterministic
    total = sum(part["sum"] for part in parts)
    expected = (n - 1) * n * (2 * n - 1) // 6
    if total != expected:
        raise AssertionError(f"the producers' sums add up to {total}, expected {expected}")
    save(result_dir, "consumer", {"n": n, "parts": parts, "total": total})
    lp.stop()


def make_program(result_dir: str, num_producers: int = 4, n: int = 200_000) -> lp.Program:
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer, f"producer-{i}"))
                     for i in range(num_producers)]
    program.add_node(lp.PyNode(consume, producers, n, result_dir), label="consumer")
    return program


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved."""
    return run_program(make_program, launch_type, timeout, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    parser.add_argument("--producers", type=int, default=4)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.launch_type, num_producers=args.producers), indent=2))


if __name__ == "__main__":
    main()
