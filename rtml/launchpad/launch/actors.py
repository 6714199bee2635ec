"""``rtml``: every node an rtml actor on the current cluster, placed by its scheduler.

    launcher (driver): ControllerServer on the driver's node address
      NodeActor.options(name, namespace, per-group resources, max_restarts).remote(payload)
        actor __init__: RemoteController, run the node in a thread, serve courier calls
        on its own node's address
      monitor thread per node: rtml.get(actor.wait_done.remote())
        returns          -> the node ended (its outcome was reported to the controller)
        ActorDiedError   -> its process died: a crash (rtml restarts the actor if the
                            group allows; the node runs again from its constructor)
      restart after a reported error: rtml.kill(actor, no_restart=False)

Handles resolve through the controller, so they keep working after a restart
(the node re-registers at its new address).
"""

from __future__ import annotations

import threading
from typing import Any

import cloudpickle

import rtml
from rtml.exceptions import ActorDiedError
from rtml.launchpad import context as ctx
from rtml.launchpad.controller import ControllerServer, RemoteController
from rtml.launchpad.launch.program_handle import ProgramHandle
from rtml.launchpad.launch.runner import run_node
from rtml.launchpad.nodes import Node
from rtml.launchpad.program import Program


class NodeActor:
    """The actor a node runs in: the node's thread, plus ``wait_done`` for the launcher."""

    def __init__(self, payload: bytes) -> None:
        data = cloudpickle.loads(payload)
        node: Node = data["node"]
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
    def __init__(self, program: Program, launch_type: str, max_restarts: dict[str, int] | None,
                 grace_period: float, resources: dict[str, dict[str, Any]] | None) -> None:
        super().__init__(program, launch_type, max_restarts, grace_period)
        if not rtml.is_initialized():
            rtml.init()
        self.resources = resources or {}
        self.server = ControllerServer(self.controller, _this_node_host(), self.token)
        self.actor_class = rtml.remote(NodeActor)
        self.actors: dict[str, Any] = {}
        self.namespace = f"launchpad-{self.token[:12]}"
        self.max_restarts = max_restarts or {}
        self._restarting_itself: set[str] = set()  # crashed; rtml restarts the actor

    def start_node(self, node: Node) -> None:
        payload = cloudpickle.dumps({
            "node": node, "controller": self.server.address, "token": self.token,
            "program": self.program.name, "descriptions": self.controller.descriptions})
        options = {"num_cpus": 0, **self.resources.get(node.label, {})}
        actor = self.actor_class.options(
            name=f"{node.label}/{node.index}", namespace=self.namespace,
            max_restarts=self.max_restarts.get(node.label, 0), max_concurrency=4,
            **options).remote(payload)
        self.actors[node.uid] = actor
        self._monitor(node, actor)

    def _monitor(self, node: Node, actor: Any) -> None:
        def watch() -> None:
            try:
                rtml.get(actor.wait_done.remote())
            except ActorDiedError as exc:
                if self.actors.get(node.uid) is actor and self.running(node):
                    self._restarting_itself.add(node.uid)
                    self.crashed(node, f"died: {exc}")
            except Exception as exc:  # the driver is shutting down
                if self.running(node):
                    self.crashed(node, f"could not be watched: {exc!r}")

        threading.Thread(target=watch, daemon=True, name=f"lp-watch-{node.label}").start()

    def restart_node(self, node: Node) -> None:
        """Have rtml restart the node's actor (it runs the node again from its constructor).

        After a crash rtml is already restarting it; after a reported error it is
        killed with ``no_restart=False``.
        """
        actor = self.actors[node.uid]
        if node.uid in self._restarting_itself:
            self._restarting_itself.discard(node.uid)
        else:
            rtml.kill(actor, no_restart=False)
        self._monitor(node, actor)

    def kill_all(self) -> None:
        for actor in self.actors.values():
            rtml.kill(actor)

    def cleanup(self) -> None:
        self.kill_all()
        self.server.close()
