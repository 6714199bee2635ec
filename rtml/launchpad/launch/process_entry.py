"""The entry point of every node process: ``python -m rtml.launchpad.launch.process_entry``.

Reads its node and how to reach the program's controller (a cloudpickle) from
stdin, sets up absl logging when the launcher has absl (as Launchpad's node
processes, which run under absl's app.run), runs the node, reports how it
ended, and exits (1 if it failed).
"""

from __future__ import annotations

import logging
import sys

import cloudpickle

from rtml.launchpad import context as ctx
from rtml.launchpad.controller import RemoteController
from rtml.launchpad.launch import node_logging
from rtml.launchpad.launch.runner import run_node


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    payload = cloudpickle.loads(sys.stdin.buffer.read())
    node_logging.init(payload["absl_argv"], payload["description"], root=True)
    node = cloudpickle.loads(payload["node"])
    controller = RemoteController(payload["controller"], payload["token"],
                                  payload["program"], payload["descriptions"])
    context = ctx.NodeContext(node.uid, node.description, controller, payload["host"],
                              payload["token"])
    ctx.set_process_default(context)
    return 0 if run_node(node, context) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
