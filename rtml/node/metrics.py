"""The node manager's metrics: what it counts where the events already happen, and the
families a scrape of ``/metrics`` reads from them (``rtml.metrics`` serves them).

    RequestLease --lease_asked--> t0   Grant --lease_granted--> lease wait histogram, and a
                                                     LeaseGranted event (the timeline)
    pull done --pulled--> transfers, pull latency histogram, an ObjectPulled event
    heartbeat --drain_events()--> the control plane's event stream (rtml timeline)
    spill / restore --> bytes counters        heartbeat --> CountTasks to each worker
    worker --TaskCounts--> its counters (kept once it exits)  --> rtml_tasks_total{state}
    scrape --> NodeCollector reads the scheduler, the lease router, the store, the pool

Nothing here runs per task: leases are per worker and burst, not per task, and the
workers count their own tasks in plain integers, asked for them once a heartbeat (0.5 s)
only while metrics are served (``enabled``; else no registry, no histogram).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rtml.ids import ClientID, NodeID, ObjectID
from rtml.node.leases import LeaseRouter
from rtml.node.workers import WorkerProc
from rtml.objectstore.store import StoreCore
from rtml.rpc import messages as m
from rtml.scheduler.local import LocalScheduler

EVENTS_KEPT = 10_000
"""Timeline events a node keeps between two heartbeats (more are dropped, counted)."""
TASK_STATES = ("submitted", "finished", "failed")
"""What the node's workers count: calls begun ("submitted" to a worker), and those that
ended with a value or an error."""


class NodeMetrics:
    """Counters and histograms of one node manager, and the registry a scrape reads."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.asked: dict[tuple[int, int], float] = {}  # (client, req id) -> when asked
        self.events: list[dict[str, Any]] = []  # for the timeline, until the next heartbeat
        self.events_dropped = 0
        self.leases_granted = 0
        self.heartbeats_sent = 0
        self.pulls = 0
        self.pulled_bytes = 0
        self.pull_failures = 0
        self.spilled_bytes = 0
        self.restored_bytes = 0
        self.worker_tasks: dict[bytes, tuple[int, int, int]] = {}  # live workers' counts
        self.exited_tasks = (0, 0, 0)  # of workers gone: kept, as counters must be
        self.registry: Any = None
        self.lease_wait: Any = None
        self.pull_seconds: Any = None

    def serve(self, parts: NodeParts) -> Any:
        """Build the registry (imports prometheus_client: only a node that serves)."""
        from prometheus_client import CollectorRegistry, Histogram

        from rtml.metrics import LATENCY_BUCKETS

        self.registry = CollectorRegistry(auto_describe=False)
        self.lease_wait = Histogram(
            "rtml_lease_wait_seconds", "Lease requests, from their arrival at this node "
            "manager to the grant of a worker (task dispatch latency)",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self.pull_seconds = Histogram(
            "rtml_object_pull_seconds", "Objects pulled from other nodes, from the start of "
            "the pull to the copy sealed here", buckets=LATENCY_BUCKETS,
            registry=self.registry)
        self.registry.register(NodeCollector(parts, self))
        return self.registry

    # -- events (on the node manager's loop) -------------------------------------------------

    def lease_asked(self, client: Any, req_id: int) -> None:
        self.asked[(id(client), req_id)] = time.time()

    def lease_granted(self, client: Any, req_id: int, worker: WorkerProc,
                      node_id: bytes) -> None:
        self.leases_granted += 1
        asked = self.asked.pop((id(client), req_id), None)
        if asked is None:
            return
        now = time.time()
        if self.lease_wait is not None:
            self.lease_wait.observe(now - asked)
        self._event({"kind": "LeaseGranted", "node_id": node_id, "worker_id": worker.worker_id,
                     "worker_pid": worker.pid, "asked_ts": asked, "granted_ts": now})

    def lease_elsewhere(self, client: Any, req_id: int) -> None:
        """The request was refused, or went to another node."""
        self.asked.pop((id(client), req_id), None)

    def client_gone(self, client: Any) -> None:
        if self.asked:
            gone = id(client)
            self.asked = {key: t for key, t in self.asked.items() if key[0] != gone}

    def pulled(self, object_id: bytes, size: int, started: float, node_id: bytes,
               from_node: bytes) -> None:
        """A pull of ``size`` bytes from ``from_node`` that began at ``started`` (wall
        clock) ended now."""
        now = time.time()
        self.pulls += 1
        self.pulled_bytes += size
        if self.pull_seconds is not None:
            self.pull_seconds.observe(now - started)
        self._event({"kind": "ObjectPulled", "node_id": node_id, "from_node": from_node,
                     "object_id": object_id, "size": size, "start_ts": started,
                     "end_ts": now})

    def _event(self, event: dict[str, Any]) -> None:
        if len(self.events) < EVENTS_KEPT:
            self.events.append(event)
        else:
            self.events_dropped += 1

    def drain_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def task_counts(self, worker_id: bytes, msg: m.TaskCounts) -> None:
        self.worker_tasks[worker_id] = (msg.started, msg.finished, msg.failed)

    def worker_gone(self, worker_id: bytes) -> None:
        counts = self.worker_tasks.pop(worker_id, None)
        if counts is not None:
            self.exited_tasks = _add(self.exited_tasks, counts)

    def tasks(self) -> dict[str, int]:
        """The node's task counters by state (as last reported by its workers)."""
        total = self.exited_tasks
        for counts in self.worker_tasks.values():
            total = _add(total, counts)
        return dict(zip(TASK_STATES, total, strict=True))


def _add(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


@dataclass(frozen=True)
class NodeParts:
    """What a scrape reads of the node manager (its own objects, shared)."""

    sched: LocalScheduler
    leases: LeaseRouter
    workers: Mapping[ClientID, WorkerProc]  # by worker id
    store: StoreCore
    pulls: Mapping[ObjectID, NodeID]  # the object manager's pulls under way


class NodeCollector:
    """Reads the node manager's state at scrape time (on its loop: no lock needed)."""

    def __init__(self, nm: NodeParts, metrics: NodeMetrics) -> None:
        self.nm = nm
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        nm, mx = self.nm, self.metrics
        tasks = mx.tasks()
        family = CounterMetricFamily("rtml_tasks", "Tasks and actor calls this node's "
                                     "workers began (submitted) and ended", labels=["state"])
        for state, count in tasks.items():
            family.add_metric([state], count)
        yield family
        yield GaugeMetricFamily("rtml_tasks_running", "Tasks and actor calls running on "
                                "this node's workers", value=max(0, tasks["submitted"] -
                                                                 tasks["finished"] -
                                                                 tasks["failed"]))
        queues = GaugeMetricFamily("rtml_lease_requests", "Lease requests waiting: queued "
                                   "here, or spilled to the head", labels=["where"])
        queues.add_metric(["queued"], len(nm.sched.pending))
        queues.add_metric(["spilled"], len(nm.leases.spilling))
        yield queues
        yield CounterMetricFamily("rtml_leases_granted", "Worker leases granted here",
                                  value=mx.leases_granted)
        yield _workers(nm)
        yield from _store(nm, mx)
        yield CounterMetricFamily("rtml_object_pulls", "Objects pulled from other nodes",
                                  value=mx.pulls)
        yield CounterMetricFamily("rtml_object_pulled_bytes", "Bytes pulled from other "
                                  "nodes", value=mx.pulled_bytes)
        yield CounterMetricFamily("rtml_object_pull_failures", "Pulls that failed (the "
                                  "object lost, its node dead)", value=mx.pull_failures)
        yield GaugeMetricFamily("rtml_object_pulls_in_flight", "Pulls under way",
                                value=len(nm.pulls))
        yield CounterMetricFamily("rtml_heartbeats_sent", "Heartbeats sent to the head",
                                  value=mx.heartbeats_sent)


def _workers(nm: NodeParts) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily("rtml_workers", "This node's worker processes by state",
                               labels=["state"])
    sched = nm.sched
    actors = sum(1 for w in nm.workers.values() if w.actor_id and not w.gone)
    family.add_metric(["idle"], len(sched.idle))
    family.add_metric(["busy"], len(sched.lease_of_worker))
    family.add_metric(["starting"], sched.starting + sum(sched.env_starting.values()))
    family.add_metric(["actor"], actors)
    return family


def _store(nm: NodeParts, mx: NodeMetrics) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stats = nm.store.stats()
    store = GaugeMetricFamily("rtml_object_store_bytes", "This node's object store: bytes "
                              "in shared memory, spilled to disk, and its capacity",
                              labels=["kind"])
    store.add_metric(["used"], stats["used_bytes"])
    store.add_metric(["spilled"], stats["spilled_bytes"])
    store.add_metric(["capacity"], stats["capacity"])
    yield store
    yield GaugeMetricFamily("rtml_object_store_objects", "Objects in this node's store",
                            value=stats["num_objects"])
    yield CounterMetricFamily("rtml_object_spilled_bytes", "Bytes spilled to disk to make "
                              "room", value=mx.spilled_bytes)
    yield CounterMetricFamily("rtml_object_restored_bytes", "Bytes restored from disk",
                              value=mx.restored_bytes)
