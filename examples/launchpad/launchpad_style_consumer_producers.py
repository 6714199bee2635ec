"""Consumer and producers written as Launchpad's examples are: app.run, flags, no wait.

    python examples/launchpad/launchpad_style_consumer_producers.py
        [--lp_launch_type=local_mt|local_mp|rtml] [--num_producers=2] [--num_steps=10]

    consumer (CourierNode(Consumer)), its run(): num_steps times
        --producer_i.futures.work(context)--> producer_i (CourierNode(Producer))
        <-- a future per producer, gathered in order; absl logging.info("Results: ...")
      then prints the total and calls lp.stop(), which ends the producers too

``main`` launches the program and returns; the interpreter waits for the program
at exit, so every step runs. The consumer's ``logging.info`` lines reach stderr
under every launch type (a node process sets up absl logging as Launchpad's do;
under rtml they come through the driver like every print of an actor). Its
``step()`` is also callable on its own, as Launchpad's consumer_producers
launch_test does with ``disable_run()``. Needs absl-py (``pip install absl-py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from absl import app, flags, logging

import rtml.launchpad as lp

_NUM_PRODUCERS = flags.DEFINE_integer("num_producers", 2, "The number of concurrent producers.")
_NUM_STEPS = flags.DEFINE_integer("num_steps", 10, "How many steps the consumer runs.")


class Consumer:
    """Calls every producer once a step and gathers their answers."""

    def __init__(self, producers: list[Any], num_steps: int = 10) -> None:
        self._producers = producers
        self._num_steps = num_steps
        self._steps = 0

    def run(self) -> None:
        """Run the steps, report, and stop the whole program (returning alone would end
        the consumer but not the producers)."""
        total = sum(sum(self.step()) for _ in range(self._num_steps))
        print(f"consumer: {self._num_steps} steps, total {total}", flush=True)
        lp.stop()

    def step(self) -> list[int]:
        """Send each producer its context for this step (all at once), gather in order."""
        base = self._steps * len(self._producers)
        futures = [producer.futures.work(base + i) for i, producer in enumerate(self._producers)]
        results = [future.result() for future in futures]
        self._steps += 1
        logging.info("Results: %s", results)
        return results


class Producer:
    """A bare-bones producer: squares its context. Called from several threads at once,
    so it keeps no state."""

    def work(self, context: int) -> int:
        return context * context


def make_program(num_producers: int = 2, num_steps: int = 10) -> lp.Program:
    """The program: a group of producers and one consumer holding their handles."""
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(num_producers)]
    program.add_node(lp.CourierNode(Consumer, producers=producers, num_steps=num_steps),
                     label="consumer")
    return program


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    lp.launch(make_program(_NUM_PRODUCERS.value, _NUM_STEPS.value))


if __name__ == "__main__":
    app.run(main)
