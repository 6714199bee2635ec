"""The local scheduler's core: leases, the worker pool and resource accounting.

Sans-I/O. The node manager feeds it events (a lease was requested, a worker
registered, blocked or died, a lease came back) and executes the commands it
returns (grant a lease, start a worker process, report infeasible demand).

    RequestLease --> pending (FIFO, skipping what does not fit yet)
                        |  fits and an idle worker exists
                        v
                     Grant(lease) -- owner pushes tasks straight to the worker
                        |  ReturnLease / owner gone
                        v
                     worker idle again, resources back

A worker that ran a GPU lease only takes GPU leases from then on, and one that ran a
CPU-only lease only CPU-only ones (as Ray): libraries read CUDA_VISIBLE_DEVICES when they
are imported, so a GPU task must not land in a process whose imports came before it.

A lease with a runtime env is granted only to a worker started for that env
(``StartWorker(runtime_env)``), and a worker with one serves only its env's leases (see
``rtml.worker.runtime_env``); such workers are outside the pool, and idle out.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rtml.ids import NO_ACTOR, ActorID, WorkerID
from rtml.scheduler.bundles import bundle_resources
from rtml.scheduler.resources import Shape, add, fits, subtract

CPU = "CPU"
GPU = "GPU"


@dataclass(frozen=True)
class Grant:
    client: Any
    req_id: int
    lease_id: int
    worker_id: WorkerID
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StartWorker:
    actor_id: ActorID = NO_ACTOR
    runtime_env: str = ""  # start it set up for this env ("" a pool worker)


@dataclass(frozen=True)
class StopWorker:
    worker_id: WorkerID


@dataclass(frozen=True)
class StartActor:
    """An actor has its resources; start its dedicated worker."""
    actor_id: ActorID
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StopActor:
    """Its placement group was removed: the actor's worker is stopped."""
    actor_id: ActorID


@dataclass(frozen=True)
class Refused:
    """A lease request that can never be granted here any more (its group was removed)."""
    client: Any
    req_id: int
    reason: str


@dataclass
class Bundles:
    """A placement group's bundles on this node: taken from the pool when prepared,
    offered under the group's names once committed."""
    shapes: list[tuple[int, Shape]]
    committed: bool = False


@dataclass
class LeaseRequest:
    client: Any
    req_id: int
    shape: Shape
    requester: WorkerID | None = None  # the worker asking (for the tasks its task submits), if one
    runtime_env: str = ""  # granted only to a worker of this env


@dataclass
class Lease:
    lease_id: int
    client: Any
    worker_id: WorkerID
    shape: Shape
    blocked: bool = False
    gpu_ids: tuple[int, ...] = ()


@dataclass
class PendingActor:
    actor_id: ActorID
    place_shape: Shape
    hold_shape: Shape


