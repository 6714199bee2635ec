"""``local_mt`` and ``test_mt``: every node a thread of this process.

Node definitions still go through pickling (each node runs a copy made with
cloudpickle), and calls between nodes still go through courier sockets, so a
program behaves as it will under ``local_mp`` and ``rtml``. ``test_mt`` is for
unit tests: the first node to fail stops the program at once (no grace period,
no restarts) and ``wait()`` raises its error.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
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
        if launch_type == "test_mt":
            options = dataclasses.replace(options, max_restarts={}, grace_period=0.0)
        super().__init__(program, launch_type, options)
        self.threads: dict[str, threading.Thread] = {}

    def start_node(self, node: Node) -> None:
        copy: Node = cloudpickle.loads(self.blobs[node.uid])
        context = ctx.NodeContext(node.uid, node.description, self.controller, "127.0.0.1",
                                  self.token)
        thread = threading.Thread(target=_run_killable, args=(copy, context), daemon=True,
                                  name=f"lp-{node.label}-{node.index}")
        self.threads[node.uid] = thread
        thread.start()

    def kill_all(self) -> None:
        """Threads cannot be killed: raise SystemExit in each at its next bytecode."""
        for thread in self.threads.values():
            if thread.is_alive() and thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(SystemExit))
