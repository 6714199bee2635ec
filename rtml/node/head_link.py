"""The node manager's connection to the head service, kept through head restarts.

    connect(deadline)   connect and authenticate, retrying refused or dropped connections
                        until the deadline (a refusal of our token is final)
    send(msg)           written now; while the head is away only what nothing re-sends is
                        kept (workers' prints), in order, and written on rejoin
    receive()           the next message; ConnectionError when the head went away
    rejoin(first)       connected again: ``first`` (the registration, re-sent spills) goes
                        out, then the last KEPT_MAX kills (one written to a head that was
                        stopped, then died, was never read; a kill is idempotent), then
                        what was kept

Everything else a node manager tells the head is state it tells again on rejoin (its
registration lists the actors it hosts; heartbeats repeat), so it is dropped meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from rtml.exceptions import ProtocolError, RtmlSystemError
from rtml.rpc import messages as m
from rtml.rpc.client import FramedClient

log = logging.getLogger(__name__)

KEPT_WHILE_AWAY = (m.WorkerOutput,)
KEPT_MAX = 10_000
"""Messages kept for the head while it is away; beyond this the oldest prints are lost."""


class HeadLink:
    def __init__(self, address: str, token: str, hello: m.Hello) -> None:
        self.address = address
        self.token = token
        self.hello = hello
        self.client: FramedClient | None = None
        self.kept: deque[m.Msg] = deque(maxlen=KEPT_MAX)
        self.kills: deque[m.KillActor] = deque(maxlen=KEPT_MAX)

    async def connect(self, timeout: float) -> m.HelloReply:
        """Connect within ``timeout`` s. Raises RtmlSystemError saying why not."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                self.client, reply = await FramedClient.connect(self.address, self.token, self.hello)
                return reply
            except ProtocolError as exc:
                raise RtmlSystemError(f"the head at {self.address} refused this node: "
                                      f"{exc}") from None
            except (OSError, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise RtmlSystemError(
                        f"cannot reach the head at {self.address} within {timeout:g} s "
                        f"({exc or 'timed out'}); check the address and that "
                        f"`rtml start --head` runs there") from None
                log.info("connecting to the head at %s failed (%r); retrying", self.address,
                         exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def send(self, msg: m.Msg) -> None:
        if isinstance(msg, m.KillActor):
            self.kills.append(msg)  # sent again on rejoin
        if self.client is not None:
            self.client.send(msg)
        elif isinstance(msg, KEPT_WHILE_AWAY):
            self.kept.append(msg)

    async def receive(self) -> object:
        if self.client is None:
            raise ConnectionError("not connected to the head")
        try:
            return await self.client.receive()
        except (ConnectionError, OSError):
            self.client.close()
            self.client = None
            raise

    def rejoin(self, first: list[m.Msg]) -> None:
        """Called once connect() succeeded."""
        assert self.client is not None
        for msg in [*first, *self.kills]:
            self.client.send(msg)
        while self.kept:
            self.client.send(self.kept.popleft())

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
