"""What every daemon entry point shares: logging, readiness pipes, dying with a parent."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
from typing import Any

from rtml.rpc import messages as m
from rtml.rpc.framing import FrameDecoder, frame

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0; a process we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def setup_logging(path: str) -> None:
    logging.basicConfig(filename=path, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def report_ready(fd: int, text: str) -> None:
    """Tell the parent we are serving (one line on the readiness pipe)."""
    if fd >= 0:
        os.write(fd, (text + "\n").encode())
        os.close(fd)


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
        self._frames: list[bytes] = []

    @classmethod
    async def connect(cls, address: str, hello: m.Hello, timeout: float = 10.0) -> tuple[
            FramedClient, m.HelloReply]:
        """Connect and authenticate. Raises OSError, TimeoutError or ProtocolError."""
        reader, writer = await asyncio.wait_for(open_framed(address), timeout)
        client = cls(reader, writer)
        client.send(hello)
        reply = await asyncio.wait_for(client.receive(), timeout)
        if not isinstance(reply, m.HelloReply) or not reply.ok:
            from rtml.exceptions import ProtocolError
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
