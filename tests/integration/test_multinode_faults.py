"""Nodes that die, stop heartbeating, or should never have been let in."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_multinode import Counter, big_array, node_of, pinned, sleepy_node

import rtml
from rtml import cluster as cluster_mod
from rtml.config import NodeConfig
from rtml.exceptions import ObjectLostError, RtmlSystemError
from rtml.rpc import messages as m
from rtml.rpc.client import connect_socket, handshake, make_hello
from rtml.session import Session, fresh_session_dir
from rtml.testing import Cluster, ClusterNode


@pytest.fixture
def two_nodes(start_nodes: Callable[..., Any]) -> tuple[Cluster, ClusterNode]:
    """A head (1 CPU) and node2 (1 CPU); the head declares a node dead after 1.5 s silent."""
    cluster, (node2,) = start_nodes(1, 1)
    return cluster, node2


def _alive(node: ClusterNode) -> bool:
    return {n["NodeID"]: n["Alive"] for n in rtml.nodes()}[node.node_id]


def _until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def test_a_task_on_a_killed_node_is_retried_on_another(two_nodes) -> None:
    cluster, node2 = two_nodes
    ref = sleepy_node.options(scheduling_strategy=pinned(node2, soft=True)).remote(2.0)
    time.sleep(1.0)  # it is running on node2
    cluster.remove_node(node2, allow_graceful=False)
    assert cluster.head_node is not None
    assert rtml.get(ref, timeout=30) == cluster.head_node.node_id
    _until(lambda: not _alive(node2), 10, "the killed node to be marked dead")


def test_an_object_whose_only_copy_died_raises_object_lost(two_nodes) -> None:
    cluster, node2 = two_nodes
    ref = big_array.options(scheduling_strategy=pinned(node2)).remote(1 << 20)
    ready, _ = rtml.wait([ref], timeout=30, fetch_local=False)  # no copy here
    assert ready == [ref]
    cluster.remove_node(node2, allow_graceful=False)
    with pytest.raises(ObjectLostError, match=ref.hex()):
        rtml.get(ref, timeout=30)


def test_a_silent_node_is_declared_dead_and_its_work_moves(two_nodes) -> None:
    cluster, node2 = two_nodes
    ref = sleepy_node.options(scheduling_strategy=pinned(node2, soft=True)).remote(1.0)
    time.sleep(0.5)
    os.killpg(node2.pgid, signal.SIGSTOP)  # alive but silent, like a partitioned machine
    try:
        _until(lambda: not _alive(node2), 10, "the silent node to be marked dead")
        assert cluster.head_node is not None
        assert rtml.get(ref, timeout=30) == cluster.head_node.node_id
    finally:
        os.killpg(node2.pgid, signal.SIGCONT)
    # Told it is dead, the node stops itself when it wakes up.
    node2.started.procs[-1].wait(timeout=15)
    assert rtml.get(node_of.remote()) == cluster.head_node.node_id


def test_an_actor_on_a_dead_node_restarts_elsewhere(two_nodes) -> None:
    cluster, node2 = two_nodes
    # max_task_retries: a call may be written to the actor's socket before its death is
    # seen here (its worker dies a moment after the node manager); it is retried then.
    counter = Counter.options(max_restarts=1, max_task_retries=1, num_cpus=0,
                              scheduling_strategy=pinned(node2, soft=True)).remote()
    assert rtml.get(counter.node.remote()) == node2.node_id
    assert rtml.get(counter.add.remote(5)) == 5
    cluster.remove_node(node2, allow_graceful=False)
    assert cluster.head_node is not None
    assert rtml.get(counter.node.remote(), timeout=30) == cluster.head_node.node_id
    assert rtml.get(counter.add.remote(1), timeout=30) == 1  # state reset by the restart


def test_joining_with_a_wrong_token_is_refused_and_changes_nothing(two_nodes) -> None:
    cluster, _ = two_nodes
    before = len(rtml.nodes())
    session = Session(Path(fresh_session_dir()))
    config = NodeConfig(str(session.root), "not-the-token", "", 1.0, object_store_memory=1 << 26)
    with pytest.raises(RtmlSystemError, match="refused this node"):
        cluster_mod.join_node(session, "not-the-token", config, cluster.address,
                              die_with_parent=True)
    shutil.rmtree(session.root)
    assert len(rtml.nodes()) == before
    assert rtml.get(node_of.remote()) in {n["NodeID"] for n in rtml.nodes()}


def test_an_incompatible_protocol_version_is_refused(two_nodes) -> None:
    cluster, _ = two_nodes
    hello = make_hello("node", b"\x01" * 16)
    hello.version = m.PROTOCOL_VERSION + 1
    sock = connect_socket(cluster.address, timeout=5)
    try:
        with pytest.raises(Exception, match="version"):
            handshake(sock, cluster.token, hello)
    finally:
        sock.close()
    assert all(n["Alive"] for n in rtml.nodes())


def test_a_node_that_cannot_reach_the_head_exits_naming_the_address() -> None:
    session = Session(Path(fresh_session_dir()))
    config = NodeConfig(str(session.root), "t" * 32, "", 1.0, object_store_memory=1 << 26)
    with pytest.raises(RtmlSystemError, match="cannot reach the head at 127.0.0.1:9"):
        cluster_mod.join_node(session, "t" * 32, config, "127.0.0.1:9", die_with_parent=True)
    shutil.rmtree(session.root)
