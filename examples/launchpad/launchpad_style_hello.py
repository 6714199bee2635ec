"""Hello world written as Launchpad's examples are: absl's app.run, --lp_launch_type, no wait.

    python examples/launchpad/launchpad_style_hello.py [--lp_launch_type=local_mt|local_mp|rtml]
                                                        [--greeting="Hello World!!!"]

    main: make_program() --> lp.launch(program) returns at once --> main returns
    hello_printer (PyClassNode(HelloWorld)): run() prints the greeting and returns
    the interpreter waits for the program at exit (as Launchpad's local launches
    do), so the greeting is printed before the script ends

The greeting is a flag read in the launcher and passed to the node as an
argument: a node in its own process (local_mp, rtml) does not see the
launcher's flags. Needs absl-py (``pip install absl-py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import app, flags

import rtml.launchpad as lp

_GREETING = flags.DEFINE_string("greeting", "Hello World!!!", "What the node prints.")


class HelloWorld:
    """A node that prints its greeting and exits."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    def run(self) -> None:
        print(self.greeting, flush=True)


def make_program(greeting: str = "Hello World!!!") -> lp.Program:
    """The program: one node."""
    program = lp.Program("hello_world")
    program.add_node(lp.PyClassNode(HelloWorld, greeting), label="hello_printer")
    return program


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    lp.launch(make_program(_GREETING.value))


if __name__ == "__main__":
    app.run(main)
