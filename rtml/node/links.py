"""A node manager's connections to the other node managers.

    NodeLinks.send(node_id, msg) --queued until the address is known--> FramedClient --TCP-->
                                                                        other node manager
    NodeLinks.fence(node_id) --LinkFence--> answered LinkFenced once all before it are handled
    other node manager --answers (ObjectLocated)--> on_answer
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from rtml.exceptions import ProtocolError
from rtml.ids import NodeID
from rtml.rpc import messages as m
from rtml.rpc.client import FramedClient

log = logging.getLogger(__name__)


class NodeLinks:
    """A node manager's connections to the other node managers, opened on first use.

    ``send`` never blocks: messages queue until the connection is up (or until the
    node's address arrives in the head's node table), then go out in order.
    :meth:`fence` waits until the other end has handled what was sent before it.
    """

    def __init__(self, token: str, hello: m.Hello, on_answer: Callable[[m.Msg], None]
                 ) -> None:
        """``on_answer``: gets what the other ends send back, besides fence answers."""
        self.token = token
        self.hello = hello
        self.on_answer = on_answer
        self.addresses: dict[NodeID, str] = {}
        self._clients: dict[NodeID, FramedClient] = {}
        self._queues: dict[NodeID, list[m.Msg]] = {}
        self._tasks: dict[NodeID, asyncio.Task[None]] = {}
        self._fences: dict[NodeID, dict[int, asyncio.Future[None]]] = {}
        self._fence_ids = itertools.count(1)

    def send(self, node_id: NodeID, msg: m.Msg) -> None:
        client = self._clients.get(node_id)
        if client is not None:
            client.send(msg)
            return
        self._queues.setdefault(node_id, []).append(msg)
        if node_id not in self._tasks and node_id in self.addresses:
            self._tasks[node_id] = asyncio.get_running_loop().create_task(self._run(node_id))

    async def fence(self, node_id: NodeID) -> None:
        """Return once ``node_id`` has handled every message sent to it before this call,
        or its link failed (then nothing more can be known, or done, there)."""
        req_id = next(self._fence_ids)
        future = asyncio.get_running_loop().create_future()
        self._fences.setdefault(node_id, {})[req_id] = future
        self.send(node_id, m.LinkFence(req_id))
        await future

    def _fenced(self, node_id: NodeID, req_id: int | None = None) -> None:
        """Resolve fence ``req_id`` on ``node_id``'s link, or all of them (the link failed)."""
        fences = self._fences.get(node_id, {})
        for future in [fences.pop(req_id, None)] if req_id is not None else fences.values():
            if future is not None and not future.done():
                future.set_result(None)
        if req_id is None or not fences:
            self._fences.pop(node_id, None)

    def address_known(self, node_id: NodeID, address: str) -> None:
        self.addresses[node_id] = address
        if node_id in self._queues and node_id not in self._tasks:
            self._tasks[node_id] = asyncio.get_running_loop().create_task(self._run(node_id))

    async def _run(self, node_id: NodeID) -> None:
        address = self.addresses[node_id]
        try:
            client, _ = await FramedClient.connect(address, self.token, self.hello)
        except (OSError, TimeoutError, ProtocolError) as exc:
            dropped = self._queues.pop(node_id, [])
            log.warning("cannot reach node %s at %s (%s); dropped %d message(s)",
                        node_id.hex(), address, exc, len(dropped))
            self._tasks.pop(node_id, None)
            self._fenced(node_id)
            return
        for msg in self._queues.pop(node_id, []):
            client.send(msg)
        self._clients[node_id] = client
        try:
            while True:
                msg = await client.receive()  # answers; this also notices a close
                if isinstance(msg, m.LinkFenced):
                    self._fenced(node_id, msg.req_id)
                else:
                    self.on_answer(msg)
        except (ConnectionError, OSError):
            pass
        finally:
            self._clients.pop(node_id, None)
            self._tasks.pop(node_id, None)
            client.close()
            self._fenced(node_id)

    def forget(self, node_id: NodeID) -> None:
        """The node died: drop its connection and whatever waits for it."""
        self._queues.pop(node_id, None)
        task = self._tasks.pop(node_id, None)
        if task is not None:
            task.cancel()
        self._fenced(node_id)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for client in self._clients.values():
            client.close()