@dataclass
class LocalScheduler:
    """Resource view and lease book of one node."""

    total: Shape
    pool_size: int
    available: Shape = field(init=False)
    idle: deque[WorkerID] = field(default_factory=deque)
    starting: int = 0
    pending: deque[LeaseRequest] = field(default_factory=deque)
    leases: dict[int, Lease] = field(default_factory=dict)
    lease_of_worker: dict[WorkerID, int] = field(default_factory=dict)
    actors_pending: deque[PendingActor] = field(default_factory=deque)
    actor_shapes: dict[ActorID, Shape] = field(default_factory=dict)
    idle_ticks: dict[WorkerID, int] = field(default_factory=dict)
    free_gpus: list[int] = field(init=False)
    actor_gpus: dict[ActorID, tuple[int, ...]] = field(default_factory=dict)
    gpu_worker: dict[WorkerID, bool] = field(default_factory=dict)  # by its first lease's kind
    worker_env: dict[WorkerID, str] = field(default_factory=dict)  # of workers with a runtime env
    env_starting: dict[str, int] = field(default_factory=dict)  # their workers starting
    bundles: dict[str, Bundles] = field(default_factory=dict)  # by placement group (hex)
    total_changes: int = 0  # bundles committed or released: the head is sent the new total
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.available = dict(self.total)
        self.free_gpus = list(range(int(self.total.get(GPU, 0))))

    # -- events ------------------------------------------------------------------------------

    def feasible(self, shape: Shape) -> bool:
        return fits(shape, self.total)

    def request_lease(self, client: Any, req_id: int, shape: Shape,
                      requester: WorkerID | None = None, runtime_env: str = "") -> list[Any]:
        """``requester``: the worker asking, which is never granted to itself (it would
        have to connect to itself, from the thread that serves its connections).
        ``runtime_env``: granted only to a worker started for it."""
        self.pending.append(LeaseRequest(client, req_id, shape, requester, runtime_env))
        return self.dispatch()

    def cancel_request(self, client: Any, req_id: int) -> bool:
        """Withdraw a waiting request; False if it is not waiting (granted, or unknown)."""
        before = len(self.pending)
        self.pending = deque(r for r in self.pending
                             if not (r.client is client and r.req_id == req_id))
        return len(self.pending) < before

    def worker_ready(self, worker_id: WorkerID, runtime_env: str = "") -> list[Any]:
        """A worker (started for ``runtime_env``, if one) is ready for leases."""
        self._started(runtime_env)
        if runtime_env:
            self.worker_env[worker_id] = runtime_env
        self.idle.append(worker_id)
        return self.dispatch()

    def return_lease(self, lease_id: int) -> list[Any]:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return []
        self._release(lease)
        self.idle.append(lease.worker_id)
        return self.dispatch()

    def worker_blocked(self, worker_id: WorkerID) -> list[Any]:
        lease = self._lease_of(worker_id)
        if lease is None or lease.blocked:
            return []
        lease.blocked = True
        add(self.available, {CPU: lease.shape.get(CPU, 0.0)})
        return self.dispatch()

    def worker_unblocked(self, worker_id: WorkerID) -> list[Any]:
        lease = self._lease_of(worker_id)
        if lease is None or not lease.blocked:
            return []
        lease.blocked = False
        subtract(self.available, {CPU: lease.shape.get(CPU, 0.0)})
        return []

    def worker_died(self, worker_id: WorkerID, was_starting: bool = False,
                    runtime_env: str = "") -> list[Any]:
        """A pool worker (or one of ``runtime_env``) exited (``was_starting``: before it
        was ready): free its lease."""
        if was_starting:
            self._started(runtime_env)
        if worker_id in self.idle:
            self.idle.remove(worker_id)
        self.gpu_worker.pop(worker_id, None)
        self.worker_env.pop(worker_id, None)
        lease = self._lease_of(worker_id)
        if lease is not None:
            del self.leases[lease.lease_id]
            self._release(lease)
        return self.dispatch()

    def client_gone(self, client: Any) -> list[Any]:
        """The owner disconnected: drop its requests; its leased workers are stopped.

        They may still be running its tasks, whose results have nowhere to go.
        Their resources come back when they exit (``worker_died``).
        """
        self.pending = deque(r for r in self.pending if r.client is not client)
        stop = [StopWorker(x.worker_id) for x in self.leases.values() if x.client is client]
        return [*stop, *self.dispatch()]

    # -- actors ------------------------------------------------------------------------------

    def place_actor(self, actor_id: ActorID, place_shape: Shape, hold_shape: Shape) -> list[Any]:
        self.actors_pending.append(PendingActor(actor_id, place_shape, hold_shape))
        return self.dispatch()

    def actor_gone(self, actor_id: ActorID) -> list[Any]:
        self.actors_pending = deque(a for a in self.actors_pending if a.actor_id != actor_id)
        shape = self.actor_shapes.pop(actor_id, None)
        if shape is not None:
            add(self.available, shape)
        self.free_gpus.extend(self.actor_gpus.pop(actor_id, ()))
        return self.dispatch()

    # -- placement group bundles -------------------------------------------------------------

    def prepare_bundles(self, pg_hex: str, shapes: list[tuple[int, Shape]]) -> bool:
        """Take the bundles' resources from the pool if they fit now (the head asks every
        node of the group before any commits)."""
        if pg_hex in self.bundles:
            return True
        need: Shape = {}
        for _, shape in shapes:
            add(need, shape)
        if not fits(need, self.available):
            return False
        subtract(self.available, need)
        self.bundles[pg_hex] = Bundles(shapes)
        return True

    def commit_bundles(self, pg_hex: str) -> list[Any]:
        """Every node of the group prepared: its tasks and actors may now use them."""
        bundles = self.bundles.get(pg_hex)
        if bundles is None or bundles.committed:
            return []
        bundles.committed = True
        for index, shape in bundles.shapes:
            offered = bundle_resources(shape, pg_hex, index)
            add(self.total, offered)
            add(self.available, offered)
        self.total_changes += 1
        return self.dispatch()

    def release_bundles(self, pg_hex: str) -> list[Any]:
        """The group was removed (or not created): its resources go back to the pool, and
        what runs on them is stopped."""
        bundles = self.bundles.pop(pg_hex, None)
        if bundles is None:
            return []
        for _, shape in bundles.shapes:
            add(self.available, shape)
        if not bundles.committed:
            return self.dispatch()
        ours = f"_{pg_hex}"
        for resources in (self.total, self.available):
            for name in [n for n in resources if n.endswith(ours)]:
                del resources[name]
        commands: list[Any] = []
        for lease in self.leases.values():
            if any(name.endswith(ours) for name in lease.shape):
                lease.shape = {}  # nothing of it comes back: the group's names are gone
                commands.append(StopWorker(lease.worker_id))
        for actor_id, shape in self.actor_shapes.items():
            if any(name.endswith(ours) for name in shape):
                self.actor_shapes[actor_id] = {}
                commands.append(StopActor(actor_id))
        for request in [r for r in self.pending if any(n.endswith(ours) for n in r.shape)]:
            self.pending.remove(request)
            commands.append(Refused(request.client, request.req_id,
                                    f"lease refused: its placement group {pg_hex} was removed"))
        self.total_changes += 1
        return [*commands, *self.dispatch()]

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self) -> list[Any]:
        """Grant what fits, in arrival order; ask for workers when none is idle."""
        commands: list[Any] = []
        for actor in list(self.actors_pending):
            if fits(actor.place_shape, self.available):
                self.actors_pending.remove(actor)
                subtract(self.available, actor.hold_shape)
                self.actor_shapes[actor.actor_id] = actor.hold_shape
                gpus = self._take_gpus(actor.place_shape)
                if actor.place_shape.get(GPU, 0.0) >= 1:  # whole GPUs come back when it ends
                    self.actor_gpus[actor.actor_id] = gpus
                commands.append(StartActor(actor.actor_id, gpus))
        waiting = 0
        env_waiting: dict[str, int] = {}  # requests waiting for a worker of their env
        room = dict(self.available)  # what is left once waiting requests get workers
        for request in list(self.pending):
            if not fits(request.shape, room):
                continue
            subtract(room, request.shape)
            worker_id = self._idle_worker(request.requester, request.shape.get(GPU, 0.0) > 0,
                                          request.runtime_env)
            if worker_id is None:
                if request.runtime_env:
                    env_waiting[request.runtime_env] = env_waiting.get(
                        request.runtime_env, 0) + 1
                else:
                    waiting += 1
                continue
            self.pending.remove(request)
            commands.append(self._grant(request, worker_id))
        commands.extend(StartWorker() for _ in range(waiting - self.starting))
        self.starting = max(self.starting, waiting)
        for env, count in env_waiting.items():
            starting = self.env_starting.get(env, 0)
            commands.extend(StartWorker(runtime_env=env) for _ in range(count - starting))
            self.env_starting[env] = max(starting, count)
        return commands

    def _started(self, runtime_env: str) -> None:
        """A worker started for ``runtime_env`` ("" the pool) is ready, or died first."""
        if not runtime_env:
            self.starting = max(0, self.starting - 1)
        elif self.env_starting.get(runtime_env, 0) > 1:
            self.env_starting[runtime_env] -= 1
        else:
            self.env_starting.pop(runtime_env, None)

    def ensure_pool(self, live_workers: int) -> list[Any]:
        """Start workers until ``pool_size`` exist or are starting."""
        missing = self.pool_size - live_workers - self.starting
        self.starting += max(0, missing)
        return [StartWorker() for _ in range(missing)]

    def reap_idle(self, ticks: int) -> list[WorkerID]:
        """Called once per tick: idle workers beyond the pool size, idle ``ticks`` ticks.

        The returned workers leave the pool; the caller stops their processes.
        """
        self.idle_ticks = {w: self.idle_ticks.get(w, 0) + 1 for w in self.idle}
        pool = [w for w in self.idle if w not in self.worker_env]
        extra = len(pool) - self.pool_size
        stale = [w for w in pool if self.idle_ticks[w] >= ticks][:max(0, extra)]
        stale += [w for w in self.idle if w in self.worker_env and self.idle_ticks[w] >= ticks]
        for worker_id in stale:
            self.idle.remove(worker_id)
            del self.idle_ticks[worker_id]
            self.gpu_worker.pop(worker_id, None)
            self.worker_env.pop(worker_id, None)
        return stale

    def pending_shapes(self) -> list[Shape]:
        return [r.shape for r in self.pending] + [a.place_shape for a in self.actors_pending]

    def _idle_worker(self, requester: WorkerID | None, gpu: bool, env: str = ""
                     ) -> WorkerID | None:
        """An idle worker other than ``requester`` that has run only leases of this kind
        (GPU or not) and was started for ``env``, taken out of the idle pool; or None."""
        idle = self.idle
        if not idle:
            return None
        first = idle[0]
        envs = self.worker_env
        if (first != requester and self.gpu_worker.get(first, gpu) == gpu
                and envs.get(first, "") == env):
            self.gpu_worker[first] = gpu
            return idle.popleft()
        for worker_id in idle:
            if (worker_id != requester and self.gpu_worker.get(worker_id, gpu) == gpu
                    and envs.get(worker_id, "") == env):
                idle.remove(worker_id)
                self.gpu_worker[worker_id] = gpu
                return worker_id
        return None

    def _grant(self, request: LeaseRequest, worker_id: WorkerID) -> Grant:
        lease = Lease(next(self._ids), request.client, worker_id, request.shape,
                      gpu_ids=self._take_gpus(request.shape))
        self.leases[lease.lease_id] = lease
        self.lease_of_worker[worker_id] = lease.lease_id
        subtract(self.available, request.shape)
        return Grant(request.client, request.req_id, lease.lease_id, worker_id, lease.gpu_ids)

    def _take_gpus(self, shape: Shape) -> tuple[int, ...]:
        """GPU ids for a grant: whole GPUs are taken; a fraction shares the first free one."""
        wanted = shape.get(GPU, 0.0)
        if wanted <= 0 or not self.free_gpus:
            return ()
        if wanted < 1:
            return (self.free_gpus[0],)
        count = min(len(self.free_gpus), math.ceil(wanted))
        taken, self.free_gpus = self.free_gpus[:count], self.free_gpus[count:]
        return tuple(taken)

    def _release(self, lease: Lease) -> None:
        if lease.shape.get(GPU, 0.0) >= 1:
            self.free_gpus.extend(lease.gpu_ids)
        self.lease_of_worker.pop(lease.worker_id, None)
        shape = dict(lease.shape)
        if lease.blocked:
            shape.pop(CPU, None)
        add(self.available, shape)

    def _lease_of(self, worker_id: WorkerID) -> Lease | None:
        lease_id = self.lease_of_worker.get(worker_id)
        return self.leases.get(lease_id) if lease_id is not None else None
