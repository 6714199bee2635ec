"""The node manager process: start the worker template first, then import the rest.

    python -m rtml.node.main CONFIG_JSON READY_FD
        Popen(python -m rtml.worker.zygote)   at once: it imports the worker code...
        import rtml.node.manager              ...while this process imports its own
        manager.run(argv, zygote)             adopts the zygote's pipes

The two imports (~0.2 s each) overlap instead of running one after the other,
so the node's first worker is ready that much sooner after ``rtml.init()``.
The token reaches the zygote in the environment this process inherited.
"""

from __future__ import annotations

import os
import subprocess
import sys

from rtml.config import DIE_WITH_PARENT_ENV


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    env[DIE_WITH_PARENT_ENV] = str(os.getpid())  # the zygote, and so every worker, dies with us
    zygote = subprocess.Popen([sys.executable, "-m", "rtml.worker.zygote"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    from rtml.node import manager
    return manager.run(argv, zygote)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
