"""``rtml``: every node an rtml actor on the current cluster, placed by its scheduler.

    launcher (driver): ControllerServer on the driver's node address
      NodeActor.options(name, namespace, per-group resources, max_restarts).remote(payload)
        actor __init__: absl logging (if the launcher has absl; to the worker's stderr,
        which reaches the driver), RemoteController, run the node in a thread, serve
        courier calls on its own node's address
      monitor thread per node: rtml.get(actor.wait_done.remote())
        returns          -> the node ended (its outcome was reported to the controller)
        ActorDiedError   -> the actor is dead for good: the node failed
      a crashed process: rtml restarts the actor (group max_restarts), which runs the
        node again from its constructor; wait_done is retried on the new process
      restart after a reported error: rtml.kill(actor, no_restart=False)

Handles resolve through the controller, so they keep working after a restart
(the node re-registers at its new address).
"""

from __future__ import annotations

import threading
from typing import Any

import cloudpickle

import rtml
from rtml.launchpad import context as ctx
from rtml.launchpad.controller import ControllerServer, RemoteController
from rtml.launchpad.launch import node_logging
from rtml.launchpad.launch.program_handle import LaunchOptions, ProgramHandle
from rtml.launchpad.launch.runner import run_node
from rtml.launchpad.nodes import Node
from rtml.launchpad.program import Program


class NodeActor:
    """The actor a node runs in: the node's thread, plus ``wait_done`` for the launcher."""

    def __init__(self, payload: bytes) -> None:
        data = cloudpickle.loads(payload)
        node_logging.init(data["absl_argv"], data["description"], root=False)
        node: Node = cloudpickle.loads(data["node"])
        controller = RemoteController(data["controller"], data["token"], data["program"],
                                      data["descriptions"])
        context = ctx.NodeContext(node.uid, node.description, controller, _this_node_host(),
                                  data["token"])
        ctx.set_process_default(context)
        self.ok = True
        self.ended = threading.Event()
        threading.Thread(target=self._run, args=(node, context), daemon=True,
                         name="lp-node").start()

    def _run(self, node: Node, context: ctx.NodeContext) -> None:
        self.ok = run_node(node, context)
        self.ended.set()

    def wait_done(self) -> bool:
        self.ended.wait()
        return self.ok


def _this_node_host() -> str:
    node_id = rtml.get_runtime_context().get_node_id()
    for node in rtml.nodes():
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"]).rpartition(":")[0]
    return "127.0.0.1"


class ActorsHandle(ProgramHandle):
    def __init__(self, program: Program, launch_type: str, options: LaunchOptions) -> None:
        super().__init__(program, launch_type, options)
        if not rtml.is_initialized():
            rtml.init()
        self.server = ControllerServer(self.controller, _this_node_host(), self.token)
        self.actor_class = rtml.remote(NodeActor)
        self.actors: dict[str, Any] = {}
        self.namespace = f"launchpad-{self.token[:12]}"

    def start_node(self, node: Node) -> None:
        payload = cloudpickle.dumps({
            "node": self.blobs[node.uid], "controller": self.server.address, "token": self.token,
            "program": self.program.name, "descriptions": self.controller.descriptions,
            "description": node.description, "absl_argv": node_logging.launcher_flags()})
        placement = {"num_cpus": 0, **self.options.resources.get(node.label, {})}
        actor = self.actor_class.options(
            name=f"{node.label}/{node.index}", namespace=self.namespace,
            max_restarts=self.options.max_restarts.get(node.label, 0), max_task_retries=-1,
            max_concurrency=4,
            **placement).remote(payload)
        self.actors[node.uid] = actor
        self._monitor(node, actor)

    def _monitor(self, node: Node, actor: Any) -> None:
        """Wait for the node to end. ``wait_done`` is retried across the actor's restarts
        (``max_task_retries=-1``), so it fails only once rtml gives the actor up."""
        def watch() -> None:
            try:
                rtml.get(actor.wait_done.remote())
            except Exception as exc:  # ActorDiedError: restarts used up (or driver gone)
                if self.running(node):
                    self.crashed(node, f"died and cannot restart: {exc}", final=True)

        threading.Thread(target=watch, daemon=True, name=f"lp-watch-{node.label}").start()

    def restart_node(self, node: Node) -> None:
        """Kill the node's actor so that rtml restarts it (running the node again)."""
        rtml.kill(self.actors[node.uid], no_restart=False)

    def kill_all(self) -> None:
        for actor in self.actors.values():
            rtml.kill(actor)

    def cleanup(self) -> None:
        self.kill_all()
        self.server.close()
