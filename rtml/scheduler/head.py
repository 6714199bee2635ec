"""The head service: node table, global placement, actors, jobs.

    node managers --RegisterNode/NodeHeartbeat--> node view (resources, pending demand)
                  --SpillLease--> GlobalScheduler.place --LeasePlaced--> origin node manager
    no heartbeat for node_timeout s, or its connection closed --> node dead: NodeDied to
                  every node manager and driver; its actors restart elsewhere or die
    drivers --CreateActor--> pick a node that fits --StartActor--> node manager
                             <--ActorStarted / ActorWorkerDied-- restart or mark DEAD
    callers --GetActorInfo--> answered when the actor is ALIVE (at a new address) or DEAD
    actor DEAD for good --ActorInfo(req_id 0)--> its creator (lets go of its arguments)
    driver disconnects --> its job ends; its non-detached actors are killed; its tasks
                           still PENDING are recorded FAILED (in a thread, at job end only)

Every state change is written to the control plane (Redis). Timeline events (NodeRegistered,
NodeDied, JobStarted, JobFinished, ActorStateChanged) go through a BatchedWriter that
flushes every EVENT_FLUSH_INTERVAL s, so a burst of them is one pipelined call.
Run as ``python -m rtml.scheduler.head CONFIG_JSON READY_FD``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtml.config import HEARTBEAT_INTERVAL, HeadConfig
from rtml.control_plane import BatchedWriter, ControlPlane
from rtml.daemon import die_with_parent, report_ready, setup_logging
from rtml.rpc import messages as m
from rtml.rpc.server import Peer, Service, protocol_factory
from rtml.scheduler import placement as pl
from rtml.scheduler.resources import fits
from rtml.session import Session

log = logging.getLogger(__name__)

EVENT_FLUSH_INTERVAL = 0.1
DRIVER_EXITED = "the driver exited"


@dataclass
class NodeState:
    view: pl.NodeView
    peer: Peer
    session_dir: str
    transfer_address: str = ""

    @property
    def alive(self) -> bool:
        return self.view.alive

    def entry(self) -> m.NodeEntry:
        view = self.view
        return m.NodeEntry(view.node_id, view.address, self.transfer_address, view.alive)


@dataclass
class ActorState:
    spec: m.ActorSpec
    state: str = "PENDING"
    address: str = ""
    node_id: bytes = b""
    restarts: int = 0
    error: str = ""
    tcp_address: str = ""
    no_restart: bool = False
    waiters: list[tuple[Peer, int, str]] = field(default_factory=list)
    owner: Peer | None = None  # its creator's connection: told when it is DEAD for good


class HeadService(Service):
    def __init__(self, cfg: HeadConfig) -> None:
        self.cfg = cfg
        self.token = cfg.token
        self.plane = ControlPlane(cfg.redis_host, cfg.redis_port, cfg.token)
        self.events = BatchedWriter(self.plane, interval=EVENT_FLUSH_INTERVAL)
        self.background: set[asyncio.Future[None]] = set()
        self.nodes: dict[bytes, NodeState] = {}
        self.sched = pl.GlobalScheduler()
        self.actors: dict[bytes, ActorState] = {}
        self.pending_actors: list[bytes] = []
        self.jobs: dict[bytes, Peer] = {}
        self.stopped = asyncio.Event()

    def on_hello(self, peer: Peer, hello: m.Hello) -> m.HelloReply:
        return m.HelloReply(ok=True, info={"redis_host": self.cfg.redis_host,
                                           "redis_port": str(self.cfg.redis_port)})

    def on_message(self, peer: Peer, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("unexpected %s", type(msg).__name__)
            return
        handler(self, peer, msg)

    def on_disconnect(self, peer: Peer) -> None:
        for node_id, node in list(self.nodes.items()):
            if node.peer is peer and node.alive:
                self._node_died(node_id, "its connection to the head closed")
        for job_id, job_peer in list(self.jobs.items()):
            if job_peer is peer:
                del self.jobs[job_id]
                self.plane.finish_job(job_id)
                self.plane.put_job(job_id, {"status": "FINISHED", "end_ts": time.time()})
                self._event("JobFinished", job_id=job_id)
                self._end_job(job_id)

    def _end_job(self, job_id: bytes) -> None:
        for actor in self.actors.values():
            if actor.spec.job_id == job_id and not actor.spec.detached \
                    and actor.state != "DEAD":
                self._kill(actor, "its driver exited")
        self._in_thread(fail_pending_tasks, self.plane, job_id)

    def _in_thread(self, fn: Any, *args: Any) -> None:
        """Run blocking control-plane work off the event loop; keep the future owned."""
        future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self.background.add(future)
        future.add_done_callback(self.background.discard)

    def _event(self, kind: str, **fields: Any) -> None:
        """Queue a timeline event; the writer's thread appends it within ~0.1 s."""
        self.events.submit_event({"kind": kind, "ts": time.time(), **fields})

    # -- nodes and jobs ----------------------------------------------------------------------

    def _register_node(self, peer: Peer, msg: m.RegisterNode) -> None:
        view = pl.NodeView(msg.node_id, msg.address, msg.resources, dict(msg.resources),
                           last_heartbeat=time.monotonic())
        self.nodes[msg.node_id] = NodeState(view, peer, msg.session_dir, msg.transfer_address)
        self.plane.put_node(msg.node_id, {"address": msg.address, "resources": msg.resources,
                                          "session_dir": msg.session_dir, "alive": True,
                                          "start_ts": time.time()})
        self._event("NodeRegistered", node_id=msg.node_id, address=msg.address,
                    resources=msg.resources)
        self._broadcast_nodes()
        self._decided(self.sched.node_added(view))
        self._place_pending()

    def _transfer_ready(self, peer: Peer, msg: m.NodeTransferReady) -> None:
        node = self.nodes.get(msg.node_id)
        if node is not None:
            node.transfer_address = msg.transfer_address
            self._broadcast_nodes()

    def _broadcast_nodes(self) -> None:
        table = m.NodeTable([node.entry() for node in self.nodes.values()])
        for node in self.nodes.values():
            if node.alive:
                node.peer.send(table)

    def _heartbeat(self, peer: Peer, msg: m.NodeHeartbeat) -> None:
        self._decided(self.sched.heartbeat(msg.node_id, msg.available, time.monotonic()))
        self.plane.heartbeat(msg.node_id, msg.available, msg.pending_shapes)
        if self.pending_actors:
            self._place_pending()

    def check_liveness(self) -> None:
        """Declare dead every node silent for longer than the node timeout."""
        for node_id in self.sched.expired(time.monotonic(), self.cfg.node_timeout):
            self._node_died(node_id, f"it sent no heartbeat for {self.cfg.node_timeout:g} s")

    def _node_died(self, node_id: bytes, reason: str) -> None:
        node = self.nodes[node_id]
        self.sched.node_died(node_id)
        self.plane.mark_node_dead(node_id)
        self._event("NodeDied", node_id=node_id, reason=reason)
        log.warning("node %s is dead: %s", node_id.hex(), reason)
        node.peer.send(m.Shutdown())  # should it come back, it must not serve stale state
        notice = m.NodeDied(node_id, reason)  # node managers tell their drivers and workers
        for other in self.nodes.values():
            if other.alive:
                other.peer.send(notice)
        self._broadcast_nodes()
        for actor in list(self.actors.values()):
            if actor.node_id == node_id and actor.state in ("ALIVE", "PENDING", "RESTARTING"):
                self._actor_died(node.peer, m.ActorWorkerDied(
                    actor.spec.actor_id, f"its node {node_id.hex()} died: {reason}"))

    # -- spilled lease requests (the global scheduler) ---------------------------------------

    def _spill_lease(self, peer: Peer, msg: m.SpillLease) -> None:
        origin = self._node_of(peer)
        if origin is None:
            return
        request = pl.Request(origin, msg.req_id, msg.shape, msg.strategy, msg.preferred_node,
                             msg.must_move)
        decision = self.sched.place(request)
        if isinstance(decision, pl.Pending):
            peer.send(m.LeasePlaced(msg.req_id, b"", "", infeasible=True))
        elif not isinstance(decision, pl.Parked):
            self._decided([decision])

    def _spill_withdrawn(self, peer: Peer, msg: m.CancelLeaseRequest) -> None:
        origin = self._node_of(peer)
        if origin is not None:
            self.sched.withdraw(origin, msg.req_id)

    def _decided(self, decisions: list[pl.Decision]) -> None:
        for decision in decisions:
            origin = self.nodes.get(decision.request.origin)
            if origin is None or not origin.alive:
                continue
            req_id = decision.request.req_id
            if isinstance(decision, pl.Placed):
                origin.peer.send(m.LeasePlaced(req_id, decision.node_id, decision.address))
            elif isinstance(decision, pl.Failed):
                origin.peer.send(m.LeasePlaced(req_id, b"", "", error=decision.error))

    def _node_of(self, peer: Peer) -> bytes | None:
        for node_id, node in self.nodes.items():
            if node.peer is peer and node.alive:
                return node_id
        return None

    def _register_job(self, peer: Peer, msg: m.RegisterJob) -> None:
        self.jobs[msg.job_id] = peer
        self.plane.put_job(msg.job_id, {"pid": msg.pid, "namespace": msg.namespace,
                                        "cwd": msg.cwd, "start_ts": time.time(),
                                        "status": "RUNNING"})
        self._event("JobStarted", job_id=msg.job_id, pid=msg.pid, namespace=msg.namespace)

    def _output(self, peer: Peer, msg: m.WorkerOutput) -> None:
        """Worker prints, from any node, go to the driver of the job that printed them."""
        if msg.job_id:
            driver = self.jobs.get(msg.job_id)
            if driver is not None:
                driver.send(msg)
        else:
            for driver in self.jobs.values():
                driver.send(msg)

    def _cluster_info(self, peer: Peer, msg: m.GetClusterInfo) -> None:
        nodes: list[dict[str, object]] = [
            {"NodeID": n.view.node_id.hex(), "Alive": n.alive,
             "NodeManagerAddress": n.view.address, "Resources": n.view.total,
             "Available": n.view.available, "SessionDir": n.session_dir}
            for n in self.nodes.values()]
        peer.send(m.ClusterInfo(msg.req_id, nodes))

    # -- actors ------------------------------------------------------------------------------

    def _create_actor(self, peer: Peer, msg: m.CreateActor) -> None:
        spec = msg.spec
        if spec.name:
            existing = self._named(spec.namespace, spec.name)
            if existing is not None:
                if msg.get_if_exists:
                    peer.send(self._info(msg.req_id, existing))
                else:
                    peer.send(m.ActorInfo(msg.req_id, spec.actor_id, "DEAD", error=(
                        f"an actor named {spec.name!r} already exists in namespace "
                        f"{spec.namespace!r}; pick another name, or pass "
                        f"get_if_exists=True to reuse it")))
                return
            self.plane.set_named_actor(spec.namespace, spec.name, spec.actor_id)
        actor = self.actors[spec.actor_id] = ActorState(spec, owner=peer)
        self._record(actor)
        if msg.req_id:
            peer.send(self._info(msg.req_id, actor))
        self._place(actor)

    def _named(self, namespace: str, name: str) -> ActorState | None:
        for actor in self.actors.values():
            if actor.spec.name == name and actor.spec.namespace == namespace \
                    and actor.state != "DEAD":
                return actor
        return None

    def _place(self, actor: ActorState) -> None:
        view = self._actor_node(actor.spec)
        if view is None:
            if actor.spec.actor_id not in self.pending_actors:
                self.pending_actors.append(actor.spec.actor_id)
            return
        actor.node_id = view.node_id
        self.nodes[view.node_id].peer.send(m.StartActor(actor.spec))

    def _actor_node(self, spec: m.ActorSpec) -> pl.NodeView | None:
        affinity = pl.parse_affinity(spec.strategy)
        if affinity is not None:
            node = self.nodes.get(affinity[0])
            if node is not None and node.alive and fits(spec.shape, node.view.total):
                return node.view
            if not affinity[1]:
                return None
        return self.sched.pick_for_actor(spec.shape, spread=spec.strategy == pl.SPREAD)

    def _place_pending(self) -> None:
        pending, self.pending_actors = self.pending_actors, []
        for actor_id in pending:
            actor = self.actors.get(actor_id)
            if actor is not None and actor.state in ("PENDING", "RESTARTING"):
                self._place(actor)

    def _actor_started(self, peer: Peer, msg: m.ActorStarted) -> None:
        actor = self.actors.get(msg.actor_id)
        if actor is None:
            return
        if msg.error:
            actor.no_restart = True
            actor.error = f"the actor's constructor failed: {msg.error}"
            self._kill(actor, actor.error)
            return
        if actor.no_restart:  # killed while it was (re)starting: its worker came up anyway
            self._kill(actor, actor.error or "it was killed while starting")
            return
        actor.state, actor.address, actor.tcp_address = "ALIVE", msg.address, msg.tcp_address
        self._record(actor)
        self._answer(actor)

    def _actor_died(self, peer: Peer, msg: m.ActorWorkerDied) -> None:
        actor = self.actors.get(msg.actor_id)
        if actor is None or actor.state == "DEAD":
            return
        restarts_left = actor.spec.max_restarts < 0 or actor.restarts < actor.spec.max_restarts
        if actor.no_restart or not restarts_left:
            self._mark_dead(actor, actor.error or f"its process died ({msg.reason}) and "
                                                  f"max_restarts={actor.spec.max_restarts} "
                                                  f"is used up")
            return
        actor.restarts += 1
        actor.state, actor.address = "RESTARTING", ""
        self._record(actor)
        self._place(actor)

    def _kill_actor(self, peer: Peer, msg: m.KillActor) -> None:
        actor = self.actors.get(msg.actor_id)
        if actor is not None and actor.state != "DEAD":
            actor.no_restart = msg.no_restart
            self._kill(actor, msg.reason or "it was killed with rtml.kill()")

    def _kill(self, actor: ActorState, why: str) -> None:
        if not actor.error:
            actor.error = why
        node = self.nodes.get(actor.node_id)
        if actor.no_restart or actor.state == "PENDING" or node is None:
            actor.no_restart = True
        if node is not None and node.alive:
            node.peer.send(m.KillActorWorker(actor.spec.actor_id))
        else:
            self._mark_dead(actor, why)

    def _mark_dead(self, actor: ActorState, why: str) -> None:
        actor.state, actor.address = "DEAD", ""
        actor.error = actor.error or why
        if actor.spec.name:
            self.plane.delete_named_actor(actor.spec.namespace, actor.spec.name,
                                          actor.spec.actor_id)
        self._record(actor)
        self._answer(actor)
        if actor.owner is not None:  # unasked (req_id 0): it lets go of the arguments
            actor.owner.send(self._info(0, actor))
            actor.owner = None

    def _get_actor(self, peer: Peer, msg: m.GetActorInfo) -> None:
        actor = (self._named(msg.namespace, msg.name) if msg.name
                 else self.actors.get(msg.actor_id))
        if actor is None:
            peer.send(m.ActorInfo(msg.req_id, msg.actor_id, "MISSING",
                                  error="no such actor"))
            return
        settled = actor.state == "DEAD" or (
            actor.state == "ALIVE" and actor.address != msg.stale_address)
        if settled or not msg.wait_ready:
            peer.send(self._info(msg.req_id, actor))
        else:
            actor.waiters.append((peer, msg.req_id, msg.stale_address))

    def _answer(self, actor: ActorState) -> None:
        waiters, actor.waiters = actor.waiters, []
        for peer, req_id, stale in waiters:
            if actor.state == "DEAD" or actor.address != stale:
                peer.send(self._info(req_id, actor))
            else:
                actor.waiters.append((peer, req_id, stale))

    def _info(self, req_id: int, actor: ActorState) -> m.ActorInfo:
        return m.ActorInfo(req_id, actor.spec.actor_id, actor.state, actor.address,
                           actor.error, actor.spec, actor.tcp_address, actor.node_id)

    def _record(self, actor: ActorState) -> None:
        spec = actor.spec
        reason = actor.error if actor.state == "DEAD" else ""
        if actor.state == "RESTARTING":
            reason = f"restart {actor.restarts} of {spec.max_restarts}"
        self._event("ActorStateChanged", actor_id=spec.actor_id, job_id=spec.job_id,
                    class_name=spec.class_name, name=spec.name, state=actor.state,
                    node_id=actor.node_id, reason=reason)
        self.plane.put_actor(spec.actor_id, {
            "actor_id": spec.actor_id.hex(), "class_name": spec.class_name,
            "state": actor.state, "name": spec.name, "namespace": spec.namespace,
            "job_id": spec.job_id.hex(), "node_id": actor.node_id.hex(),
            "address": actor.address, "restarts": actor.restarts, "error": actor.error,
            "detached": spec.detached, "max_restarts": spec.max_restarts})

    _handlers: dict[type, Any] = {
        m.RegisterNode: _register_node, m.NodeHeartbeat: _heartbeat,
        m.RegisterJob: _register_job, m.GetClusterInfo: _cluster_info,
        m.CreateActor: _create_actor, m.ActorStarted: _actor_started,
        m.ActorWorkerDied: _actor_died, m.KillActor: _kill_actor,
        m.GetActorInfo: _get_actor, m.NodeTransferReady: _transfer_ready,
        m.SpillLease: _spill_lease, m.WorkerOutput: _output,
        m.CancelLeaseRequest: _spill_withdrawn,
    }


