"""The node manager: local scheduler, worker pool and shared-memory store of one node.

    drivers/workers --unix socket--> NodeManager.on_message
        RequestLease  -> LocalScheduler -> Grant -> LeaseGranted(worker address)
        Seal/Holds    -> StoreCore      -> Spill/Restore/Delete files, ObjectAvailable
        WorkerBlocked -> CPU lent back while a task waits in get()
    head service <--tcp/unix-- RegisterNode, NodeHeartbeat (resources, pending demand),
                               StartActor -> dedicated worker -> ActorStarted
    worker exit (pidfd) -> lease freed, holds dropped, pool refilled, head told
    seal/spill/restore/delete -> ObjectTableBatch --each heartbeat tick, one pipelined
                                 call in a thread--> control plane objects table

Run as ``python -m rtml.scheduler.node_manager CONFIG_JSON READY_FD``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtml import objectstore as ostore
from rtml.config import HEARTBEAT_INTERVAL, TOKEN_ENV, NodeConfig
from rtml.control_plane import ControlPlane
from rtml.daemon import FramedClient, die_with_parent, pid_alive, report_ready, setup_logging
from rtml.ids import random_id
from rtml.rpc import messages as m
from rtml.rpc.reactor import make_hello
from rtml.rpc.server import Peer, Service, protocol_factory
from rtml.scheduler.local import Grant, LocalScheduler, StartActor, StartWorker, StopWorker
from rtml.scheduler.worker_procs import WorkerLauncher, WorkerProc
from rtml.session import Session

log = logging.getLogger(__name__)

GONE_CLIENTS_KEPT = 10_000
"""Disconnected client ids remembered, so late seals on their behalf hold nothing."""

IDLE_WORKER_TICKS = 10
"""Heartbeat ticks (0.5 s each) a worker beyond the pool size may idle before it is stopped."""


class ObjectTableBatch:
    """Object-table changes waiting for the next flush to the control plane.

    Sans-I/O: the node manager notes seals, state changes and deletes as they
    happen (a dict update each) and drains a batch once per heartbeat tick.
    ``recorded`` is every id written or about to be written, so a state change
    of an object that was deleted meanwhile cannot resurrect a partial record.
    """

    def __init__(self, node_id: bytes) -> None:
        self.node_id = node_id
        self.puts: dict[bytes, dict[str, Any]] = {}
        self.removes: set[bytes] = set()
        self.recorded: set[bytes] = set()

    def sealed(self, object_id: bytes, size: int, owner: bytes) -> None:
        """A new object was sealed here; ``owner`` is its first holder (a hint)."""
        self.removes.discard(object_id)
        self.recorded.add(object_id)
        self.puts[object_id] = {"node_id": self.node_id, "locations": [self.node_id],
                                "size": size, "state": "SEALED", "owner": owner}

    def state_changed(self, object_id: bytes, state: str) -> None:
        """The object moved between shared memory (SEALED) and disk (SPILLED)."""
        if object_id in self.recorded:
            self.puts.setdefault(object_id, {})["state"] = state

    def deleted(self, object_id: bytes) -> None:
        if object_id in self.recorded:
            self.recorded.discard(object_id)
            self.puts.pop(object_id, None)
            self.removes.add(object_id)

    def drain(self) -> tuple[dict[bytes, dict[str, Any]], list[bytes]]:
        """The pending (puts, removes), now owned by the caller."""
        puts, removes = self.puts, list(self.removes)
        self.puts, self.removes = {}, set()
        return puts, removes

    def requeue(self, puts: dict[bytes, dict[str, Any]], removes: list[bytes]) -> None:
        """Put back a batch whose write failed, under any newer change."""
        for object_id, info in puts.items():
            if object_id in self.recorded:
                self.puts[object_id] = {**info, **self.puts.get(object_id, {})}
        for object_id in removes:
            if object_id not in self.recorded:
                self.removes.add(object_id)


@dataclass
class Client:
    client_id: bytes
    role: str
    job_id: bytes = b""
    worker: WorkerProc | None = None
    waiters: set[int] = field(default_factory=set)


class NodeManager(Service):
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.token = cfg.token
        self.session = Session(Path(cfg.session_dir))
        # The id starts with our pid, so the store namespace (its first 12 hex digits)
        # tells a later node manager whether the segments' owner is still alive.
        self.node_id = os.getpid().to_bytes(4, "big") + random_id(12)
        self.namespace = self.node_id.hex()[:12]
        self.sched = LocalScheduler(cfg.total_resources(), self._pool_size())
        self.store = ostore.StoreCore(cfg.object_store_memory)
        self.workers: dict[bytes, WorkerProc] = {}
        self.actor_specs: dict[bytes, m.ActorSpec] = {}
        self.waiters: dict[int, tuple[Peer, int]] = {}
        self._waiter_ids = 0
        self._collect_scheduled = False
        self.unix_path = str(self.session.sockets / "nm.sock")
        self.stopped = asyncio.Event()
        self.objects = ObjectTableBatch(self.node_id)
        self.plane: ControlPlane | None = None
        self.gone_clients: dict[bytes, None] = {}  # insertion-ordered, bounded
        self.drivers: set[Peer] = set()
        self.launcher = WorkerLauncher({**os.environ, TOKEN_ENV: self.token},
                                       self._worker_gone)

    def _pool_size(self) -> int:
        if self.cfg.prestart_workers >= 0:
            return self.cfg.prestart_workers
        return max(1, int(self.cfg.num_cpus))

    # -- startup -----------------------------------------------------------------------------

    async def start(self) -> None:
        sweep_orphaned_segments()
        await self.launcher.start()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(protocol_factory(self), self.unix_path)
        os.chmod(self.unix_path, 0o600)
        hello = make_hello(self.token, "node", self.node_id)
        self.head, reply = await FramedClient.connect(self.cfg.head_address, hello)
        self.redis_info = reply.info
        self.plane = ControlPlane(reply.info["redis_host"], int(reply.info["redis_port"]),
                                  self.token)
        self.head.send(m.RegisterNode(self.node_id, f"unix:{self.unix_path}", self.unix_path,
                                      self.sched.total, str(self.session.root)))
        self._tasks = [asyncio.create_task(self._heartbeat()),
                       asyncio.create_task(self._head_loop())]
        self._run(self.sched.ensure_pool(0))

    async def _heartbeat(self) -> None:
        while True:
            for worker_id in self.sched.reap_idle(IDLE_WORKER_TICKS):
                self.workers[worker_id].kill()
            self.head.send(m.NodeHeartbeat(self.node_id, dict(self.sched.available),
                                           self.sched.pending_shapes()))
            await self._flush_objects()
            await asyncio.sleep(HEARTBEAT_INTERVAL)

    async def _flush_objects(self) -> None:
        """Write this tick's object-table changes: one pipelined call, in a thread."""
        puts, removes = self.objects.drain()
        if self.plane is None or (not puts and not removes):
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self.plane.write_objects, puts, removes)
        except Exception as exc:  # RtmlSystemError: Redis is down; retry next tick
            log.warning("object table update failed (%s); retrying next heartbeat", exc)
            self.objects.requeue(puts, removes)

    async def _head_loop(self) -> None:
        try:
            while True:
                self._on_head_message(await self.head.receive())
        except (ConnectionError, OSError) as exc:
            log.error("lost the head service: %s; stopping", exc)
            self.stopped.set()

    def _on_head_message(self, msg: Any) -> None:
        if isinstance(msg, m.StartActor):
            self.actor_specs[msg.spec.actor_id] = msg.spec
            self._run(self.sched.place_actor(msg.spec.actor_id, msg.spec.shape,
                                             msg.spec.hold_shape))
        elif isinstance(msg, m.KillActorWorker):
            self._kill_actor(msg.actor_id)
        elif isinstance(msg, m.Shutdown):
            self.stopped.set()

    # -- connections -------------------------------------------------------------------------

    def on_hello(self, peer: Peer, hello: m.Hello) -> m.HelloReply:
        client = Client(hello.client_id, hello.role, hello.job_id)
        if hello.role == "driver":
            self.drivers.add(peer)
        worker = self.workers.get(hello.client_id) if hello.role == "worker" else None
        if worker is not None:
            worker.peer = peer
            client.worker = worker
        peer.context = client
        return m.HelloReply(ok=True, node_id=self.node_id,
                            info={"store_namespace": self.namespace})

    def on_message(self, peer: Peer, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("unexpected %s from a client", type(msg).__name__)
            return
        handler(self, peer, peer.context, msg)
        self._schedule_collect()

    def on_disconnect(self, peer: Peer) -> None:
        client: Client = peer.context
        self.drivers.discard(peer)
        self._run(self.sched.client_gone(peer))
        for waiter_id in client.waiters:
            self.waiters.pop(waiter_id, None)
            self.store.cancel_waiter(waiter_id)
        self.gone_clients[client.client_id] = None
        if len(self.gone_clients) > GONE_CLIENTS_KEPT:
            del self.gone_clients[next(iter(self.gone_clients))]
        self.store.release_holder(client.client_id)
        self._schedule_collect()
        if client.worker is not None:
            self._worker_gone(client.worker, "its connection closed")

    # -- message handlers --------------------------------------------------------------------

    def _request_lease(self, peer: Peer, client: Client, msg: m.RequestLease) -> None:
        if not self.sched.feasible(msg.shape):
            peer.send(m.LeaseInfeasible(msg.req_id, msg.shape))
        self._run(self.sched.request_lease(peer, msg.req_id, msg.shape))

    def _return_lease(self, peer: Peer, client: Client, msg: m.ReturnLease) -> None:
        self._run(self.sched.return_lease(msg.lease_id))

    def _cancel_lease_request(self, peer: Peer, client: Client,
                              msg: m.CancelLeaseRequest) -> None:
        self._run(self.sched.cancel_request(peer, msg.req_id))

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
        worker.address = msg.address
        if worker.actor_id:
            peer.send(m.BecomeActor(self.actor_specs[worker.actor_id]))
        else:
            self._run(self.sched.worker_ready(worker.worker_id))

    def _output(self, peer: Peer, client: Client, msg: m.WorkerOutput) -> None:
        for driver in self.drivers:
            if not msg.job_id or driver.context.job_id == msg.job_id:
                driver.send(msg)

    def _actor_ready(self, peer: Peer, client: Client, msg: m.ActorReady) -> None:
        worker = client.worker
        if worker is not None:
            self.head.send(m.ActorStarted(msg.actor_id, worker.worker_id, worker.address,
                                          msg.error))

    def _seal(self, peer: Peer, client: Client, msg: m.SealObject) -> None:
        new = not self.store.contains(msg.object_id)
        # A result sealed for an owner that already left is held by nobody: freed at once.
        holder = b"" if msg.holder in self.gone_clients else msg.holder
        commands = self.store.seal(msg.object_id, msg.size, holder)
        if new:
            self.objects.sealed(msg.object_id, msg.size, msg.holder)
        self._store(commands)

    def _add_holds(self, peer: Peer, client: Client, msg: m.AddHolds) -> None:
        self._store(self.store.add_holds(msg.object_ids, msg.holder))

    def _release_holds(self, peer: Peer, client: Client, msg: m.ReleaseHolds) -> None:
        self._store(self.store.release_holds(msg.object_ids, msg.holder))

    def _release_holder(self, peer: Peer, client: Client, msg: m.ReleaseHolder) -> None:
        self._store(self.store.release_holder(msg.holder))

    def _wait_object(self, peer: Peer, client: Client, msg: m.WaitObject) -> None:
        self._waiter_ids += 1
        waiter_id = self._waiter_ids
        self.waiters[waiter_id] = (peer, msg.req_id)
        client.waiters.add(waiter_id)
        self._store(self.store.wait(msg.object_id, waiter_id))

    def _cancel_task(self, peer: Peer, client: Client, msg: m.CancelTask) -> None:
        worker = self.workers.get(msg.worker_id)
        if worker is None or worker.gone:
            return
        if msg.force:
            worker.kill()
        elif worker.peer is not None:
            worker.peer.send(m.CancelRunning(msg.task_id))

    def _stats(self, peer: Peer, client: Client, msg: m.StoreStats) -> None:
        stats = self.store.stats()
        stats["num_workers"] = sum(1 for w in self.workers.values() if not w.gone)
        peer.send(m.StoreStatsReply(msg.req_id, stats))

    _handlers: dict[type, Any] = {
        m.RequestLease: _request_lease, m.ReturnLease: _return_lease,
        m.CancelLeaseRequest: _cancel_lease_request, m.WorkerBlocked: _blocked,
        m.WorkerUnblocked: _blocked, m.WorkerListening: _listening,
        m.ActorReady: _actor_ready, m.SealObject: _seal, m.AddHolds: _add_holds,
        m.ReleaseHolds: _release_holds, m.ReleaseHolder: _release_holder,
        m.WaitObject: _wait_object, m.CancelTask: _cancel_task, m.StoreStats: _stats,
        m.WorkerOutput: _output,
    }

    # -- scheduler commands ------------------------------------------------------------------

    def _run(self, commands: list[Any]) -> None:
        for command in commands:
            if isinstance(command, Grant):
                worker = self.workers[command.worker_id]
                command.client.send(m.LeaseGranted(command.req_id, command.lease_id,
                                                   command.worker_id, worker.address))
            elif isinstance(command, StartWorker):
                self._spawn(b"")
            elif isinstance(command, StartActor):
                self._spawn(command.actor_id)
            elif isinstance(command, StopWorker):
                self.workers[command.worker_id].kill()

    def _spawn(self, actor_id: bytes) -> None:
        worker = WorkerProc(random_id(), actor_id)
        self.workers[worker.worker_id] = worker
        config = {"session_dir": str(self.session.root),
                  "nm_address": f"unix:{self.unix_path}",
                  "head_address": self.cfg.head_address, "worker_id": worker.worker_id.hex()}
        log_path = str(self.session.log_file(f"worker-{worker.worker_id.hex()[:12]}-out"))
        self.launcher.spawn(worker, config, log_path)

    def _worker_gone(self, worker: WorkerProc, reason: str) -> None:
        if worker.gone:
            return
        worker.kill()
        worker.gone = True
        self.workers.pop(worker.worker_id, None)
        log.info("worker %s gone: %s", worker.worker_id.hex()[:12], reason)
        self.store.release_holder(worker.worker_id)
        self._schedule_collect()
        if worker.actor_id:
            self.actor_specs.pop(worker.actor_id, None)
            self._run(self.sched.actor_gone(worker.actor_id))
            self.head.send(m.ActorWorkerDied(worker.actor_id, reason))
            return
        self._run(self.sched.worker_died(worker.worker_id, was_starting=not worker.address))
        if not self.stopped.is_set():
            live = sum(1 for w in self.workers.values() if not w.actor_id)
            self._run(self.sched.ensure_pool(live))

    def _kill_actor(self, actor_id: bytes) -> None:
        for worker in self.workers.values():
            if worker.actor_id == actor_id:
                worker.kill()
                return
        if self.actor_specs.pop(actor_id, None) is not None:
            self._run(self.sched.actor_gone(actor_id))
            self.head.send(m.ActorWorkerDied(actor_id, "killed before it started"))

    # -- object store commands ---------------------------------------------------------------

    def _schedule_collect(self) -> None:
        if not self._collect_scheduled:
            self._collect_scheduled = True
            asyncio.get_running_loop().call_soon(self._collect)

    def _collect(self) -> None:
        self._collect_scheduled = False
        self._store(self.store.collect())

    def _store(self, commands: list[Any]) -> None:
        for command in commands:
            if isinstance(command, ostore.NotifyReady):
                self._notify(command.waiter_ids, "")
            elif isinstance(command, ostore.NotifyLost):
                self._notify(command.waiter_ids, command.reason)
            elif isinstance(command, ostore.Spill):
                self._spill(command.object_id)
            elif isinstance(command, ostore.Restore):
                self._restore(command.object_id)
            elif isinstance(command, ostore.Delete):
                self._delete(command.object_id, command.spilled)

    def _notify(self, waiter_ids: tuple[int, ...], error: str) -> None:
        for waiter_id in waiter_ids:
            entry = self.waiters.pop(waiter_id, None)
            if entry is not None:
                peer, req_id = entry
                peer.send(m.ObjectAvailable(req_id, b"", error))

    def _segment(self, object_id: bytes) -> str:
        return ostore.segment_path(self.namespace, object_id)

    def _spill_file(self, object_id: bytes) -> str:
        return ostore.spill_path(str(self.session.spill), object_id)

    def _spill(self, object_id: bytes) -> None:
        try:
            ostore.copy_file(self._segment(object_id), self._spill_file(object_id))
            os.unlink(self._segment(object_id))
        except OSError as exc:
            log.error("spilling %s failed: %s", object_id.hex(), exc)
            self._store(self.store.lost(object_id, f"spill failed: {exc}"))
            return
        self.objects.state_changed(object_id, "SPILLED")

    def _restore(self, object_id: bytes) -> None:
        try:
            ostore.copy_file(self._spill_file(object_id), self._segment(object_id))
            os.unlink(self._spill_file(object_id))
        except OSError as exc:
            log.error("restoring %s failed: %s", object_id.hex(), exc)
            self._store(self.store.lost(object_id, f"restore failed: {exc}"))
            return
        self.objects.state_changed(object_id, "SEALED")
        self._store(self.store.restored(object_id))

    def _delete(self, object_id: bytes, spilled: bool) -> None:
        self.objects.deleted(object_id)
        for path in (self._segment(object_id), self._spill_file(object_id)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # -- shutdown ----------------------------------------------------------------------------

    async def shutdown(self) -> None:
        self.stopped.set()
        await self.launcher.stop(list(self.workers.values()))
        for path in Path("/dev/shm").glob(f"rtml-{self.namespace}-*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.unix_path)
        self._forget_objects()

    def _forget_objects(self) -> None:
        """Best effort: drop this node's objects from the control plane; they died with it."""
        if self.plane is None:
            return
        gone = list(self.objects.recorded | self.objects.removes)
        try:
            self.plane.write_objects({}, gone)
        except Exception as exc:  # Redis may already be stopped with the cluster
            log.info("could not remove %d object record(s) at shutdown: %s", len(gone), exc)
        self.plane.close()


ORPHAN_MIN_AGE = 60.0
"""Seconds a segment must be old before a sweep may treat it as an orphan."""


def sweep_orphaned_segments() -> None:
    """Remove /dev/shm segments left by node managers that died without cleaning up.

    A segment's namespace starts with its node manager's pid; a dead pid and an age
    over ORPHAN_MIN_AGE (so files of processes using other naming are left alone)
    mark it as an orphan.
    """
    now = time.time()
    for path in Path("/dev/shm").glob("rtml-*-*"):
        namespace = path.name.split("-")[1]
        try:
            pid = int(namespace[:8], 16)
            if (len(namespace) != 12 or pid_alive(pid)
                    or now - path.stat().st_mtime < ORPHAN_MIN_AGE):
                continue
            path.unlink()
            log.info("removed orphaned segment %s (node manager pid %d is gone)", path, pid)
        except (ValueError, OSError):
            continue


async def serve(cfg: NodeConfig, ready_fd: int) -> None:
    nm = NodeManager(cfg)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, nm.stopped.set)
    try:
        await nm.start()
        report_ready(ready_fd, f"ok {nm.node_id.hex()} unix:{nm.unix_path}")
        await nm.stopped.wait()
    finally:
        await nm.shutdown()


def main(argv: list[str]) -> int:
    cfg = NodeConfig.from_json(argv[1])
    ready_fd = int(argv[2]) if len(argv) > 2 else -1
    if os.environ.get("RTML_DIE_WITH_PARENT") == "1":
        die_with_parent()
    setup_logging(str(Session(Path(cfg.session_dir)).log_file("node_manager")))
    try:
        asyncio.run(serve(cfg, ready_fd))
    except Exception:
        log.exception("node manager failed")
        if ready_fd >= 0:
            with contextlib.suppress(OSError):
                report_ready(ready_fd, "error see node_manager.log")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
