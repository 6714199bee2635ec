"""Two nodes in separate network namespaces joined by a veth pair: different addresses,
no loopback shortcut between them. Needs root and ``ip netns`` (CI runs as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import CLI_TIMEOUT, _env, _stop

HEAD_IP, NODE_IP = "10.231.7.1", "10.231.7.2"
PORT = "6390"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and the `ip` tool to create network namespaces")
    head_ns, node_ns = f"rtml-h{os.getpid()}", f"rtml-n{os.getpid()}"
    veth = f"rv{os.getpid() % 100000}"
    made = _ip("netns", "add", head_ns)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
    try:
        steps = [("netns", "add", node_ns),
                 ("link", "add", f"{veth}a", "type", "veth", "peer", "name", f"{veth}b"),
                 ("link", "set", f"{veth}a", "netns", head_ns),
                 ("link", "set", f"{veth}b", "netns", node_ns),
                 ("-n", head_ns, "addr", "add", f"{HEAD_IP}/24", "dev", f"{veth}a"),
                 ("-n", node_ns, "addr", "add", f"{NODE_IP}/24", "dev", f"{veth}b"),
                 ("-n", head_ns, "link", "set", f"{veth}a", "up"),
                 ("-n", node_ns, "link", "set", f"{veth}b", "up"),
                 ("-n", head_ns, "link", "set", "lo", "up"),
                 ("-n", node_ns, "link", "set", "lo", "up")]
        for step in steps:
            result = _ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        yield head_ns, node_ns
    finally:
        _ip("netns", "del", head_ns)
        _ip("netns", "del", node_ns)


def _in(ns: str, *argv: str, cwd: Path, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], cwd=cwd, env=env or _env(),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)


DRIVER = f"""
import numpy as np
import rtml
rtml.init(address="{HEAD_IP}:{PORT}")

@rtml.remote(resources={{"far": 1}})
def make():
    return rtml.get_runtime_context().get_node_id(), np.arange(2_000_000, dtype=np.int64)

@rtml.remote(resources={{"far": 1}})
def total(a):
    return int(a.sum())

node, array = rtml.get(make.remote())
assert np.array_equal(array, np.arange(2_000_000, dtype=np.int64))
local = rtml.put(np.ones(3_000_000, dtype=np.int64))
print(node, int(array.sum()), rtml.get(total.remote(local)), len(rtml.nodes()))
rtml.shutdown()
"""


def test_nodes_in_separate_network_namespaces(namespaces: tuple[str, str],
                                              tmp_path: Path) -> None:
    head_ns, node_ns = namespaces
    cli = [sys.executable, "-m", "rtml.cli.main"]
    head_dir, node_dir = tmp_path / "head", tmp_path / "node"
    head = _in(head_ns, *cli, "start", "--head", "--port", PORT, "--node-ip-address",
               HEAD_IP, "--num-cpus", "1", "--session-dir", str(head_dir), cwd=tmp_path)
    try:
        assert head.returncode == 0, head.stderr
        token = next(line.split("=", 1)[1] for line in head.stdout.splitlines()
                     if line.startswith("RTML_TOKEN="))
        node = _in(node_ns, *cli, "start", "--address", f"{HEAD_IP}:{PORT}",
                   "--node-ip-address", NODE_IP, "--num-cpus", "1", "--resources",
                   '{"far": 1}', "--session-dir", str(node_dir), cwd=tmp_path,
                   env=_env(RTML_TOKEN=token))
        try:
            assert node.returncode == 0, node.stderr
            node_id = next(line.split("(node ")[1].rstrip(")") for line in
                           node.stdout.splitlines() if "(node " in line)
            driver = _in(head_ns, sys.executable, "-c", DRIVER, cwd=tmp_path,
                         env=_env(RTML_TOKEN=token))
            assert driver.returncode == 0, driver.stderr
            expected = sum(range(2_000_000))
            assert driver.stdout.split() == [node_id, str(expected), "3000000", "2"]
        finally:
            _stop(node_dir, tmp_path)
    finally:
        _stop(head_dir, tmp_path)
