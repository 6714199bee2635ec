"""A node manager process's entry: start the worker template first, then import the rest.

    python -m rtml.scheduler.node_main CONFIG_JSON READY_FD
        Popen(python -m rtml.core.worker_zygote)   at once: it imports the worker code...
        import rtml.scheduler.node_manager          ...while this process imports its own
        node_manager.main(argv, zygote)             adopts the zygote's pipes

The two imports (~0.2 s each) overlap instead of running one after the other,
so the node's first worker is ready that much sooner after ``rtml.init()``.
The token reaches the zygote in the environment this process inherited.
"""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    zygote = subprocess.Popen([sys.executable, "-m", "rtml.core.worker_zygote"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    from rtml.scheduler import node_manager
    return node_manager.main(argv, zygote)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
