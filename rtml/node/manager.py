"""The node manager's I/O shell: local scheduler, worker pool and object manager of one node.

    local clients --unix socket--> NodeManager.on_message     other nodes' owners --TCP--^
        RequestLease --> LeaseRouter (rtml.node.leases): queue here and/or spill
                     --fits here--> LocalScheduler -> Grant -> LeaseGranted(worker address)
                     --no room here, or needs another node--> SpillLease --> head
                       <--LeasePlaced-- (the global scheduler's pick)
                     --> LeaseSpillback(node, address): the owner asks that node instead
        Seal/Holds/WaitObject -> ObjectManager (store, remote holds, pulls over gRPC)
        WorkerBlocked -> CPU lent back while a task waits in get()
    head service <--TCP-- RegisterNode, NodeHeartbeat (resources, pending demand),
                          StartActor -> dedicated worker -> ActorStarted
                 --> NodeTable (addresses of the other nodes), NodeDied (forwarded to clients)
                 gone (not a Shutdown): workers and actors keep running; reconnect for up
                 to head_timeout s (rtml.node.head_link), RegisterNode(rejoin) with the
                 actors hosted here, spilled requests sent again
    worker exit (pidfd) -> lease freed, holds dropped, pool refilled, head told
    ListLogs / ReadLog (any token holder) -> this node's log files (rtml.logs)
    --metrics-port: /metrics on this loop (rtml.metrics; counters in rtml.node.metrics),
                    CountTasks to each worker every heartbeat; leases and pulls timed,
                    written as timeline events with the heartbeat's writes

The process's entry is :mod:`rtml.node.main`, which starts the worker zygote first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtml import objectstore
from rtml.config import HEARTBEAT_INTERVAL, STORE_RESOURCE, NodeConfig, WorkerConfig
from rtml.control_plane import ControlPlane, RedisAddress
from rtml.daemon import (
    ReadyPipe,
    die_with_launcher,
    pid_alive,
    run_daemon,
    run_until_stopped,
    setup_logging,
)
from rtml.exceptions import RtmlSystemError
from rtml.ids import (
    NO_ACTOR,
    NO_NODE,
    UNKNOWN_JOB,
    ActorID,
    ClientID,
    JobID,
    NodeID,
    PlacementGroupID,
    WorkerID,
    new_node_id,
    new_worker_id,
)
from rtml.logs import list_files, read
from rtml.metrics import MetricsServer
from rtml.node.head_link import HeadLink
from rtml.node.leases import LeaseRouter, Reply, ToHead
from rtml.node.links import NodeLinks
from rtml.node.metrics import NodeMetrics, NodeParts
from rtml.node.objects import ObjectManager
from rtml.node.workers import WorkerLauncher, WorkerProc
from rtml.rpc import messages as m
from rtml.rpc.client import make_hello
from rtml.rpc.server import Peer, Service, protocol_factory
from rtml.rpc.tls import listener_tls
from rtml.scheduler.local import (
    Grant,
    LocalScheduler,
    Refused,
    StartActor,
    StartWorker,
    StopActor,
    StopWorker,
)
from rtml.session import Session

log = logging.getLogger(__name__)

REGISTER_TIMEOUT = 30.0
HEAD_CONNECT_TIMEOUT = 3.0
"""Seconds a starting node manager keeps trying to reach the head."""
IDLE_WORKER_TICKS = 10
"""Heartbeat ticks (0.5 s each) a worker beyond the pool size may idle before it is stopped."""
EXITED_KEPT = 10_000
"""Exited workers whose pid and actor are remembered (to find their log files), the latest."""


@dataclass
class Client:
    client_id: ClientID
    role: str
    job_id: JobID = UNKNOWN_JOB
    node_id: NodeID = NO_NODE  # another node's id for owners leasing here over TCP
    worker: WorkerProc | None = None
    waiters: set[int] = field(default_factory=set)


class NodeManager(Service):
    def __init__(self, cfg: NodeConfig, zygote: subprocess.Popen[bytes]) -> None:
        self.cfg = cfg
        self.token = cfg.token
        self.session = Session(Path(cfg.session_dir))
        # The id starts with our pid, so the name of our store directory (the id in hex)
        # tells a later node manager whether its owner is still alive.
        self.node_id = new_node_id()
        self.store_dir = objectstore.store_dir_of(self.node_id.hex())
        self.sched = LocalScheduler(cfg.total_resources(), self._pool_size())
        self.workers: dict[ClientID, WorkerProc] = {}  # by worker id (a worker is a client)
        self.actor_specs: dict[ActorID, m.ActorSpec] = {}
        self.actor_restarts: dict[ActorID, int] = {}  # of the actors restarted, until placed
        self._total_sent = 0  # the scheduler's total_changes the head was last sent
        self.actor_gpus: dict[ActorID, tuple[int, ...]] = {}
        self.unix_path = str(self.session.sockets / "nm.sock")
        self.stopped = asyncio.Event()
        self.registered = asyncio.Event()  # the head answered our registration
        self.transfer_started = False
        self.transfer_address = ""
        self.plane: ControlPlane | None = None
        self.clients: set[Peer] = set()
        self.other_nodes: set[NodeID] = set()
        self.leases = LeaseRouter(self.node_id, self.sched, _worker_of)
        self.metrics = NodeMetrics(enabled=cfg.metrics_port >= 0)
        self.metrics_server: MetricsServer | None = None
        self.exited: dict[str, tuple[int, ActorID]] = {}  # worker id (12 hex) -> pid, actor
        # To the head and other node managers it is a client named by its node id.
        self.client_id = ClientID(self.node_id)
        self.links = NodeLinks(self.token, make_hello("node", self.client_id), self._link_answer)
        self.tls = listener_tls(cfg.tls_cert, cfg.tls_key)
        self.objects = ObjectManager(self.node_id, self.store_dir, str(self.session.spill),
                                     cfg.object_store_memory, self.token, self.links,
                                     self._end_actor, self.metrics, cfg.tls_cert, cfg.tls_key)
        self.launcher = WorkerLauncher(zygote, self._worker_gone)
        self.head = HeadLink(cfg.head_address, self.token, make_hello("node", self.client_id))

    def _link_answer(self, msg: m.Msg) -> None:
        if isinstance(msg, m.ObjectLocated):
            self.objects.located(msg)
        else:
            log.warning("unexpected %s on a node link", type(msg).__name__)

    def _end_actor(self, actor_id: ActorID) -> None:
        """The actor's life object was freed here: no handle to it is left anywhere."""
        self.head.send(m.KillActor(actor_id, no_restart=True, reason=m.OUT_OF_SCOPE))

    def _pool_size(self) -> int:
        if self.cfg.prestart_workers >= 0:
            return self.cfg.prestart_workers
        return max(1, int(self.cfg.num_cpus))

    # -- startup -----------------------------------------------------------------------------

    async def start(self) -> None:
        sweep_orphaned_stores()
        objectstore.create_store_dir(self.node_id.hex())
        await self.launcher.start()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(protocol_factory(self), self.unix_path)
        os.chmod(self.unix_path, 0o600)
        self.tcp_server = await loop.create_server(protocol_factory(self, self.tls),
                                                   self.cfg.node_ip, self.cfg.port)
        self.address = f"{self.cfg.node_ip}:{self.tcp_server.sockets[0].getsockname()[1]}"
        if self.metrics.enabled:
            parts = NodeParts(self.sched, self.leases, self.workers, self.objects.store,
                              self.objects.pulls)
            self.metrics_server = MetricsServer(self.metrics.serve(parts),
                                                self.cfg.metrics_host or "127.0.0.1",
                                                self.cfg.metrics_port, self.token)
            await self.metrics_server.start()
        reply = await self.head.connect(HEAD_CONNECT_TIMEOUT)
        self.plane = ControlPlane.at(RedisAddress.from_info(reply.info), self.token)
        self.head.send(self._registration(rejoin=False))
        self._run(self.sched.ensure_pool(0))

    def _registration(self, rejoin: bool) -> m.RegisterNode:
        msg = m.RegisterNode(self.node_id, self.address, self.unix_path, self.sched.total,
                             str(self.session.root), self.transfer_address,
                             self.tls.cert_pem if self.tls is not None else b"", rejoin=rejoin,
                             metrics_address=self._metrics_address())
        if rejoin:
            msg.groups = [PlacementGroupID(bytes.fromhex(pg)) for pg in self.sched.bundles]
            ready = {w.actor_id: w for w in self.workers.values() if w.actor_ready}
            for actor_id, spec in self.actor_specs.items():
                worker = ready.get(actor_id)
                msg.actors.append(m.HostedActor(spec, worker.address, worker.tcp_address)
                                  if worker is not None else m.HostedActor(spec))
        return msg

    async def ready_when_registered(self, ready: ReadyPipe) -> None:
        """Report ready once the head answered our registration, so that ``rtml.nodes()``
        lists this node by then. Raises RtmlSystemError if it does not answer."""
        try:
            await asyncio.wait_for(self.registered.wait(), REGISTER_TIMEOUT)
        except TimeoutError:
            raise RtmlSystemError(f"the head at {self.cfg.head_address} did not answer this "
                                  f"node's registration within {REGISTER_TIMEOUT:g} s") from None
        ready.report(f"ok {self.node_id.hex()} unix:{self.unix_path} "
                     f"{self._metrics_address() or '-'}")

    def _metrics_address(self) -> str:
        return self.metrics_server.address if self.metrics_server is not None else ""

    def _transfer_ready(self, address: str) -> None:
        self.transfer_address = address
        self.head.send(m.NodeTransferReady(self.node_id, address))

    async def heartbeat_loop(self) -> None:
        while True:
            for worker_id in self.sched.reap_idle(IDLE_WORKER_TICKS):
                self.workers[worker_id].kill()
            self._heartbeat()
            await self.objects.flush(self.plane)
            await self._write_events()
            await self.objects.locate_unknown(self.plane)
            await asyncio.sleep(HEARTBEAT_INTERVAL)

    async def _write_events(self) -> None:
        """This tick's timeline events (leases, pulls): one call, in a thread; lost if
        Redis is away (the timeline is a view, not a record anything depends on)."""
        events = self.metrics.drain_events()
        if events and self.plane is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, self.plane.append_events, events)
            except RtmlSystemError as exc:
                log.warning("dropped %d timeline events: %s", len(events), exc)

    def _heartbeat(self) -> None:
        """Tell the head what is free here (and the total, when bundles changed it)."""
        changes = self.sched.total_changes  # (placement group bundles)
        total = dict(self.sched.total) if changes != self._total_sent else None
        self._total_sent = changes
        tasks = None
        if self.metrics.enabled:  # (the answers come before the next heartbeat)
            tasks = self.metrics.tasks()
            for worker in self.workers.values():
                if worker.peer is not None and worker.address:
                    worker.peer.send(m.CountTasks())
        self.metrics.heartbeats_sent += 1
        self.head.send(m.NodeHeartbeat(self.node_id, self._available(),
                                       self.leases.waiting_shapes(), total, tasks))

    def _available(self) -> dict[str, float]:
        """What is free here: the scheduler's resources, the store's free bytes (as Ray,
        objects in shared memory use up ``object_store_memory``)."""
        available = dict(self.sched.available)
        available[STORE_RESOURCE] = float(self.objects.store.free_bytes)
        return available

    async def head_loop(self) -> None:
        """The head's messages; when the head goes away, wait for it to be back (its
        supervisor restarts it) and rejoin. Raises RtmlSystemError if it is not back
        within head_timeout s (the node manager then stops)."""
        while True:
            try:
                while True:
                    self._on_head_message(await self.head.receive())
            except (ConnectionError, OSError) as exc:
                log.warning("lost the head service (%s); workers and actors keep running, "
                            "reconnecting for up to %g s", exc, self.cfg.head_timeout)
            await self.head.connect(self.cfg.head_timeout)
            self.head.rejoin([self._registration(rejoin=True), *self.leases.respill()])
            log.info("rejoined the head service at %s", self.cfg.head_address)

    def _on_head_message(self, msg: Any) -> None:
        if isinstance(msg, m.StartActor):
            self.actor_specs[msg.spec.actor_id] = msg.spec
            if msg.restarts:
                self.actor_restarts[msg.spec.actor_id] = msg.restarts
            self._run(self.sched.place_actor(msg.spec.actor_id, msg.spec.shape,
                                             msg.spec.hold_shape))
        elif isinstance(msg, m.KillActorWorker):
            self._kill_actor(msg.actor_id)
        elif isinstance(msg, m.PrepareBundles):
            ok = self.sched.prepare_bundles(msg.pg_id.hex(), list(msg.bundles))
            self.head.send(m.BundlesPrepared(msg.pg_id, self.node_id, ok, msg.round))
        elif isinstance(msg, m.CommitBundles):
            self._run(self.sched.commit_bundles(msg.pg_id.hex()))
            self._heartbeat()  # at once: the group's tasks may wait at the head for it
        elif isinstance(msg, m.ReleaseBundles):
            self._run(self.sched.release_bundles(msg.pg_id.hex()))
            self._heartbeat()
        elif isinstance(msg, m.LeasePlaced):
            self._run(self.leases.placed(msg))
        elif isinstance(msg, m.NodeTable):
            self.other_nodes = {n.node_id for n in msg.nodes
                                if n.alive and n.node_id != self.node_id}
            if self.other_nodes and not self.transfer_started:
                # Objects only move once there is another node: a single-node cluster
                # never pays for importing gRPC (~0.1 s of CPU at startup).
                self.transfer_started = True
                self.objects.start_transfer_server(self.cfg.node_ip, self._transfer_ready)
            self.objects.node_table(msg.nodes)
            self.registered.set()
        elif isinstance(msg, m.NodeDied):
            self.other_nodes.discard(msg.node_id)
            kept = self.objects.node_died(msg.node_id, msg.reason)
            notice = m.NodeDied(msg.node_id, msg.reason, kept)
            for peer in self.clients:
                peer.send(notice)
        elif isinstance(msg, m.FlushOutput):  # after every print forwarded before it
            self.head.send(m.OutputFlushed(msg.req_id, self.node_id))
        elif isinstance(msg, m.Shutdown):
            self.stopped.set()

    # -- connections -------------------------------------------------------------------------

    def on_hello(self, peer: Peer, hello: m.Hello) -> m.HelloReply:
        remote = hello.node_id not in (NO_NODE, self.node_id)
        client = Client(hello.client_id, hello.role, hello.job_id,
                        hello.node_id if remote else NO_NODE)
        if hello.role in ("driver", "worker"):
            self.clients.add(peer)
            if not remote:
                self.objects.client_joined(hello.client_id)
        worker = self.workers.get(hello.client_id) if hello.role == "worker" else None
        if worker is not None:
            worker.peer = peer
            client.worker = worker
        peer.context = client
        return m.HelloReply(ok=True, node_id=self.node_id,
                            info={"store_dir": self.store_dir, "node_ip": self.cfg.node_ip})

    def on_message(self, peer: Peer, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("unexpected %s from a client", type(msg).__name__)
            return
        handler(self, peer, peer.context, msg)
        self.objects.schedule_collect()

    def on_disconnect(self, peer: Peer) -> None:
        client: Client = peer.context
        self.clients.discard(peer)
        self.metrics.client_gone(peer)
        self._run(self.leases.client_gone(peer))
        self.objects.client_gone(client.client_id, client.waiters)
        if client.worker is not None:
            self._worker_gone(client.worker, "its connection closed")

    # -- leases ------------------------------------------------------------------------------

    def _request_lease(self, peer: Peer, client: Client, msg: m.RequestLease) -> None:
        self.metrics.lease_asked(peer, msg.req_id)
        self._run(self.leases.request(peer, msg, other_nodes=bool(self.other_nodes)))

    def _return_lease(self, peer: Peer, client: Client, msg: m.ReturnLease) -> None:
        self._run(self.sched.return_lease(msg.lease_id))

    def _cancel_lease_request(self, peer: Peer, client: Client,
                              msg: m.CancelLeaseRequest) -> None:
        self.metrics.lease_elsewhere(peer, msg.req_id)
        self._run(self.leases.cancel(peer, msg.req_id))

    # -- workers -----------------------------------------------------------------------------

    def _blocked(self, peer: Peer, client: Client, msg: Any) -> None:
        if client.worker is not None:
            blocked = isinstance(msg, m.WorkerBlocked)
            wid = client.worker.worker_id
            self._run(self.sched.worker_blocked(wid) if blocked
                      else self.sched.worker_unblocked(wid))

    def _listening(self, peer: Peer, client: Client, msg: m.WorkerListening) -> None:
        worker = client.worker
        if worker is None:
            return
        worker.address, worker.tcp_address = msg.address, msg.tcp_address
        if worker.actor_id:
            peer.send(m.BecomeActor(self.actor_specs[worker.actor_id],
                                    self.actor_gpus.get(worker.actor_id, ()),
                                    self.actor_restarts.pop(worker.actor_id, 0)))
        else:
            self._run(self.sched.worker_ready(worker.worker_id, worker.runtime_env))

    def _retiring(self, peer: Peer, client: Client, msg: m.WorkerRetiring) -> None:
        """A worker exits after this (max_calls): out of the pool now, so no lease goes
        to it meanwhile."""
        if client.worker is not None:
            self._worker_gone(client.worker, "it ran a function max_calls times")

    def _output(self, peer: Peer, client: Client, msg: m.WorkerOutput) -> None:
        self.head.send(msg)  # the head forwards it to the job's driver, on whatever node

    def _actor_ready(self, peer: Peer, client: Client, msg: m.ActorReady) -> None:
        worker = client.worker
        if worker is not None:
            worker.actor_ready = not msg.error
            self.head.send(m.ActorStarted(msg.actor_id, worker.worker_id, worker.address,
                                          msg.error, worker.tcp_address, self.node_id,
                                          worker.pid))

    def _cancel_task(self, peer: Peer, client: Client, msg: m.CancelTask) -> None:
        worker = self.workers.get(msg.worker_id)
        if worker is None or worker.gone:
            return
        if msg.force:
            worker.kill()
        elif worker.peer is not None:
            worker.peer.send(m.CancelRunning(msg.task_id, msg.recursive))

    # -- objects -----------------------------------------------------------------------------

    def _create(self, peer: Peer, client: Client, msg: m.CreateObject) -> None:
        self.objects.create(peer, client.client_id, msg)

    def _seal(self, peer: Peer, client: Client, msg: m.SealObject) -> None:
        self.objects.seal(msg)

    def _add_holds(self, peer: Peer, client: Client, msg: m.AddHolds) -> None:
        self.objects.add_holds(msg)

    def _release_holds(self, peer: Peer, client: Client, msg: m.ReleaseHolds) -> None:
        self.objects.release_holds(msg)

    def _release_holder(self, peer: Peer, client: Client, msg: m.ReleaseHolder) -> None:
        self.objects.release_holder(msg.holder, msg.node_id)

    def _fence_holds(self, peer: Peer, client: Client, msg: m.FenceHolds) -> None:
        self.objects.fence_holds(peer, msg)

    def _link_fence(self, peer: Peer, client: Client, msg: m.LinkFence) -> None:
        peer.send(m.LinkFenced(msg.req_id))  # messages are handled in order: all before it are

    def _wait_object(self, peer: Peer, client: Client, msg: m.WaitObject) -> None:
        self.objects.wait(peer, client.waiters, msg)

    def _locate_object(self, peer: Peer, client: Client, msg: m.LocateObject) -> None:
        self.objects.answer_locate(peer, msg)

    def _objects_freed(self, peer: Peer, client: Client, msg: m.ObjectsFreed) -> None:
        self.objects.objects_freed(msg.object_ids)

    def _stats(self, peer: Peer, client: Client, msg: m.StoreStats) -> None:
        stats = self.objects.store.stats()
        stats["num_workers"] = sum(1 for w in self.workers.values() if not w.gone)
        stats["pulls_started"] = self.objects.pulls_started
        stats["remote_holds"] = len(self.objects.remote)
        peer.send(m.StoreStatsReply(msg.req_id, stats))

    def _task_counts(self, peer: Peer, client: Client, msg: m.TaskCounts) -> None:
        if client.worker is not None:
            self.metrics.task_counts(client.worker.worker_id, msg)

    # -- logs (rtml.logs) ----------------------------------------------------------------------

    def _list_logs(self, peer: Peer, client: Client, msg: m.ListLogs) -> None:
        known = dict(self.exited)
        known.update({w.worker_id.hex()[:12]: (w.pid, w.actor_id)
                      for w in self.workers.values()})
        files = list_files(str(self.session.logs))
        for file in files:
            if file.name.startswith("worker-"):
                file.pid, file.actor_id = known.get(file.name[7:19], (0, b""))
        peer.send(m.LogFiles(msg.req_id, files, self.node_id))

    def _read_log(self, peer: Peer, client: Client, msg: m.ReadLog) -> None:
        peer.send(read(str(self.session.logs), msg.req_id, msg.name, msg.offset,
                       msg.max_bytes))

    _handlers: dict[type, Any] = {
        m.RequestLease: _request_lease, m.ReturnLease: _return_lease,
        m.CancelLeaseRequest: _cancel_lease_request, m.WorkerBlocked: _blocked,
        m.WorkerUnblocked: _blocked, m.WorkerListening: _listening,
        m.WorkerRetiring: _retiring,
        m.ActorReady: _actor_ready, m.CreateObject: _create, m.SealObject: _seal,
        m.AddHolds: _add_holds,
        m.ReleaseHolds: _release_holds, m.ReleaseHolder: _release_holder,
        m.WaitObject: _wait_object, m.CancelTask: _cancel_task, m.StoreStats: _stats,
        m.WorkerOutput: _output, m.ObjectsFreed: _objects_freed,
        m.FenceHolds: _fence_holds, m.LinkFence: _link_fence,
        m.LocateObject: _locate_object, m.TaskCounts: _task_counts,
        m.ListLogs: _list_logs, m.ReadLog: _read_log,
    }

    # -- scheduler commands ------------------------------------------------------------------

    def _run(self, commands: list[Any]) -> None:
        for command in commands:
            if isinstance(command, Grant):
                worker = self.workers[command.worker_id]
                self.metrics.lease_granted(command.client, command.req_id, worker,
                                           self.node_id)
                remote = command.client.context.node_id
                address = worker.tcp_address if remote else worker.address
                command.client.send(m.LeaseGranted(command.req_id, command.lease_id,
                                                   command.worker_id, address,
                                                   command.gpu_ids))
                self._run(self.leases.granted(command.client, command.req_id))
            elif isinstance(command, Reply):
                if isinstance(command.msg, (m.LeaseSpillback, m.LeaseFailed)):
                    self.metrics.lease_elsewhere(command.client, command.msg.req_id)
                command.client.send(command.msg)
            elif isinstance(command, ToHead):
                self.head.send(command.msg)
            elif isinstance(command, StartWorker):
                self._spawn(NO_ACTOR, command.runtime_env)
            elif isinstance(command, StartActor):
                self.actor_gpus[command.actor_id] = command.gpu_ids
                self._spawn(command.actor_id)
            elif isinstance(command, StopWorker):
                self.workers[command.worker_id].kill()
            elif isinstance(command, StopActor):
                self._kill_actor(command.actor_id)
            elif isinstance(command, Refused):
                self.metrics.lease_elsewhere(command.client, command.req_id)
                command.client.send(m.LeaseFailed(command.req_id, command.reason))
                self._run(self.leases.granted(command.client, command.req_id))  # (its spill)

    def _spawn(self, actor_id: ActorID, runtime_env: str = "") -> None:
        """Start a worker: for the actor ``actor_id`` (in its spec's runtime env), or for
        leases (of ``runtime_env``, if one)."""
        if actor_id:
            spec = self.actor_specs.get(actor_id)
            runtime_env = spec.runtime_env if spec is not None else ""
        worker = WorkerProc(new_worker_id(), actor_id, runtime_env=runtime_env)
        self.workers[worker.worker_id] = worker
        config = WorkerConfig(str(self.session.root), self.token, f"unix:{self.unix_path}",
                              self.cfg.head_address, self.cfg.node_ip, worker.worker_id,
                              runtime_env, self.cfg.tls_cert, self.cfg.tls_key)
        log_path = str(self.session.log_file(f"worker-{worker.worker_id.hex()[:12]}-out"))
        self.launcher.spawn(worker, config, log_path)

    def _worker_gone(self, worker: WorkerProc, reason: str) -> None:
        if worker.gone:
            return
        worker.kill()
        worker.gone = True
        self.workers.pop(worker.worker_id, None)
        self.metrics.worker_gone(worker.worker_id)
        self._remember(worker)
        log.info("worker %s gone: %s", worker.worker_id.hex()[:12], reason)
        self.objects.release_holder(worker.worker_id)
        if worker.actor_id:
            self.actor_specs.pop(worker.actor_id, None)
            self.actor_gpus.pop(worker.actor_id, None)
            self.actor_restarts.pop(worker.actor_id, None)
            self._run(self.sched.actor_gone(worker.actor_id))
            self.head.send(m.ActorWorkerDied(worker.actor_id, reason))
            return
        self._run(self.sched.worker_died(worker.worker_id, was_starting=not worker.address,
                                         runtime_env=worker.runtime_env))
        if not self.stopped.is_set():  # (the scheduler counts those still starting)
            live = sum(1 for w in self.workers.values()
                       if not w.actor_id and not w.runtime_env and w.address)
            self._run(self.sched.ensure_pool(live))

    def _remember(self, worker: WorkerProc) -> None:
        """Keep an exited worker's pid and actor: its log files are still asked for."""
        self.exited[worker.worker_id.hex()[:12]] = (worker.pid, worker.actor_id)
        if len(self.exited) > EXITED_KEPT:
            del self.exited[next(iter(self.exited))]

    def _kill_actor(self, actor_id: ActorID) -> None:
        for worker in self.workers.values():
            if worker.actor_id == actor_id:
                worker.kill()
                return
        self.actor_restarts.pop(actor_id, None)
        if self.actor_specs.pop(actor_id, None) is not None:
            self._run(self.sched.actor_gone(actor_id))
            self.head.send(m.ActorWorkerDied(actor_id, "killed before it started"))

    # -- shutdown ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        self.stopped.set()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        await self.launcher.stop(list(self.workers.values()))
        self.head.close()
        self.links.close()
        self.objects.shutdown(self.plane)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.unix_path)
        if self.plane is not None:
            self.plane.close()


