"""The owner's task submitter: resolve arguments, lease workers, push tasks.

    f.remote() -> TaskRecord --deps ready--> queue[shape, strategy, node holding its args]
                                                | idle leased worker?  yes -> PushTask (direct write)
                                                | no -> RequestLease to the local node manager
    LeaseSpillback(node) -> RequestLease(spilled) to that node's manager (TCP)
    LeaseGranted -> connect to the worker ------+
    TaskResults  -> store returns, wake getters, push the next queued tasks (per read)
    FunctionWanted -> PushFunction (once per worker), the task queued again free
    worker gone  -> retry in-flight tasks (max_retries) or fail them

Leases are kept while tasks of their shape keep coming and handed back after
``LEASE_IDLE_TIMEOUT`` idle. Tasks are pipelined by their function's measured
run time: each worker gets enough in flight to cover a result's round trip
(``COVER_SECONDS`` of work, 16 at most), so it never idles waiting for the next
one while short tasks stay spread evenly; long tasks (and functions not yet
timed) go one at a time, so they spread over every leased worker.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rtml.config import LEASE_IDLE_TIMEOUT
from rtml.core.links import ClientLinks
from rtml.core.tasks import LeasedWorker, TaskEvents, TaskRecord, scheduling_error
from rtml.exceptions import RtmlError, TaskCancelledError, WorkerCrashedError
from rtml.ids import NO_NODE, NodeID
from rtml.rpc import messages as m
from rtml.rpc.reactor import Connection
from rtml.scheduler.resources import Shape
from rtml.scheduler.strategy import SPREAD

log = logging.getLogger(__name__)

PIPELINE_DEPTH = 16
COVER_SECONDS = 0.0025
LONG_TASK_SECONDS = 0.05
MAX_LEASE_REQUESTS = 8


RUNTIME_ENV = "runtime_env"
"""First item of the lease key of calls with a runtime env; its second is the env."""


def with_runtime_env(key: tuple[Any, ...], env: str) -> tuple[Any, ...]:
    """The lease key of calls of ``key`` in runtime env ``env`` (wire form, "" none): their
    queue asks for workers of that env. Worked out once per call options, not per call."""
    return (RUNTIME_ENV, env, *key) if env else key


def runtime_env_of(key: tuple[Any, ...]) -> str:
    return key[1] if key and key[0] == RUNTIME_ENV else ""


class RunTimes:
    """Moving-average run time and the pipeline depth it allows, per function, in one
    lease queue (each queue has its own).

    Not per queue alone: functions of one shape share leases, and a long task must
    not be queued behind another function's deep pipeline. Not per function alone:
    one function's calls under other options (``num_gpus=2`` vs 1) are other work.
    """

    def __init__(self) -> None:
        self._avg: dict[bytes, float] = {}
        self.depth: dict[bytes, int] = {}  # absent: never timed, one at a time

    def record(self, function_id: bytes, seconds: float) -> None:
        avg = self._avg.get(function_id)
        avg = self._avg[function_id] = seconds if avg is None else 0.8 * avg + 0.2 * seconds
        self.depth[function_id] = (
            1 if avg >= LONG_TASK_SECONDS else
            min(PIPELINE_DEPTH, 1 + math.ceil(COVER_SECONDS / max(avg, 1e-6))))


@dataclass
class ShapeQueue:
    shape: Shape
    strategy: str = ""
    preferred_node: NodeID = NO_NODE
    runtime_env: str = ""  # its tasks' (rtml.core.runtime_env): leased from workers of it
    tasks: deque[TaskRecord] = field(default_factory=deque)
    workers: list[LeasedWorker] = field(default_factory=list)
    lease_requests: set[int] = field(default_factory=set)
    run_times: RunTimes = field(default_factory=RunTimes)


class TaskSubmitter:
    def __init__(self, links: ClientLinks, events: TaskEvents,
                 exported: dict[bytes, bytes]) -> None:
        """``events``: the tasks' owner; ``exported``: this process's functions by id,
        for a worker that asks for one."""
        self.links = links
        self.events = events
        self.exported = exported
        self.queues: dict[tuple[Any, ...], ShapeQueue] = {}
        # req_id -> (queue key, the node manager asked, that node's id)
        self._lease_keys: dict[int, tuple[tuple[Any, ...], Connection, bytes]] = {}

    def has_queued(self) -> bool:
        """Tasks wait for a worker: results must be read promptly to push them.

        Called without the runtime lock: ``list()`` copies the queues in one step, so a
        queue added meanwhile by another thread cannot break the iteration."""
        for queue in list(self.queues.values()):
            if queue.tasks:
                return True
        return False

    # -- submission (user thread, under the runtime lock) ------------------------------------

    def enqueue(self, record: TaskRecord) -> None:
        """Queue a task whose arguments are resolved and push what can go now."""
        key = record.key
        strategy = key[-1] if key else ""  # a remote function's key ends with its strategy
        preferred = self._args_node(record.spec) if record.spec.args else NO_NODE
        if preferred:
            key = (*key, preferred)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = ShapeQueue(record.shape, strategy, preferred,
                                                  runtime_env_of(record.key))
        tasks = queue.tasks
        tasks.append(record)
        # Outside a pump, tasks wait only while no worker has room, and a full set of lease
        # requests is out once MAX_LEASE_REQUESTS wait: then pumping could change nothing
        # (results, grants and lost workers pump again).
        if len(tasks) <= MAX_LEASE_REQUESTS:
            self._pump(key, queue)

    def _pump(self, key: tuple[Any, ...], queue: ShapeQueue) -> None:
        tasks = queue.tasks
        workers = queue.workers
        if tasks and workers:
            depths = queue.run_times.depth
            spread = queue.strategy == SPREAD  # one task per lease: each placed on its own
            pushed = True
            while tasks and pushed:  # one task per worker with room per pass: evenly spread
                pushed = False
                for worker in workers:
                    if not tasks:
                        break
                    depth = 1 if spread else depths.get(tasks[0].spec.function_id, 1)
                    if len(worker.inflight) < depth and not worker.solo:
                        self._push(worker, tasks.popleft(), depth == 1)
                        pushed = True
        if not tasks:
            if queue.lease_requests:
                self._cancel_lease_requests(queue)  # nothing left to place: stop asking
            return
        wanted = min(len(tasks), MAX_LEASE_REQUESTS) - len(queue.lease_requests)
        for _ in range(wanted):
            self._request_lease(key, queue, self.links.nm, self.links.node_id, spilled=False)

    def _request_lease(self, key: tuple[Any, ...], queue: ShapeQueue, nm: Connection,
                       node_id: NodeID, spilled: bool) -> None:
        req_id = self.links.next_request_id()
        queue.lease_requests.add(req_id)
        self._lease_keys[req_id] = (key, nm, node_id)
        nm.send(m.RequestLease(req_id, queue.shape, queue.strategy, queue.preferred_node,
                               spilled, queue.runtime_env))

    def _args_node(self, spec: m.TaskSpec) -> NodeID:
        """Another node holding one of the task's large arguments, if any (locality)."""
        here = self.links.node_id
        for arg in spec.args:
            if arg.node_id and arg.node_id != here:
                return arg.node_id
        return NO_NODE

    def _cancel_lease_requests(self, queue: ShapeQueue) -> None:
        """Withdraw outstanding requests; a grant already on its way is handed back."""
        for req_id in queue.lease_requests:
            entry = self._lease_keys.pop(req_id, None)
            if entry is not None:
                entry[1].send(m.CancelLeaseRequest(req_id))
        queue.lease_requests.clear()

    def _push(self, worker: LeasedWorker, record: TaskRecord, solo: bool) -> None:
        record.worker = worker
        record.solo = solo
        worker.solo += solo
        if worker.gpu_ids:
            record.spec.gpu_ids = worker.gpu_ids
        busy = bool(worker.inflight)
        worker.inflight[record.spec.task_id] = record
        if busy:  # pipelined behind other tasks: coalesce with the rest of the burst
            worker.conn.send_soon(m.PushTask(record.spec))
        else:
            self.links.send_ordered(worker.conn, m.PushTask(record.spec))

    # -- leases (reactor thread) -------------------------------------------------------------

    def _take_request(self, req_id: int) -> tuple[tuple[Any, ...], ShapeQueue | None]:
        entry = self._lease_keys.pop(req_id, None)
        if entry is None:
            return (), None
        queue = self.queues.get(entry[0])
        if queue is not None:
            queue.lease_requests.discard(req_id)
        return entry[0], queue

    def on_lease_granted(self, msg: m.LeaseGranted, nm: Connection, node_id: NodeID) -> None:
        key, queue = self._take_request(msg.req_id)
        if queue is None or not queue.tasks:
            nm.send(m.ReturnLease(msg.lease_id))
            return
        try:
            conn = self.links.connect_worker(msg.address, self._on_results,
                                          self._on_worker_closed)
        except Exception as exc:  # the worker died between grant and connect
            log.info("leased worker at %s unreachable: %s", msg.address, exc)
            nm.send(m.ReturnLease(msg.lease_id))
            with self.links.lock:
                self._pump(key, queue)
            return
        worker = LeasedWorker(conn, msg.lease_id, msg.worker_id, key, nm, node_id,
                              msg.gpu_ids)
        conn.context = worker
        with self.links.lock:
            queue.workers.append(worker)
            self._pump(key, queue)

    def on_spillback(self, msg: m.LeaseSpillback) -> None:
        """The local node has no room: ask the node the global scheduler picked."""
        key, queue = self._take_request(msg.req_id)
        if queue is None or not queue.tasks:
            return
        try:
            nm = self.links.node_manager_at(msg.node_id, msg.address)
        except Exception as exc:
            log.warning("node %s at %s unreachable: %s", msg.node_id.hex(), msg.address, exc)
            with self.links.lock:
                self._pump(key, queue)
            return
        with self.links.lock:
            self._request_lease(key, queue, nm, msg.node_id, spilled=True)

    def node_died(self, node_id: NodeID) -> None:
        """Drop leases and requests on a dead node: its tasks are retried elsewhere."""
        with self.links.lock:
            workers = [w for q in self.queues.values() for w in q.workers
                       if w.node_id == node_id]
            stale = [req_id for req_id, (_, _, asked) in self._lease_keys.items()
                     if asked == node_id]
            for req_id in stale:
                key, queue = self._take_request(req_id)
                if queue is not None:
                    self._pump(key, queue)
        for worker in workers:
            worker.conn.close(f"its node {node_id.hex()} died")

    def on_lease_failed(self, msg: m.LeaseFailed) -> None:
        key, queue = self._take_request(msg.req_id)
        if queue is None:
            return
        with self.links.lock:
            failed = list(queue.tasks)
            queue.tasks.clear()
        for record in failed:
            self.events.fail_task(record, scheduling_error(msg.reason, record.spec.name))

    # -- results (reactor thread) ------------------------------------------------------------

    def _on_results(self, conn: Connection, msgs: list[Any]) -> None:
        """The results of one read from a leased worker: the queue is pumped once."""
        links, events = self.links, self.events
        worker: LeasedWorker = conn.context
        done: list[tuple[TaskRecord, m.TaskResult]] = []
        failed: list[tuple[TaskRecord, BaseException]] = []
        items: list[m.GeneratorItem] = []
        matched = 0
        with links.lock:
            queue = self.queues[worker.key]
            inflight = worker.inflight
            run_times = queue.run_times
            wanted: list[TaskRecord] = []
            for msg in msgs:
                if type(msg) is m.GeneratorItem:  # a generator task's, still running
                    items.append(msg)
                    continue
                record = inflight.pop(msg.task_id, None)
                if record is None:
                    if type(msg) is m.WorkerRetiring:  # it exits: push it nothing more
                        worker.retiring = True
                        if worker in queue.workers:
                            queue.workers.remove(worker)
                    continue
                matched += 1
                worker.solo -= record.solo
                if type(msg) is m.FunctionWanted:  # it did not run
                    self._function_wanted(worker, record, msg.function_id, wanted, failed)
                    continue
                if not msg.cancelled:  # a cancelled run's length says nothing of the function's
                    run_times.record(record.spec.function_id, msg.end_us / 1e6)
                if (record.retry_exceptions and not record.cancelled
                        and events.should_retry_exception(record, msg)):
                    record.spec.attempt += 1
                    queue.tasks.appendleft(record)
                else:
                    done.append((record, msg))
            if not matched:
                if items:
                    events.generated(items, worker.node_id)
                return
            if wanted:
                queue.tasks.extendleft(reversed(wanted))  # ahead of the rest, in their order
            # One task per lease under SPREAD, so that each is placed on its own; but a
            # worker that asked for a function keeps its lease for the task it asked for.
            spread = queue.strategy == SPREAD and not wanted and not worker.retiring
            if spread:
                queue.workers.remove(worker)
            self._pump(worker.key, queue)
            if not spread and not worker.retiring and not inflight and not queue.tasks:
                self._arm_idle(worker)
        if spread:
            self._retire(worker)
        if items:
            events.generated(items, worker.node_id)
        if done:
            events.complete_tasks(done)
        for record, error in failed:
            events.fail_task(record, error)

    def _function_wanted(self, worker: LeasedWorker, record: TaskRecord, function_id: bytes,
                         wanted: list[TaskRecord],
                         failed: list[tuple[TaskRecord, BaseException]]) -> None:
        """A worker could not load a task's function (Redis is away, or our export waits
        for it): send it ours, once per worker, and queue the task again, free (the task
        follows the function on that connection, wherever it is pushed next)."""
        blob = self.exported.get(function_id)
        if record.cancelled:
            failed.append((record, TaskCancelledError(
                f"task {record.spec.name!r} was cancelled")))
        elif blob is None:
            failed.append((record, RtmlError(
                f"task {record.spec.name!r}: its function {function_id.hex()} is neither in "
                f"the control plane nor exported by this process")))
        else:
            if function_id not in worker.functions_sent:
                worker.functions_sent.add(function_id)
                worker.conn.send(m.PushFunction(function_id, blob))
            wanted.append(record)

    def _arm_idle(self, worker: LeasedWorker) -> None:
        worker.idle_since = time.monotonic()
        if not worker.timer_armed:
            worker.timer_armed = True
            self.links.reactor.call_later(LEASE_IDLE_TIMEOUT, lambda: self._idle_check(worker))

    def _idle_check(self, worker: LeasedWorker) -> None:
        with self.links.lock:
            worker.timer_armed = False
            if worker.inflight or worker.conn.closed:
                return
            left = worker.idle_since + LEASE_IDLE_TIMEOUT - time.monotonic()
            if left > 0:
                worker.timer_armed = True
                self.links.reactor.call_later(left, lambda: self._idle_check(worker))
                return
            queue = self.queues[worker.key]
            queue.workers.remove(worker)
        self._retire(worker)

    def _retire(self, worker: LeasedWorker) -> None:
        """Hand the lease back and disconnect (the worker is idle)."""
        worker.nm.send(m.ReturnLease(worker.lease_id))
        worker.conn.on_close = None
        worker.conn.close("lease returned")

    def _on_worker_closed(self, conn: Connection, reason: str) -> None:
        worker: LeasedWorker | None = conn.context
        if worker is None:
            return
        links, events = self.links, self.events
        worker.nm.send(m.ReturnLease(worker.lease_id))  # a no-op if the worker died
        failed: list[tuple[TaskRecord, BaseException]] = []
        with links.lock:
            queue = self.queues[worker.key]
            if worker in queue.workers:
                queue.workers.remove(worker)
            again: list[TaskRecord] = []
            # The worker runs its tasks in order: the first was running (unless it retired
            # after a result: then none was).
            running = not worker.retiring
            for record in worker.inflight.values():
                if record.cancelled:
                    failed.append((record, TaskCancelledError(
                        f"task {record.spec.name!r} was cancelled")))
                elif not running:  # queued behind it, never started: resubmitted free
                    again.append(record)
                elif record.spec.attempt < record.max_retries or record.max_retries < 0:
                    record.spec.attempt += 1
                    again.append(record)
                else:
                    failed.append((record, WorkerCrashedError(
                        f"the worker running task {record.spec.name!r} died ({reason}) "
                        f"and its {record.max_retries} retries are used up; see the worker "
                        f"logs in {links.session_dir}/logs")))
                running = False
            queue.tasks.extendleft(reversed(again))  # ahead of the rest, in their order
            worker.inflight.clear()
            worker.solo = 0
            self._pump(worker.key, queue)
        for record, error in failed:
            events.fail_task(record, error)

    # -- cancellation --------------------------------------------------------------------------

    def cancel(self, record: TaskRecord, force: bool, recursive: bool = False) -> bool:
        """Cancel a queued or running task; True if it was queued (failed here)."""
        record.cancelled = True
        for queue in self.queues.values():
            if record in queue.tasks:
                queue.tasks.remove(record)
                return True
        if record.worker is not None:
            worker = record.worker
            worker.nm.send(m.CancelTask(record.spec.task_id, worker.worker_id, force, recursive))
        return record.deps > 0

    def shutdown(self) -> None:
        """Hand every lease back (so its worker is reused, not stopped) and disconnect."""
        for queue in self.queues.values():
            for worker in queue.workers:
                if not worker.inflight:
                    worker.nm.send(m.ReturnLease(worker.lease_id))
                worker.conn.on_close = None
                worker.conn.close("shutdown")
