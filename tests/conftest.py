"""Shared fixtures: a 2-CPU embedded cluster per module, special-init clusters, leak checks.

``rtml.init`` is per process, so only one cluster can be up at a time:

* ``cluster`` -- the module's 2-CPU cluster. It is started once per module and
  torn down at module end; if a test of the module shut it down (or replaced it
  with a special one), the next test that asks for ``cluster`` starts it again.
* ``start_cluster(**init_kwargs)`` -- a function-scoped factory for tests that
  need their own ``init`` arguments: it shuts down whatever is up, starts a
  cluster with those arguments, and shuts it down after the test.

Leak checks: after every module (once its cluster is shut down) and at the end
of the session, no child process of pytest may remain and no store directory
(``/dev/shm/rtml-<node id>``) of a node started by this run may remain.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

SHM_GLOB = "/dev/shm/rtml-*"
EXIT_GRACE_S = 3.0

# The integration modules define their remote functions at module level; workers import them
# by name, finding them through the driver's sys.path[0] (API.md). Under pytest sys.path[0] is
# whichever test directory was collected last, so the drivers here put the integration
# directory first, as ``python tests/integration/script.py`` would.
INTEGRATION_DIR = str(Path(__file__).parent / "integration")

_shm_at_start: set[str] = set()
_node_ids: set[str] = set()  # of every node this run started


def _shm_files() -> set[str]:
    return set(glob.glob(SHM_GLOB))


def record_nodes() -> None:
    """Remember the ids of the nodes of the current cluster (if any)."""
    import rtml
    if not rtml.is_initialized():
        return
    try:
        for node in rtml.nodes():
            _node_ids.add(str(node["NodeID"]))
    except Exception:  # noqa: BLE001 - a broken cluster is reported by the test itself
        pass


def _leaked_shm() -> set[str]:
    """Store directories made during this run by nodes this run started."""
    new = _shm_files() - _shm_at_start
    return {p for p in new if os.path.basename(p).removeprefix("rtml-") in _node_ids}


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


def assert_no_leaks(where: str) -> None:
    """Wait up to EXIT_GRACE_S for children and segments to go, then assert they did."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while True:
        children = _live_children()
        shm = _leaked_shm()
        if (not children and not shm) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    described = []
    for child in children:
        try:
            described.append(f"pid={child.pid} {' '.join(child.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            pass
    for child in children:  # do not let one leak cascade into the next module
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    assert not described, f"child processes left after {where}: {described}"
    assert not shm, f"object store directories left after {where}: {sorted(shm)[:10]}"


def _shutdown() -> None:
    import rtml
    record_nodes()
    if rtml.is_initialized():
        rtml.shutdown()


def _driver_sys_path() -> None:
    if sys.path[0] != INTEGRATION_DIR:
        sys.path.insert(0, INTEGRATION_DIR)


def _ensure_default_cluster() -> None:
    import rtml
    if not rtml.is_initialized():
        _driver_sys_path()
        rtml.init(num_cpus=2)
        record_nodes()


@pytest.fixture(scope="session", autouse=True)
def _session_leak_check() -> Iterator[None]:
    _shm_at_start.update(_shm_files())
    yield
    _shutdown()
    assert_no_leaks("the test session")


@pytest.fixture(scope="module", autouse=True)
def _module_leak_check(request: pytest.FixtureRequest) -> Iterator[None]:
    # Autouse module fixtures are set up before, hence torn down after, ``_module_cluster``.
    yield
    _shutdown()
    assert_no_leaks(f"module {request.module.__name__}")


@pytest.fixture(autouse=True)
def _record_nodes_after_test() -> Iterator[None]:
    yield
    record_nodes()


@pytest.fixture(scope="module")
def _module_cluster() -> Iterator[None]:
    _ensure_default_cluster()
    yield
    _shutdown()


@pytest.fixture
def cluster(_module_cluster: None) -> Iterator[None]:
    """The module's embedded 2-CPU cluster (restarted if a test took it down)."""
    _ensure_default_cluster()
    yield


@pytest.fixture
def start_cluster() -> Iterator[Callable[..., Any]]:
    """Factory: ``start_cluster(**init_kwargs)`` replaces any running cluster for one test."""
    import rtml

    def start(**kwargs: Any) -> Any:
        _shutdown()
        _driver_sys_path()
        ctx = rtml.init(**kwargs)
        record_nodes()
        return ctx

    yield start
    _shutdown()


@pytest.fixture
def start_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Factory: ``start_nodes(head_cpus, *node_cpus)`` -> ``(cluster, [nodes])``: an
    ``rtml.testing.Cluster`` whose head declares a silent node dead after 1.5 s, with a
    driver of this process connected; shut down after the test."""
    import rtml
    from rtml.testing import Cluster

    started: list[Any] = []

    def start(head_cpus: float, *node_cpus: float) -> tuple[Any, list[Any]]:
        if rtml.is_initialized():
            rtml.shutdown()
        monkeypatch.setenv("RTML_NODE_TIMEOUT_S", "1.5")
        cluster = Cluster(head_node_args={"num_cpus": head_cpus})
        started.append(cluster)
        nodes = [cluster.add_node(num_cpus=cpus) for cpus in node_cpus]
        cluster.connect()
        return cluster, nodes

    yield start
    for cluster in started:
        cluster.shutdown()


@pytest.fixture(scope="module")
def plain_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Redis as a user might run one, not rtml's fenced one: the server binary rtml
    runs, whose default user logs in with the returned process's password and may run
    anything (CLIENT KILL, ACL SETUSER), as tests of the client and of a user's Redis
    need. Stopped at module end."""
    import secrets
    import socket
    import subprocess

    from rtml.control_plane import RedisProcess, find_redis_server
    from rtml.control_plane.resp import RespClient

    data = tmp_path_factory.mktemp("plain-redis")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    password = secrets.token_hex(16)
    log_path = str(data / "redis.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(data), "--requirepass", password],
            stdout=log, stderr=subprocess.STDOUT)
    server = RedisProcess("127.0.0.1", port, password, proc, log_path, user="")
    deadline = time.monotonic() + 20
    while True:
        client = RespClient("127.0.0.1", port, password, connect_timeout=1.0)
        try:
            if client.execute("PING") == b"PONG":
                break
        except Exception:  # noqa: BLE001 - not up yet
            assert time.monotonic() < deadline and proc.poll() is None, "no plain Redis"
            time.sleep(0.05)
        finally:
            client.close()
    yield server
    server.stop()
