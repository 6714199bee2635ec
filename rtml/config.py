"""Configuration, resolved once at each entry point and passed down frozen.

Precedence: defaults < ``RTML_*`` environment < command-line flags / init kwargs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from rtml.ids import ClientID, WorkerID

INLINE_MAX = 100 * 1024
"""Values up to this many bytes travel inline and live in the owner's memory."""

TOKEN_ENV = "RTML_CLUSTER_TOKEN"
"""Children get the cluster token in their environment, never on their command line."""
REDIS_PASSWORD_ENV = "RTML_REDIS_PASSWORD"
"""... and the password of a Redis of the user's (``--redis-address``) the same way."""

JOB_RUNTIME_ENV = "RTML_RUNTIME_ENV"
"""A submitted job's runtime_env (JSON), set by the head for its entrypoint: the driver's
``init`` takes it under its own ``runtime_env``."""

DIE_WITH_PARENT_ENV = "RTML_DIE_WITH_PARENT"
"""A daemon launched with this set to its launcher's pid dies with the launcher."""

HEARTBEAT_INTERVAL = 0.5
DEFAULT_NODE_TIMEOUT = 10.0
"""Seconds without a heartbeat after which the head declares a node dead (RTML_NODE_TIMEOUT_S)."""
DEFAULT_HEAD_TIMEOUT = 60.0
"""Seconds node managers, drivers and workers wait for a head service that went away to be
back (RTML_HEAD_TIMEOUT_S; Ray's gcs_rpc_server_reconnect_timeout_s is 60 too): meanwhile
what needs the head waits, then fails."""


DEFAULT_TASK_RECORDS_KEPT = 100_000
"""Task records the control plane keeps (RTML_TASK_RECORDS_KEPT), the newest; the head
trims older ones every TRIM_INTERVAL s (Ray keeps about 100,000 task events too)."""
TRIM_INTERVAL = 5.0


def default_task_records_kept() -> int:
    """RTML_TASK_RECORDS_KEPT, else the default. Raises ValueError naming a bad value."""
    text = os.environ.get("RTML_TASK_RECORDS_KEPT", str(DEFAULT_TASK_RECORDS_KEPT))
    try:
        kept = int(text)
    except ValueError:
        kept = 0
    if kept < 1:
        raise ValueError(f"RTML_TASK_RECORDS_KEPT={text!r}: give a whole number of task "
                         f"records >= 1 (default {DEFAULT_TASK_RECORDS_KEPT})")
    return kept


def default_head_timeout() -> float:
    return float(os.environ.get("RTML_HEAD_TIMEOUT_S", DEFAULT_HEAD_TIMEOUT))

ZYGOTE_REAP = "reap"
"""The key of the node manager's request (``{"reap": true}``) that its worker zygote end
what exited workers left running; nothing is written back for it."""
LEASE_IDLE_TIMEOUT = 0.05
"""Seconds a leased worker may sit idle before the owner hands it back."""
STORE_FULL_TIMEOUT = 10.0
"""Seconds a new object waits for room in a full object store (objects being freed,
spilled or restored meanwhile) before its ``put`` or task fails with ObjectStoreFullError."""
STORE_RESOURCE = "object_store_memory"
"""The resource that names a node's shared-memory capacity; its available amount is the
store's free bytes."""


