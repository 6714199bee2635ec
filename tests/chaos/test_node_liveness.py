"""Node liveness is the user's to set (issue 16, item 7): ``--node-timeout-s`` on
``rtml start --head``, ``_node_timeout_s`` for ``init``, ``node_timeout_s`` for the
head of an ``rtml.testing.Cluster``; a node whose process is SIGKILLed is dead at once
(its connection to the head closes), one that hangs after the timeout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import test_cli

import rtml
from rtml.testing import Cluster


def alive_of(node_id: str) -> bool:
    return {n["NodeID"]: n["Alive"] for n in rtml.nodes()}[node_id]


def seconds_until_dead(node_id: str, limit: float = 30.0) -> float:
    start = time.monotonic()
    while alive_of(node_id):
        assert time.monotonic() - start < limit, "the node was never declared dead"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_hung_node_is_dead_after_the_timeout_given_and_a_killed_one_at_once() -> None:
    if rtml.is_initialized():
        rtml.shutdown()
    cluster = Cluster(head_node_args={"num_cpus": 1, "node_timeout_s": 1.5})
    try:
        hung = cluster.add_node(num_cpus=1)
        killed = cluster.add_node(num_cpus=1)
        cluster.connect()
        os.killpg(hung.pgid, signal.SIGSTOP)  # its connection stays open: heartbeats stop
        took = seconds_until_dead(hung.node_id)
        assert 1.0 <= took <= 5.0  # the default (10 s) would not be reached
        os.killpg(hung.pgid, signal.SIGKILL)
        os.killpg(killed.pgid, signal.SIGKILL)
        assert seconds_until_dead(killed.node_id) < 1.0
        cluster.remove_node(hung, allow_graceful=False)
        cluster.remove_node(killed, allow_graceful=False)
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("value", [0, -1.0, "soon", True])
def test_init_refuses_a_node_timeout_that_is_not_positive_seconds(value) -> None:
    with pytest.raises((TypeError, ValueError), match="_node_timeout_s"):
        rtml.init(_node_timeout_s=value)
    assert not rtml.is_initialized()


def test_the_cli_flag_is_checked_and_is_the_heads(tmp_path: Path) -> None:
    bad = test_cli.rtml("start", "--head", "--node-timeout-s", "0", "--session-dir",
                        str(tmp_path / "s"), cwd=tmp_path)
    assert bad.returncode != 0 and "--node-timeout-s must be > 0" in bad.stderr
    joining = test_cli.rtml("start", "--address", "127.0.0.1:1", "--node-timeout-s", "3",
                            "--session-dir", str(tmp_path / "t"), cwd=tmp_path)
    assert joining.returncode != 0 and "rtml start --head" in joining.stderr
