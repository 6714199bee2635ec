"""The head service's I/O shell: node table, global placement, actors, jobs.

    node managers --RegisterNode/NodeHeartbeat--> node view (resources, pending demand)
                  --SpillLease--> GlobalScheduler.place --LeasePlaced--> origin node manager
    no heartbeat for node_timeout s, or its connection closed --> node dead: NodeDied to
                  every node manager and driver; its actors restart elsewhere or die
    drivers --CreateActor--> ActorDirectory (rtml.head.actors) --StartActor--> node manager
                             <--ActorStarted / ActorWorkerDied-- restart or mark DEAD
    callers --GetActorInfo--> answered when the actor is ALIVE (at a new address) or DEAD
    driver --FlushOutput--> every node manager --> OutputFlushed to the driver once all did
    driver disconnects --> its job ends; its non-detached actors are killed; its tasks
                           still PENDING are recorded FAILED (at job end only)
    cli --SubmitJob / StopJob / ListJobs / GetJobLogs--> JobRunner (rtml.head.job_runner):
                           submitted jobs' entrypoints run as the head's child processes
    heartbeats, spills placed --> HeadMetrics (rtml.head.metrics), read by a scrape of
                           /metrics when the head serves them (rtml.head.main)

A head that restarted (its supervisor starts it again on the same listening socket)
first rebuilds what its predecessor knew from the control plane (``recover``): the nodes
recorded alive, the jobs still running, every actor with its spec. Node managers, drivers
and workers reconnect on their own. A node rejoins with the actors it runs; a driver's
hello takes its job back; a creator sends its actors' CreateActor again, which makes them
its own again (and creates any whose record was lost). Within node_timeout s
of the restart, what did not come back is dead: nodes (their actors restart elsewhere),
jobs (ended as when their driver leaves), and the orphaned actors of owners that never
reconnected. Actor placement waits until every recorded node is back or dead, so an
actor a node is still starting is not started twice.

The decisions are the pure cores': ``GlobalScheduler`` (``rtml.scheduler.placement``)
places leases, ``ActorDirectory`` runs actors' lives; this module turns messages into
their events and their commands into messages and control-plane writes.

Every state change is written to the control plane (Redis), off the event loop: writes go
in order through one thread (``rtml.head.writes``), so a slow Redis delays the record,
never a heartbeat or a placement. Timeline events go through a BatchedWriter that
flushes every EVENT_FLUSH_INTERVAL s, so a burst of them is one pipelined call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from rtml.config import HEARTBEAT_INTERVAL, HeadConfig
from rtml.control_plane import BatchedWriter, ControlPlane, RedisAddress, tls_from_text
from rtml.head import actors as ad
from rtml.head import placement_groups as pgs
from rtml.head.job_runner import JobRunner
from rtml.head.metrics import HeadMetrics
from rtml.head.writes import PlaneWrites
from rtml.ids import NO_NODE, JobID, NodeID
from rtml.rpc import messages as m
from rtml.rpc.server import Peer, Service
from rtml.scheduler import placement as pl
from rtml.scheduler.bundles import group_of
from rtml.scheduler.resources import bad_amount, fits
from rtml.scheduler.strategy import SPREAD, parse_affinity

log = logging.getLogger(__name__)

EVENT_FLUSH_INTERVAL = 0.1
CLOSE_TIMEOUT = 4.0
"""Seconds the queued writes get at shutdown (the launcher kills the head after 5)."""
DRIVER_EXITED = "the driver exited"


@dataclass
class NodeState:
    view: pl.NodeView
    peer: Peer
    session_dir: str
    transfer_address: str = ""
    tls_cert: bytes = b""

    @property
    def alive(self) -> bool:
        return self.view.alive

    def entry(self) -> m.NodeEntry:
        view = self.view
        return m.NodeEntry(view.node_id, view.address, self.transfer_address, view.alive,
                           self.tls_cert)


class HeadService(Service):
    def __init__(self, cfg: HeadConfig) -> None:
        self.cfg = cfg
        self.token = cfg.token
        self.redis = RedisAddress(cfg.redis_host, cfg.redis_port, cfg.redis_user,
                                  cfg.redis_password, tls_from_text(cfg.redis_tls))
        self.plane = ControlPlane.at(self.redis, cfg.token)
        self.events = BatchedWriter(self.plane, interval=EVENT_FLUSH_INTERVAL)
        self.writes = PlaneWrites()
        self.metrics = HeadMetrics()
        self.nodes: dict[NodeID, NodeState] = {}
        self.sched = pl.GlobalScheduler()
        self.actors = ad.ActorDirectory(self._actor_node, self._node_alive)
        self.groups = pgs.PlacementGroups()
        self.jobs: dict[JobID, Peer] = {}
        self.submissions = JobRunner(cfg.session_dir, cfg.token, self.plane, self.writes)
        self.namespaces: dict[JobID, str] = {}  # every job's, also once it ended
        self.lifetimes: dict[JobID, str] = {}  # each job's default actor lifetime
        self.output_fences: dict[int, tuple[Peer, int, set[NodeID]]] = {}  # see _flush_output
        self._fence_ids = 0
        self.stopped = asyncio.Event()
        # After a restart, until recovery_deadline: what the predecessor knew, not back yet.
        self.expected_nodes: set[NodeID] = set()
        self.expected_jobs: set[JobID] = set()
        self.recovery_deadline: float | None = None
        self.recorded_nodes: dict[NodeID, m.NodeInfo] = {}  # as the predecessor knew them
        self._last_check = time.monotonic()  # of liveness (see check_liveness)

    def recover(self) -> None:
        """Rebuild what a predecessor recorded (nothing, on a new cluster). Blocking: runs
        before the head serves anyone."""
        nodes = self.plane.list_nodes()
        for node in nodes:
            node_id = NodeID(bytes.fromhex(node["NodeID"]))
            self.recorded_nodes[node_id] = m.NodeInfo(
                node_id, node["Alive"], node["NodeManagerAddress"], node["Resources"],
                node["Available"], node.get("session_dir", ""))
            if node["Alive"]:
                self.expected_nodes.add(node_id)
        for job in self.plane.list_jobs():
            job_id = JobID(bytes.fromhex(job["JobID"]))
            self.namespaces[job_id] = job.get("namespace", "")
            self.lifetimes[job_id] = job.get("default_lifetime", "")
            if not job["IsDead"]:
                self.expected_jobs.add(job_id)
        self.submissions.recover()  # (not waited for: its jobs ended with that head)
        for group in self.plane.placement_group_records():
            if "spec" in group:
                self.groups.restore(msgspec.msgpack.decode(group["spec"],
                                                           type=m.CreatePlacementGroup),
                                    pgs.GroupState(group["state"]),
                                    [NodeID(bytes.fromhex(n)) for n in group.get("nodes", [])])
        records = self.plane.actor_records()
        for record in records:
            if "spec" in record:
                self.actors.restore(msgspec.msgpack.decode(record["spec"], type=m.ActorSpec),
                                    ad.ActorState(record["state"]),
                                    NodeID(bytes.fromhex(record["node_id"])), record["address"],
                                    record.get("tcp_address", ""), record["restarts"],
                                    record["error"])
        if nodes or records or self.expected_jobs:
            self.recovery_deadline = time.monotonic() + self.cfg.node_timeout
            self.actors.recovering = bool(self.expected_nodes)
            log.warning("taking over from an earlier head: %d nodes, %d jobs and %d actors "
                        "recorded; waiting up to %g s for them to reconnect",
                        len(self.expected_nodes), len(self.expected_jobs), len(records),
                        self.cfg.node_timeout)

    def on_hello(self, peer: Peer, hello: m.Hello) -> m.HelloReply:
        if hello.role == "driver" and hello.job_id in self.expected_jobs:  # came back
            self.expected_jobs.discard(hello.job_id)
            self.jobs[hello.job_id] = peer
        return m.HelloReply(ok=True, info=self.redis.info())

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
                self._job_ended(job_id, "its driver exited")
        self._carry_out(self.actors.owner_gone(peer))
        self.submissions.peer_gone(peer)

    def _job_ended(self, job_id: JobID, why: str) -> None:
        self.writes.write(self.plane.finish_job, job_id)
        self._event("JobFinished", job_id=job_id)
        self._carry_out(self.actors.job_ended(job_id, why))
        self._carry_groups(self.groups.job_ended(job_id))
        self.writes.aside(fail_pending_tasks, self.plane, job_id)

    def close(self) -> None:
        """Give the queued writes up to CLOSE_TIMEOUT s, then close the control plane
        (in a thread: it blocks). If Redis hangs, the rest is left to the process's exit:
        flushing the events or closing the client would wait for the stuck write."""
        if self.writes.close(CLOSE_TIMEOUT):
            self.events.close()
            self.plane.close()

    def _event(self, kind: str, **fields: Any) -> None:
        """Queue a timeline event; the writer's thread appends it within ~0.1 s."""
        self.events.submit_event({"kind": kind, "ts": time.time(), **fields})

    # -- nodes and jobs ----------------------------------------------------------------------

    def _register_node(self, peer: Peer, msg: m.RegisterNode) -> None:
        if msg.rejoin and msg.node_id in self.nodes:  # declared dead while it was away
            peer.send(m.Shutdown())
            return
        bad = bad_amount(msg.resources)
        if bad:
            log.warning("refusing node %s at %s: %s", msg.node_id.hex(), msg.address, bad)
            peer.send(m.Shutdown())
            return
        view = pl.NodeView(msg.node_id, msg.address, msg.resources, dict(msg.resources),
                           last_heartbeat=time.monotonic())
        self.nodes[msg.node_id] = NodeState(view, peer, msg.session_dir, msg.transfer_address,
                                            msg.tls_cert)
        # Told at once, not once recorded: a node must be able to join while Redis is slow.
        self.writes.write(self.plane.put_node, msg.node_id, {
            "address": msg.address, "resources": msg.resources,
            "session_dir": msg.session_dir, "alive": True, "start_ts": time.time(),
            "metrics_address": msg.metrics_address})
        self._event("NodeRegistered", node_id=msg.node_id, address=msg.address,
                    resources=msg.resources)
        self._broadcast_nodes()
        self._decided(self.sched.node_added(view))
        if msg.rejoin:
            self._carry_out(self.actors.node_back(msg.node_id, msg.actors))
            self._carry_groups(self.groups.node_back(msg.node_id, msg.groups))
            self._node_back(msg.node_id)
        self._carry_out(self.actors.place_pending())

    def _node_back(self, node_id: NodeID) -> None:
        if node_id in self.expected_nodes:
            self.expected_nodes.discard(node_id)
            if not self.expected_nodes:
                self._carry_out(self.actors.nodes_back())

    def _end_recovery(self) -> None:
        """The reconnection window closed: what the predecessor knew and is not back is
        dead."""
        self.recovery_deadline = None
        reason = f"it did not rejoin within {self.cfg.node_timeout:g} s of a head restart"
        for node_id in self.expected_nodes:
            self._declare_dead(node_id, reason)
        self.expected_nodes.clear()
        if self.actors.recovering:
            self._carry_out(self.actors.nodes_back())
        for job_id in self.expected_jobs:
            self._job_ended(job_id, "its driver did not reconnect after a head restart")
        self.expected_jobs.clear()
        self._carry_out(self.actors.owners_gone())

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
        bad = bad_amount(msg.available)
        if bad:
            log.warning("ignoring a heartbeat of node %s: %s", msg.node_id.hex(), bad)
            return
        self.metrics.heartbeat(msg)
        self._decided(self.sched.heartbeat(msg.node_id, msg.available, time.monotonic(),
                                           msg.total))
        self.writes.latest(("heartbeat", msg.node_id), self.plane.heartbeat, msg.node_id,
                           msg.available, msg.pending_shapes)
        if self.actors.pending:
            self._carry_out(self.actors.place_pending())
        self._carry_groups(self.groups.place_pending(self._room()))

    def check_liveness(self) -> None:
        """Declare dead every node silent for longer than the node timeout (and, after a
        restart, what did not come back in time)."""
        now = time.monotonic()
        if now - self._last_check > max(self.cfg.node_timeout / 2, 4 * HEARTBEAT_INTERVAL):
            # We did not run meanwhile (SIGSTOP, a starved machine): the heartbeats wait
            # unread in our sockets, so silence says nothing about the nodes.
            log.warning("the head service did not run for %.1f s; every node gets a fresh "
                        "%g s to be heard", now - self._last_check, self.cfg.node_timeout)
            self.sched.excuse(now)
            if self.recovery_deadline is not None:
                self.recovery_deadline += now - self._last_check
        self._last_check = now
        if self.recovery_deadline is not None and now >= self.recovery_deadline:
            self._end_recovery()
        for node_id in self.sched.expired(now, self.cfg.node_timeout):
            self._node_died(node_id, f"it sent no heartbeat for {self.cfg.node_timeout:g} s")

    def _node_died(self, node_id: NodeID, reason: str) -> None:
        """A node registered with us is dead."""
        self.sched.node_died(node_id)
        self.nodes[node_id].peer.send(m.Shutdown())  # back, it must not serve stale state
        self._declare_dead(node_id, reason)
        self._broadcast_nodes()
        for fence in list(self.output_fences):  # it will not answer
            self._output_flushed_by(fence, node_id)

    def _declare_dead(self, node_id: NodeID, reason: str) -> None:
        """Record a node's death and tell everyone: its actors restart or die."""
        self.writes.write(self.plane.mark_node_dead, node_id)
        self._event("NodeDied", node_id=node_id, reason=reason)
        log.warning("node %s is dead: %s", node_id.hex(), reason)
        notice = m.NodeDied(node_id, reason)  # node managers tell their drivers and workers
        for other in self.nodes.values():
            if other.alive:
                other.peer.send(notice)
        self._carry_out(self.actors.node_died(node_id, reason))
        self._carry_groups(self.groups.node_died(node_id, self._room()))

    # -- spilled lease requests (the global scheduler) ---------------------------------------

    def _spill_lease(self, peer: Peer, msg: m.SpillLease) -> None:
        origin = self._node_of(peer)
        if origin is None:
            return
        bad = bad_amount(msg.shape)
        group = group_of(msg.shape)
        if group and self.groups.removed(group):
            bad = f"its placement group {group} was removed"
        if bad:
            peer.send(m.LeasePlaced(msg.req_id, NO_NODE, "", error=f"lease refused: {bad}"))
            return
        request = pl.Request(origin, msg.req_id, msg.shape, msg.strategy, msg.preferred_node,
                             msg.must_move)
        decision = self.sched.place(request)
        if isinstance(decision, pl.Pending):
            if not self.expected_nodes and not group:  # (a group's: until it is created;
                # else a node that rejoins soon may well fit it)
                peer.send(m.LeasePlaced(msg.req_id, NO_NODE, "", infeasible=True))
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
                self.metrics.spills_placed += 1
                origin.peer.send(m.LeasePlaced(req_id, decision.node_id, decision.address))
            elif isinstance(decision, pl.Failed):
                origin.peer.send(m.LeasePlaced(req_id, NO_NODE, "", error=decision.error))

    def _node_of(self, peer: Peer) -> NodeID | None:
        for node_id, node in self.nodes.items():
            if node.peer is peer and node.alive:
                return node_id
        return None

    def _register_job(self, peer: Peer, msg: m.RegisterJob) -> None:
        self.jobs[msg.job_id] = peer
        self.namespaces[msg.job_id] = msg.namespace
        self.lifetimes[msg.job_id] = msg.default_lifetime
        self.writes.write(self.plane.put_job, msg.job_id, {
            "pid": msg.pid, "namespace": msg.namespace, "cwd": msg.cwd,
            "default_lifetime": msg.default_lifetime, "metadata": msg.metadata,
            "start_ts": time.time(), "status": "RUNNING"})
        self._event("JobStarted", job_id=msg.job_id, pid=msg.pid, namespace=msg.namespace)

    def _flush_output(self, peer: Peer, msg: m.FlushOutput) -> None:
        """A driver about to leave: answered once every node manager has answered a
        flush of its own, so the prints its workers sent before are forwarded ahead."""
        self._fence_ids += 1
        waiting = {node_id for node_id, node in self.nodes.items() if node.alive}
        self.output_fences[self._fence_ids] = (peer, msg.req_id, waiting)
        for node_id in waiting:
            self.nodes[node_id].peer.send(m.FlushOutput(self._fence_ids))
        self._output_flushed_by(self._fence_ids, NO_NODE)

    def _output_flushed(self, peer: Peer, msg: m.OutputFlushed) -> None:
        self._output_flushed_by(msg.req_id, msg.node_id)

    def _output_flushed_by(self, fence: int, node_id: NodeID) -> None:
        entry = self.output_fences.get(fence)
        if entry is None:
            return
        driver, req_id, waiting = entry
        waiting.discard(node_id)
        if not waiting:
            del self.output_fences[fence]
            driver.send(m.OutputFlushed(req_id))

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
        """Every node: those registered with us, and those only our predecessor knew
        (alive while they may still rejoin)."""
        nodes = [m.NodeInfo(n.view.node_id, n.alive, n.view.address, n.view.total,
                            n.view.available, n.session_dir) for n in self.nodes.values()]
        for node_id, info in self.recorded_nodes.items():
            if node_id not in self.nodes:
                info.alive = node_id in self.expected_nodes
                nodes.append(info)
        peer.send(m.ClusterInfo(msg.req_id, nodes))

    # -- actors ------------------------------------------------------------------------------

    def _create_actor(self, peer: Peer, msg: m.CreateActor) -> None:
        bad = bad_amount(msg.spec.shape)
        if bad:  # answered as dead (unasked too, as a creator waits for that)
            peer.send(m.ActorInfo(msg.req_id, msg.spec.actor_id, "DEAD",
                                  error=f"actor refused: {bad}"))
            return
        if not msg.spec.namespace:  # created by a task or an actor: in its job's namespace
            msg.spec.namespace = self.namespaces.get(msg.spec.job_id, "")
        self._carry_out(self.actors.create(peer, msg.req_id, msg.spec, msg.get_if_exists))
        group = group_of(msg.spec.shape)
        if group and self.groups.removed(group):  # it would wait for them for ever
            self._carry_out(self.actors.kill(msg.spec.actor_id, True,
                                             f"its placement group {group} was removed"))

    def _actor_node(self, spec: m.ActorSpec) -> NodeID | None:
        affinity = parse_affinity(spec.strategy)
        if affinity is not None:
            node = self.nodes.get(affinity[0])
            if node is not None and node.alive and fits(spec.shape, node.view.total):
                return node.view.node_id
            if not affinity[1]:
                return None
        view = self.sched.pick_for_actor(spec.shape, spread=spec.strategy == SPREAD)
        return None if view is None else view.node_id

    def _node_alive(self, node_id: NodeID) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.alive

    def _actor_started(self, peer: Peer, msg: m.ActorStarted) -> None:
        self._carry_out(self.actors.started(msg.actor_id, msg.node_id, msg.address,
                                            msg.tcp_address, msg.error, msg.pid))

    def _actor_died(self, peer: Peer, msg: m.ActorWorkerDied) -> None:
        self._carry_out(self.actors.worker_died(msg.actor_id, msg.reason))

    def _kill_actor(self, peer: Peer, msg: m.KillActor) -> None:
        self._carry_out(self.actors.kill(msg.actor_id, msg.no_restart, msg.reason))

    def _get_actor(self, peer: Peer, msg: m.GetActorInfo) -> None:
        if msg.name and not msg.namespace:  # asked from a task or an actor: its job's
            msg.namespace = self.namespaces.get(msg.job_id, "")
        self._carry_out(self.actors.lookup(peer, msg))

    # -- placement groups ----------------------------------------------------------------------

    def _create_group(self, peer: Peer, msg: m.CreatePlacementGroup) -> None:
        if not msg.namespace:
            msg.namespace = self.namespaces.get(msg.job_id, "")
        self._carry_groups(self.groups.create(msg, self._room()))

    def _remove_group(self, peer: Peer, msg: m.RemovePlacementGroup) -> None:
        self._carry_groups(self.groups.remove(msg.pg_id))

    def _get_group(self, peer: Peer, msg: m.GetPlacementGroup) -> None:
        namespace = msg.namespace or self.namespaces.get(msg.job_id, "")
        peer.send(self.groups.lookup(msg.req_id, msg.pg_id, msg.name, namespace))

    def _bundles_prepared(self, peer: Peer, msg: m.BundlesPrepared) -> None:
        self._carry_groups(self.groups.prepared(msg.pg_id, msg.node_id, msg.ok, msg.round))

    def _room(self) -> dict[NodeID, dict[str, float]]:
        """Each live node's available resources, as the global scheduler sees them."""
        return {n.node_id: n.available for n in self.sched.alive()}

    def _carry_groups(self, commands: list[pgs.Command]) -> None:
        for command in commands:
            if isinstance(command, pgs.Send):
                node = self.nodes.get(command.node_id)
                if node is not None and node.alive:
                    node.peer.send(command.msg)
            elif isinstance(command, pgs.Save):
                self._save_group(command.group)
            else:
                self._carry_out(self.actors.group_removed(command.pg_hex))
                suffix = f"_{command.pg_hex}"
                gone = [r for r in self.sched.pending
                        if any(name.endswith(suffix) for name in r.shape)]
                self.sched.pending = [r for r in self.sched.pending if r not in gone]
                self._decided([pl.Failed(r, f"lease refused: its placement group "
                                            f"{command.pg_hex} was removed") for r in gone])

    def _save_group(self, group: pgs.Group) -> None:
        pg_id = group.spec.pg_id
        if group.state is pgs.GroupState.REMOVED:
            self.writes.write(self.plane.delete_placement_group, pg_id)
            return
        self.writes.write(self.plane.put_placement_group, pg_id, {
            "spec": msgspec.msgpack.encode(group.spec), "state": group.state.value,
            "nodes": [n.hex() for n in group.nodes]})

    def _actor_exiting(self, peer: Peer, msg: m.ActorExiting) -> None:
        self._carry_out(self.actors.exiting(peer, msg.req_id, msg.actor_id))

    def _job_config(self, peer: Peer, msg: m.GetJobConfig) -> None:
        peer.send(m.JobConfigInfo(msg.req_id, self.lifetimes.get(msg.job_id, "")))

    def _named_actors(self, peer: Peer, msg: m.ListNamedActors) -> None:
        namespace = msg.namespace or self.namespaces.get(msg.job_id, "")
        names = self.actors.names(None if msg.all_namespaces else namespace)
        peer.send(m.NamedActors(msg.req_id, names))

    def _carry_out(self, commands: list[ad.Command]) -> None:
        for command in commands:
            if isinstance(command, ad.Answer):
                command.peer.send(command.info)
            elif isinstance(command, ad.Record):
                self._record(command)
            elif isinstance(command, (ad.StartActor, ad.KillWorker)):
                node = self.nodes.get(command.node_id)
                if node is not None and node.alive:
                    node.peer.send(m.StartActor(command.spec, command.restarts) if isinstance(
                        command, ad.StartActor) else m.KillActorWorker(command.actor_id))
            elif isinstance(command, ad.ClaimName):
                self.writes.write(self.plane.set_named_actor, command.namespace,
                                  command.name, command.actor_id)
            else:
                self.writes.write(self.plane.delete_named_actor, command.namespace,
                                  command.name, command.actor_id)

    def _record(self, record: ad.Record) -> None:
        spec, state = record.spec, record.state.value
        reason = record.error if record.state is ad.ActorState.DEAD else ""
        if record.state is ad.ActorState.RESTARTING:
            reason = f"restart {record.restarts} of {spec.max_restarts}"
        self._event("ActorStateChanged", actor_id=spec.actor_id, job_id=spec.job_id,
                    class_name=spec.class_name, name=spec.name, state=state,
                    node_id=record.node_id, reason=reason)
        self.writes.write(self.plane.put_actor, spec.actor_id, {
            "actor_id": spec.actor_id.hex(), "class_name": spec.class_name,
            "state": state, "name": spec.name, "namespace": spec.namespace,
            "job_id": spec.job_id.hex(), "node_id": record.node_id.hex(),
            "address": record.address, "restarts": record.restarts, "error": record.error,
            "detached": spec.detached, "max_restarts": spec.max_restarts,
            "tcp_address": record.tcp_address, "pid": record.pid,
            "spec": msgspec.msgpack.encode(spec)})

    def _job_request(self, peer: Peer, msg: Any) -> None:
        """Job submission (``rtml job``): the runner answers (rtml.head.job_runner)."""
        self.submissions.on_message(peer, msg)

    _handlers: dict[type, Any] = {
        m.RegisterNode: _register_node, m.NodeHeartbeat: _heartbeat,
        m.RegisterJob: _register_job, m.GetClusterInfo: _cluster_info,
        m.CreateActor: _create_actor, m.ActorStarted: _actor_started,
        m.ActorWorkerDied: _actor_died, m.KillActor: _kill_actor,
        m.GetActorInfo: _get_actor, m.NodeTransferReady: _transfer_ready,
        m.SpillLease: _spill_lease, m.WorkerOutput: _output,
        m.CancelLeaseRequest: _spill_withdrawn, m.FlushOutput: _flush_output,
        m.OutputFlushed: _output_flushed, m.ListNamedActors: _named_actors,
        m.SubmitJob: _job_request, m.StopJob: _job_request, m.DeleteJob: _job_request,
        m.ListJobs: _job_request, m.GetJobLogs: _job_request,
        m.ActorExiting: _actor_exiting, m.CreatePlacementGroup: _create_group,
        m.RemovePlacementGroup: _remove_group, m.GetPlacementGroup: _get_group,
        m.BundlesPrepared: _bundles_prepared, m.GetJobConfig: _job_config,
    }


def fail_pending_tasks(plane: ControlPlane, job_id: JobID) -> None:
    """Record the job's tasks still PENDING as FAILED: their driver (owner) has exited.

    Runs once per job end, off the event loop.
    """
    pending = plane.list_tasks({"job_id": job_id.hex(), "status": "PENDING"})
    now = time.time()
    plane.write_task_records([
        {"task_id": bytes.fromhex(task["task_id"]), "status": "FAILED",
         "error": DRIVER_EXITED, "end_ts": now} for task in pending])
