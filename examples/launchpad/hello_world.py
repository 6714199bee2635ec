"""Hello world: a CourierNode server and a PyNode client that calls it, then stops the program.

    client (PyNode) --server.greet(name)--> server (CourierNode(Greeter))

The client gets the server's handle in its arguments; inside the node it is a
courier client whose ``greet`` blocks until the server answers. When the
client is done it calls ``lp.stop()``, which ends the server too.

    python examples/launchpad/hello_world.py [--launch-type local_mt|local_mp|rtml]

The client saves what it got as JSON in ``result_dir`` (every launch type here
runs on this machine); ``run()`` returns it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import rtml.launchpad as lp

LAUNCH_TYPES = ("local_mt", "local_mp", "rtml")


class Greeter:
    """The server: its public methods are what other nodes can call."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    def greet(self, name: str) -> str:
        return f"{self.greeting}, {name}!"


def greet_everyone(server: Any, names: list[str], result_dir: str) -> None:
    """The client: call the server once per name, save the answers, stop the program."""
    greetings = [server.greet(name) for name in names]
    save(result_dir, "client", {"greetings": greetings})
    lp.stop()


def make_program(result_dir: str, names: tuple[str, ...] = ("Ada", "Grace")) -> lp.Program:
    program = lp.Program("hello_world")
    server = program.add_node(lp.CourierNode(Greeter, "Hello"), label="server")
    program.add_node(lp.PyNode(greet_everyone, server, list(names), result_dir),
                     label="client")
    return program


def save(result_dir: str, name: str, value: Any) -> None:
    """Save one node's result as ``<result_dir>/<name>.json``."""
    Path(result_dir, f"{name}.json").write_text(json.dumps(value))


def run(launch_type: str = "local_mt", timeout: float = 60.0, **options: Any) -> dict[str, Any]:
    """Launch the program, wait for it to end, and return what its nodes saved.

    Raises what a node raised, or TimeoutError if the program is still running
    after ``timeout`` seconds (it is stopped first).
    """
    with tempfile.TemporaryDirectory() as result_dir:
        handle = lp.launch(make_program(result_dir, **options), launch_type=launch_type)
        if not handle.wait(timeout):
            handle.stop()
            handle.wait(handle.grace_period + 5)
            raise TimeoutError(f"the program was still running after {timeout:g} s")
        return {p.stem: json.loads(p.read_text()) for p in Path(result_dir).glob("*.json")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch-type", default="local_mt", choices=LAUNCH_TYPES)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.launch_type), indent=2))


if __name__ == "__main__":
    main()