def default_object_store_memory() -> int:
    """30% of RAM, capped at 8 GiB and at 80% of /dev/shm's free space."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    st = os.statvfs("/dev/shm")
    shm_free = st.f_bavail * st.f_frsize
    return int(min(total * 0.3, 8 << 30, shm_free * 0.8))


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node manager needs to start."""

    session_dir: str
    token: str
    head_address: str  # "unix:/path" or "host:port" of the head service
    num_cpus: float
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    object_store_memory: int = 0
    node_ip: str = "127.0.0.1"
    port: int = 0
    prestart_workers: int = -1  # -1: one per CPU
    head_timeout: float = field(default_factory=default_head_timeout)
    tls_cert: str = ""  # TLS on its TCP listeners and its workers' (rtml.rpc.tls); "": none
    tls_key: str = ""
    metrics_port: int = -1  # /metrics (rtml.metrics): -1 not served, 0 a port the kernel picks
    metrics_host: str = ""  # where it is served: "" loopback; another address needs the token

    def total_resources(self) -> dict[str, float]:
        total = {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus),
                 "memory": float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
                 STORE_RESOURCE: float(self.object_store_memory),
                 f"node:{self.node_ip}": 1.0}
        total.update({k: float(v) for k, v in self.resources.items()})
        return total

    def to_json(self) -> str:
        """The config without its token (which travels in ``TOKEN_ENV``)."""
        return json.dumps({**self.__dict__, "token": ""})

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        return cls(**{**json.loads(text), "token": os.environ[TOKEN_ENV]})


@dataclass(frozen=True)
class HeadConfig:
    """Everything the head service needs to start."""

    session_dir: str
    token: str
    redis_host: str
    redis_port: int
    host: str = "127.0.0.1"
    port: int = 0
    listen_fd: int = -1  # a socket bound by the parent (so its address is known early)
    node_timeout: float = field(default_factory=lambda: float(
        os.environ.get("RTML_NODE_TIMEOUT_S", DEFAULT_NODE_TIMEOUT)))
    redis_pid: int = 0  # the Redis the head supervisor keeps running (0: none of ours)
    redis_user: str = ""  # a Redis of the user's: its ACL user and password (rtml's own
    redis_password: str = ""  # has none: RedisAddress.login derives its login)
    redis_tls: str = ""  # a rediss:// one's TLS settings (address.tls_text); "": plain TCP
    task_records_kept: int = field(default_factory=default_task_records_kept)
    tls_cert: str = ""  # TLS on its TCP listener (rtml.rpc.tls); "": none
    tls_key: str = ""
    dashboard_fd: int = -1  # the dashboard's listening socket, bound by the launcher; -1: none
    metrics_port: int = -1  # as NodeConfig's
    metrics_host: str = ""

    def to_json(self) -> str:
        """The config without its secrets (which travel in ``TOKEN_ENV`` and
        ``REDIS_PASSWORD_ENV``)."""
        return json.dumps({**self.__dict__, "token": "", "redis_password": ""})

    @classmethod
    def from_json(cls, text: str) -> HeadConfig:
        return cls(**{**json.loads(text), "token": os.environ[TOKEN_ENV],
                      "redis_password": os.environ.get(REDIS_PASSWORD_ENV, "")})


DEFAULT_DASHBOARD_PORT = 8265
"""Ray's dashboard port, which users coming from Ray look for."""


@dataclass(frozen=True)
class DashboardConfig:
    """Where the head's dashboard listens (``--dashboard-host`` / ``--dashboard-port``,
    ``init(dashboard_host=, dashboard_port=)``). ``any_port``: when ``port`` is taken,
    listen on a free one instead (and say so) rather than fail."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_DASHBOARD_PORT
    any_port: bool = False


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to start; its node manager writes it for each one."""

    session_dir: str
    token: str
    nm_address: str  # "unix:/path" of its node manager
    head_address: str
    node_ip: str  # where it listens for owners on other nodes
    worker_id: WorkerID
    runtime_env: str = ""  # the env it is started for (rtml.worker.runtime_env); "" none
    tls_cert: str = ""  # TLS on its TCP listener (its node's certificate); "": none
    tls_key: str = ""

    def to_json(self) -> str:
        """The config without its token (which travels in ``TOKEN_ENV``)."""
        return json.dumps({**self.__dict__, "token": "", "worker_id": self.worker_id.hex()})

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        fields = json.loads(text)
        return cls(**{**fields, "token": os.environ[TOKEN_ENV],
                      "worker_id": WorkerID(ClientID(bytes.fromhex(fields["worker_id"])))})
