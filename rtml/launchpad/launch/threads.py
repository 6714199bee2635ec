"""``local_mt`` and ``test_mt``: every node a thread of this process.

    ThreadsHandle.start_node: a copy of the node (cloudpickle), or with serialize=False
        the node itself --> thread lp-<label>-<index>: run_node(node, context)
    calls between nodes: courier sockets, as in every launch type
    kill_all (after the grace period): SystemExit raised in the threads still running

By default ``local_mt`` runs copies, so a program behaves as it will under
``local_mp`` and ``rtml``; ``test_mt`` runs the nodes themselves, as Launchpad's
test launches do. ``test_mt`` is for tests: no restarts, the first node to fail
stops the program (a grace period of TEST_GRACE_PERIOD by default) and ``wait()``
raises its error.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import cloudpickle

from rtml.launchpad import context as ctx
from rtml.launchpad.launch.program_handle import LaunchOptions, ProgramHandle
from rtml.launchpad.launch.runner import run_node
from rtml.launchpad.nodes import Node
from rtml.launchpad.program import Program


def _run_killable(node: Node, context: ctx.NodeContext) -> None:
    """The thread of a node: the SystemExit that kill_all raises in it ends it quietly."""
    with contextlib.suppress(SystemExit):
        run_node(node, context)


class ThreadsHandle(ProgramHandle):
    def __init__(self, program: Program, launch_type: str, options: LaunchOptions) -> None:
        super().__init__(program, launch_type, options)
        self.threads: dict[str, threading.Thread] = {}

    def start_node(self, node: Node) -> None:
        runs = cloudpickle.loads(self.blobs[node.uid]) if self.options.serialize else node
        context = ctx.NodeContext(node.uid, node.description, self.controller, "127.0.0.1",
                                  self.token)
        thread = threading.Thread(target=_run_killable, args=(runs, context), daemon=True,
                                  name=f"lp-{node.label}-{node.index}")
        self.threads[node.uid] = thread
        thread.start()

    def kill_all(self) -> None:
        """Threads cannot be killed: raise SystemExit in each node's thread at its next
        bytecode. A node that has ended is left alone (its thread may still be reporting)."""
        for uid, thread in self.threads.items():
            if thread.is_alive() and thread.ident is not None and self.running(self.nodes[uid]):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(SystemExit))
