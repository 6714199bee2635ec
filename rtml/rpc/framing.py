"""Length-prefixed frames, sans-I/O.

A frame is a 4-byte big-endian length and that many bytes of msgpack. The
decoder is fed whatever bytes arrived and returns the complete frames; a frame
larger than ``MAX_FRAME`` raises :class:`ProtocolError` before its body is
buffered, so a bad peer cannot make us allocate without bound.
"""

from __future__ import annotations

import struct

from rtml.exceptions import ProtocolError

MAX_FRAME = 512 * 1024 * 1024
_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length."""
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Accumulates bytes and yields complete frame payloads."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    def pending(self) -> bytes:
        """Bytes received but not yet part of a complete frame."""
        return bytes(self._buf)

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        """Add ``data``; return every frame it completes. Raises ProtocolError."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_SIZE:
            (size,) = _HEADER.unpack_from(buf, pos)
            if size > self.max_frame:
                raise ProtocolError(f"frame of {size} bytes exceeds the {self.max_frame} limit")
            if end - pos - HEADER_SIZE < size:
                break
            start = pos + HEADER_SIZE
            frames.append(bytes(buf[start:start + size]))
            pos = start + size
        if pos:
            del buf[:pos]
        return frames
