"""Several rtml nodes on one machine, for tests and experiments (as Ray's ``Cluster``).

    Cluster()  --> Redis + head service + node manager   (the head node)
    add_node() --> another node manager joining the head over TCP
    connect()  --> rtml.init(address=cluster.address) attached to one of the nodes

Each node is its own process group with its own ports, session directory and
store directory, so nodes share nothing through the file system and
every object that moves between them crosses the network path (gRPC pulls).
Nodes die with the process that made them; :meth:`Cluster.shutdown` stops them
and removes their session directories.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtml import cluster, driver, objectstore
from rtml.config import DashboardConfig, NodeConfig, default_object_store_memory
from rtml.session import Session, fresh_session_dir, new_token

__all__ = ["Cluster", "ClusterNode"]

DEFAULT_STORE_BYTES = 256 << 20


@dataclass
class ClusterNode:
    """One node of a :class:`Cluster`."""

    started: cluster.StartedNode
    is_head: bool

    @property
    def node_id(self) -> str:
        """The node's id in hex, as in ``rtml.nodes()`` and NodeAffinitySchedulingStrategy."""
        return self.started.node_id

    @property
    def pgid(self) -> int:
        """The node manager's process group: it, its zygote and its workers."""
        return self.started.procs[-1].pid

    @property
    def session_dir(self) -> str:
        return str(self.started.session.root)

    @property
    def head_pid(self) -> int:
        """The pid of the head service running now (a head node's; its supervisor starts
        a new one, with a new pid, when it dies)."""
        supervisor = self.started.supervisor
        if supervisor is None or supervisor.proc is None:
            raise RuntimeError("this node runs no head service")
        return supervisor.proc.pid


class Cluster:
    """A head node plus any number of extra nodes, all on this machine."""

    def __init__(self, initialize_head: bool = True, connect: bool = False,
                 head_node_args: dict[str, Any] | None = None,
                 node_ip: str = "127.0.0.1") -> None:
        self.token = new_token()
        self.node_ip = node_ip
        self.nodes: list[ClusterNode] = []
        self.head_node: ClusterNode | None = None
        if initialize_head:
            self.head_node = self._start(head_node_args or {}, head=True)
            if connect:
                self.connect()

    @property
    def address(self) -> str:
        """``host:port`` of the head service: pass it to ``rtml.init(address=...)``."""
        if self.head_node is None:
            raise RuntimeError("the cluster has no head node yet; create it with "
                               "Cluster(initialize_head=True)")
        return self.head_node.started.head_address

    def add_node(self, **node_args: Any) -> ClusterNode:
        """Start a node manager that joins the head; returns once the head knows it.

        ``node_args``: ``num_cpus``, ``num_gpus``, ``resources``, ``object_store_memory``,
        ``prestart_workers``, ``node_ip``; for the head node also ``node_timeout_s`` and
        ``include_dashboard`` (default False) with ``dashboard_port`` (default: a free one).
        """
        if self.head_node is not None:
            return self._start(node_args, head=False)
        self.head_node = self._start(node_args, head=True)
        return self.head_node

    def _start(self, args: dict[str, Any], head: bool) -> ClusterNode:
        session = Session(Path(fresh_session_dir()))
        config = NodeConfig(
            str(session.root), self.token, "", float(args.get("num_cpus", 1)),
            float(args.get("num_gpus", 0)), dict(args.get("resources") or {}),
            int(args.get("object_store_memory") or min(DEFAULT_STORE_BYTES,
                                                       default_object_store_memory())),
            node_ip=args.get("node_ip", self.node_ip),
            prestart_workers=int(args.get("prestart_workers", -1)))
        if head:
            dashboard = None
            if args.get("include_dashboard"):
                dashboard = DashboardConfig(port=int(args.get("dashboard_port", 0)))
            started = cluster.start_head_node(session, self.token, config,
                                              die_with_parent=True, own_group=True,
                                              node_timeout=args.get("node_timeout_s"),
                                              dashboard=dashboard)
        else:
            started = cluster.join_node(session, self.token, config, self.address,
                                        die_with_parent=True, own_group=True)
        node = ClusterNode(started, head)
        self.nodes.append(node)
        return node

    def connect(self, node: ClusterNode | None = None, **init_args: Any) -> Any:
        """``rtml.init`` a driver in this process, attached to ``node`` (default: the head)."""
        target = node or self.head_node
        assert target is not None
        return driver.init(address=self.address, token=self.token, _node_id=target.node_id,
                        **init_args)

    def remove_node(self, node: ClusterNode, allow_graceful: bool = True) -> None:
        """Stop a node: SIGTERM (it stops its workers and frees its objects), or SIGKILL
        to its whole process group, as if the machine died."""
        if allow_graceful:
            node.started.stop()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pgid, signal.SIGKILL)
            for proc in node.started.procs:
                proc.wait()
            objectstore.remove_store_dir(objectstore.store_dir_of(node.node_id))
        self.nodes.remove(node)
        if node is self.head_node:
            self.head_node = None
        shutil.rmtree(node.session_dir, ignore_errors=True)

    def shutdown(self) -> None:
        """Disconnect a driver of this process, then stop every node (the head last)."""
        if driver.is_initialized():
            driver.shutdown()
        for node in sorted(self.nodes, key=lambda n: n.is_head):
            self.remove_node(node)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

