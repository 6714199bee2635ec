"""The head service's metrics: nodes and their heartbeats, the cluster's tasks as the
node managers report them, actors, jobs and spilled lease requests.

    NodeHeartbeat --heartbeat(msg)--> received count per node; its workers' task counters
    LeasePlaced (a spill placed) --placed()--> count
    scrape --> HeadCollector reads the node table, the actor directory, the jobs, the
               global scheduler's pending requests (on the head's loop: no lock)

Heartbeats are counted in a dict per node (every 0.5 s per node); nothing else is done
on any path but for a scrape.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rtml.head.actors import ActorDirectory
from rtml.ids import JobID, NodeID
from rtml.rpc import messages as m
from rtml.scheduler.placement import GlobalScheduler


@dataclass(frozen=True)
class HeadParts:
    """What a scrape reads of the head service (its own objects, shared)."""

    nodes: Mapping[NodeID, Any]  # node id -> the service's NodeState (.alive, .view)
    actors: ActorDirectory
    jobs: Mapping[JobID, Any]  # job id -> its driver's connection
    sched: GlobalScheduler


class HeadMetrics:
    """Counters of one head service, and the registry a scrape reads."""

    def __init__(self) -> None:
        self.heartbeats: Counter[bytes] = Counter()  # by node
        self.node_tasks: dict[bytes, dict[str, int]] = {}  # by node, as its last heartbeat
        self.spills_placed = 0

    def heartbeat(self, msg: m.NodeHeartbeat) -> None:
        self.heartbeats[msg.node_id] += 1
        if msg.tasks is not None:
            self.node_tasks[msg.node_id] = msg.tasks

    def serve(self, head: HeadParts) -> Any:
        """The registry to serve (imports prometheus_client: only a head that serves)."""
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(HeadCollector(head, self))
        return registry


class HeadCollector:
    def __init__(self, head: HeadParts, metrics: HeadMetrics) -> None:
        self.head = head
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        head, mx = self.head, self.metrics
        yield from _nodes(head, mx)
        tasks = CounterMetricFamily("rtml_cluster_tasks", "Tasks and actor calls the nodes' "
                                    "workers began (submitted) and ended, as each node "
                                    "manager last reported", labels=["node", "state"])
        running = GaugeMetricFamily("rtml_cluster_tasks_running", "Tasks and actor calls "
                                    "running, by node", labels=["node"])
        for node_id, counts in mx.node_tasks.items():
            node = node_id.hex()
            for state, count in counts.items():
                tasks.add_metric([node, state], count)
            running.add_metric([node], max(0, counts.get("submitted", 0) -
                                           counts.get("finished", 0) - counts.get("failed", 0)))
        yield tasks
        yield running
        actors = GaugeMetricFamily("rtml_actors", "Actors by state", labels=["state"])
        for state, count in Counter(a.state.value for a in head.actors.actors.values()).items():
            actors.add_metric([state], count)
        yield actors
        yield GaugeMetricFamily("rtml_jobs_running", "Jobs whose driver is connected",
                                value=len(head.jobs))
        yield GaugeMetricFamily("rtml_spilled_lease_requests", "Lease requests spilled to "
                                "the head that no node can take yet",
                                value=len(head.sched.pending))
        yield CounterMetricFamily("rtml_spilled_leases_placed", "Spilled lease requests the "
                                  "head placed on a node", value=mx.spills_placed)


def _nodes(head: HeadParts, mx: HeadMetrics) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    alive = GaugeMetricFamily("rtml_node_alive", "1 while the head counts the node alive",
                              labels=["node", "address"])
    age = GaugeMetricFamily("rtml_node_heartbeat_age_seconds", "Seconds since the node's "
                            "last heartbeat", labels=["node"])
    received = CounterMetricFamily("rtml_heartbeats_received", "Heartbeats received",
                                   labels=["node"])
    now = time.monotonic()
    for node_id, node in head.nodes.items():
        node_hex = node_id.hex()
        alive.add_metric([node_hex, node.view.address], 1 if node.alive else 0)
        if node.alive:
            age.add_metric([node_hex], now - node.view.last_heartbeat)
        received.add_metric([node_hex], mx.heartbeats[node_id])
    yield alive
    yield age
    yield received