def fail_pending_tasks(plane: ControlPlane, job_id: bytes) -> None:
    """Record the job's tasks still PENDING as FAILED: their driver (owner) has exited.

    Runs once per job end, in a thread. Errors are logged, not raised.
    """
    try:
        pending = plane.list_tasks({"job_id": job_id.hex(), "status": "PENDING"})
        now = time.time()
        plane.write_task_records([
            {"task_id": bytes.fromhex(task["task_id"]), "status": "FAILED",
             "error": DRIVER_EXITED, "end_ts": now} for task in pending])
    except Exception:
        log.exception("could not mark the pending tasks of job %s failed", job_id.hex())


async def serve(cfg: HeadConfig, ready_fd: int) -> None:
    head = HeadService(cfg)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop_on_signal, head, sig)
    if cfg.listen_fd >= 0:
        sock = socket.socket(fileno=cfg.listen_fd)
        server = await loop.create_server(protocol_factory(head), sock=sock)
    else:
        server = await loop.create_server(protocol_factory(head), cfg.host, cfg.port)
    port = server.sockets[0].getsockname()[1]
    log.info("head service pid %d serving on %s:%d", os.getpid(), cfg.host, port)
    report_ready(ready_fd, f"ok {cfg.host}:{port}")
    liveness = asyncio.create_task(_watch_liveness(head))
    try:
        await head.stopped.wait()
    finally:
        liveness.cancel()
        for node in head.nodes.values():
            if node.alive:
                node.peer.send(m.Shutdown())
        server.close()
        if head.background:
            await asyncio.wait(head.background, timeout=5.0)
        head.events.close()
        head.plane.close()


def _stop_on_signal(head: HeadService, sig: signal.Signals) -> None:
    log.info("stopping on %s", sig.name)
    head.stopped.set()


async def _watch_liveness(head: HeadService) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_INTERVAL)
        head.check_liveness()


def main(argv: list[str]) -> int:
    cfg = HeadConfig.from_json(argv[1])
    ready_fd = int(argv[2]) if len(argv) > 2 else -1
    if os.environ.get("RTML_DIE_WITH_PARENT") == "1":
        die_with_parent()
    setup_logging(str(Session(Path(cfg.session_dir)).log_file("head")))
    try:
        asyncio.run(serve(cfg, ready_fd))
    except Exception:
        log.exception("head service failed")
        with contextlib.suppress(OSError):
            report_ready(ready_fd, "error see head.log")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
