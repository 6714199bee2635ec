"""Reading any node's logs from anywhere: which file holds a task's, an actor's, a
worker's or a daemon's log, and its text, asked of that node's manager.

    LogReader(plane, token)
        locate(task= | actor= | worker= | pid= | name=, node=)  -> [LogSource(node, file)]
            task   -> its record (control plane): node, worker pid -> the worker's files
            actor  -> its record: node -> the files of the worker that ran it (alive or not)
            worker -> files named worker-<id prefix>...      name -> that file
        files(node)  --ListLogs-->  the node manager --> LogFiles (worker files with pids)
        read / tail / follow(node, file)  --ReadLog(offset, max)--> LogChunk

Each question is one authenticated connection to the node manager's TCP port (the
CLI's and a dashboard's needs: a few a second while following). Blocking; an asyncio
caller runs it in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rtml.control_plane import ControlPlane
from rtml.exceptions import LogNotFoundError, ProtocolError, RtmlSystemError
from rtml.ids import new_client_id
from rtml.logs.files import MAX_CHUNK
from rtml.rpc import messages as m
from rtml.rpc.client import make_hello, request

DAEMON_FILES = {"head": "head.log", "node-manager": "node_manager.log",
                "node_manager": "node_manager.log", "supervisor": "supervisor.log"}
"""Daemon names ``rtml logs NAME`` takes, and their files."""
FOLLOW_INTERVAL = 0.5
"""Seconds between reads of a followed file that has not grown (`rtml logs -f`, the
dashboard)."""
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class LogSource:
    """One log file on one node."""

    node_id: str  # hex
    address: str  # its node manager's host:port
    name: str


class LogReader:
    """Finds and reads log files on the cluster's nodes (see the module's diagram)."""

    def __init__(self, plane: ControlPlane, token: str) -> None:
        self.plane = plane
        self.token = token

    def nodes(self, node: str = "") -> list[dict[str, Any]]:
        """The alive nodes (``node``: those whose id starts with it). Raises
        LogNotFoundError naming the alive ones when none matches."""
        alive = [n for n in self.plane.list_nodes() if n["Alive"]]
        chosen = [n for n in alive if n["NodeID"].startswith(node.lower())]
        if not chosen:
            ids = ", ".join(n["NodeID"][:12] for n in alive) or "none"
            raise LogNotFoundError(f"no alive node {'with id ' + node if node else ''} "
                                  f"(alive nodes: {ids}); `rtml list nodes` lists them")
        return chosen

    def files(self, node: dict[str, Any]) -> list[m.LogFile]:
        """The log files of ``node`` (a record of :meth:`nodes`)."""
        reply = self._ask(node["NodeManagerAddress"], m.ListLogs(0), m.LogFiles)
        return list(reply.files)

    def locate(self, *, task: str = "", actor: str = "", worker: str = "", pid: int = 0,
               name: str = "", node: str = "") -> list[LogSource]:
        """The files holding what was asked for, on ``node`` (an id prefix) or wherever
        they are. Raises LogNotFoundError saying what was not found and how to look."""
        if task:
            node, pid = self._task_worker(task)
        elif actor:
            node = self._actor_node(actor)
        found = []
        for record in self.nodes(node):
            for file in self.files(record):
                if _matches(file, actor, worker, pid, DAEMON_FILES.get(name, name)):
                    found.append(LogSource(record["NodeID"], record["NodeManagerAddress"],
                                           file.name))
        if not found:
            what = (f"task {task}" if task else f"actor {actor}" if actor else
                    f"worker {worker}" if worker else f"pid {pid}" if pid else repr(name))
            where = f"node {node}" if node else "any alive node"
            raise LogNotFoundError(f"no log file of {what} on {where}; `rtml logs` lists "
                                  f"every node's files")
        return found

    def _task_worker(self, task: str) -> tuple[str, int]:
        records = self.plane.list_tasks({"task_id": task.lower()})
        ran = [t for t in records if t.get("worker_pid")]
        if not ran:
            why = "it has not run yet" if records else "no such task is recorded"
            raise RtmlSystemError(f"task {task}: {why}; `rtml list tasks` lists them")
        return str(ran[-1].get("node_id") or ""), int(ran[-1]["worker_pid"])

    def _actor_node(self, actor: str) -> str:
        for record in self.plane.list_actors():
            if record["actor_id"].startswith(actor.lower()):
                if not record.get("node_id"):
                    raise RtmlSystemError(f"actor {actor} was never placed on a node "
                                          f"(state {record.get('state')})")
                return str(record["node_id"])
        raise RtmlSystemError(f"no actor {actor} is recorded; `rtml list actors` lists them")

    def read(self, source: LogSource, offset: int, max_bytes: int = MAX_CHUNK) -> m.LogChunk:
        """Bytes of the file from ``offset`` (negative: from its end). Raises
        LogNotFoundError with the node manager's reason when it read nothing (no such
        file, a name that is not one), RtmlSystemError when it cannot be asked."""
        chunk = self._ask(source.address, m.ReadLog(0, source.name, offset, max_bytes),
                          m.LogChunk)
        if chunk.error:
            raise LogNotFoundError(f"node {source.node_id[:12]}: {chunk.error}")
        return chunk

    def tail(self, source: LogSource, lines: int) -> tuple[bytes, int]:
        """The last ``lines`` lines of the file, and its size (where following starts)."""
        want = 64 * 1024
        while True:
            chunk = self.read(source, -want)
            data = chunk.data
            if chunk.offset == 0 or data.count(b"\n") > lines:
                kept = data.splitlines(keepends=True)[-lines:] if lines else []
                return b"".join(kept), chunk.offset + len(chunk.data)
            want *= 4

    def follow(self, source: LogSource, offset: int,
               interval: float = FOLLOW_INTERVAL) -> Iterator[bytes]:
        """What is written to the file from ``offset`` on, as it comes (until the caller
        stops); a file that shrank (rotated, truncated) is read again from its start."""
        while True:
            chunk = self.read(source, offset)
            if chunk.size < offset:
                offset = 0
                continue
            if chunk.data:
                offset = chunk.offset + len(chunk.data)
                yield chunk.data
            if offset >= chunk.size:
                time.sleep(interval)

    def _ask(self, address: str, msg: Any, reply_type: Any) -> Any:
        try:
            return request(address, self.token, make_hello("cli", new_client_id()), msg,
                           reply_type, timeout=REQUEST_TIMEOUT)
        except ProtocolError as exc:
            raise RtmlSystemError(f"the node manager at {address} refused us: {exc}; check "
                                  f"the cluster token (RTML_TOKEN or <session>/token)") from None
        except OSError as exc:
            raise RtmlSystemError(f"cannot reach the node manager at {address} ({exc}); is "
                                  f"the node alive? (`rtml status`)") from None


def _matches(file: m.LogFile, actor: str, worker: str, pid: int, name: str) -> bool:
    if actor:
        return file.actor_id.hex().startswith(actor.lower())
    if pid:
        return file.pid == pid
    if worker:
        return file.name.startswith(f"worker-{worker.lower()[:12]}")
    return file.name in (name, f"{name}.log")
