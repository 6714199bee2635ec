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
from typing import Any

import rtml.launchpad as lp

try:  # imported as examples.launchpad.<name> (tests), or run as a script from its directory
    from examples.launchpad.results import LAUNCH_TYPES, run_program, save
except ImportError:
    from results import LAUNCH_TYPES, run_program, save  # type: ignore[no-redef]



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