ORPHAN_MIN_AGE = 60.0
"""Seconds a store directory must have been unchanged before a sweep may treat it as an
orphan."""


def sweep_orphaned_stores() -> None:
    """Remove the store directories (ours) of node managers that died without cleaning up.

    A directory's name starts with its node manager's pid; a dead pid and no change for
    ORPHAN_MIN_AGE (so a directory of a manager whose pid was reused is not taken while
    it is in use) mark it as an orphan.
    """
    now = time.time()
    for path in objectstore.store_dirs():
        try:
            pid = int(path.name.removeprefix(objectstore.private.PREFIX)[:8], 16)
            if pid_alive(pid) or now - path.stat().st_mtime < ORPHAN_MIN_AGE:
                continue
            objectstore.remove_store_dir(str(path))
            log.info("removed orphaned object store %s (node manager pid %d is gone)", path,
                     pid)
        except (ValueError, OSError):
            continue


async def serve(cfg: NodeConfig, ready: ReadyPipe, zygote: subprocess.Popen[bytes]) -> None:
    nm = NodeManager(cfg, zygote)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, nm.stopped.set)
    try:
        await nm.start()
        await run_until_stopped(nm.stopped, nm.heartbeat_loop(), nm.head_loop(),
                                nm.launcher.read_pids(), nm.ready_when_registered(ready))
    finally:
        await nm.shutdown()


def run(argv: list[str], zygote: subprocess.Popen[bytes]) -> int:
    """Run a node manager (entered through :func:`rtml.node.main.main`)."""
    cfg = NodeConfig.from_json(argv[1])
    ready = ReadyPipe(int(argv[2]) if len(argv) > 2 else -1)
    die_with_launcher()
    setup_logging(str(Session(Path(cfg.session_dir)).log_file("node_manager")))
    return run_daemon("node manager", "node_manager", ready, serve(cfg, ready, zygote))


def _worker_of(peer: Peer) -> WorkerID | None:
    """The worker id of the client on ``peer`` (a lease is never granted to its asker)."""
    worker = peer.context.worker
    return worker.worker_id if worker is not None else None
