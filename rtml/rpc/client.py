"""The asyncio client side of a framed, authenticated connection (daemons and the CLI).

    FramedClient.connect(address, hello) --Hello(token)--> a daemon's FramedProtocol
                                         <--HelloReply---
    send(msg) / await receive()          framed msgpack both ways
"""

from __future__ import annotations

import asyncio
from typing import Any

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m
from rtml.rpc.framing import FrameDecoder, frame


async def open_framed(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.startswith("unix:"):
        return await asyncio.open_unix_connection(address[5:])
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


class FramedClient:
    """An asyncio client connection with framing, used by daemons to reach the head."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self._frames: list[bytes | memoryview] = []

    @classmethod
    async def connect(cls, address: str, hello: m.Hello, timeout: float = 10.0) -> tuple[
            FramedClient, m.HelloReply]:
        """Connect and authenticate. Raises OSError, TimeoutError or ProtocolError."""
        reader, writer = await asyncio.wait_for(open_framed(address), timeout)
        client = cls(reader, writer)
        client.send(hello)
        reply = await asyncio.wait_for(client.receive(), timeout)
        if not isinstance(reply, m.HelloReply) or not reply.ok:
            raise ProtocolError(getattr(reply, "error", "bad handshake reply"))
        return client, reply

    def send(self, msg: m.Msg) -> None:
        self.writer.write(frame(m.encode(msg)))

    async def receive(self) -> Any:
        """The next message; raises ConnectionError at EOF."""
        while not self._frames:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("connection closed")
            self._frames.extend(self.decoder.feed(data))
        return m.decode(self._frames.pop(0))

    def close(self) -> None:
        self.writer.close()
