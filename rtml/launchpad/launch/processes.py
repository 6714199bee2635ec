"""``local_mp``: every node its own Python process on this machine.

    launcher: ControllerServer (127.0.0.1) --payload on stdin--> python -m
              rtml.launchpad.launch.process_entry (one per node)
    node process: absl logging (if the launcher has absl) -> RemoteController -> run_node
                  -> finished / failed -> exit
    a process that dies without reporting is a crash (restarted, or fails the program)
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import cloudpickle

from rtml.launchpad.controller import ControllerServer
from rtml.launchpad.launch import node_logging
from rtml.launchpad.launch.program_handle import LaunchOptions, ProgramHandle
from rtml.launchpad.nodes import Node
from rtml.launchpad.program import Program


class ProcessesHandle(ProgramHandle):
    def __init__(self, program: Program, launch_type: str, options: LaunchOptions) -> None:
        super().__init__(program, launch_type, options)
        self.server = ControllerServer(self.controller, "127.0.0.1", self.token)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start_node(self, node: Node) -> None:
        payload = cloudpickle.dumps({
            "node": self.blobs[node.uid], "controller": self.server.address, "token": self.token,
            "program": self.program.name, "descriptions": self.controller.descriptions,
            "host": "127.0.0.1", "description": node.description,
            "absl_argv": node_logging.launcher_flags()})
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-m", "rtml.launchpad.launch.process_entry"],
                                stdin=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()
        self.procs[node.uid] = proc
        threading.Thread(target=self._watch, args=(node, proc), daemon=True,
                         name=f"lp-watch-{node.label}").start()

    def _watch(self, node: Node, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        if self.procs.get(node.uid) is proc and self.running(node) and code != 0:
            self.crashed(node, f"exited with code {code} before reporting how it ended")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.server.close()
