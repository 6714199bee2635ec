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

    def feed(self, data: bytes | memoryview) -> list[bytes | memoryview]:
        """Add ``data``; return every frame it completes. Raises ProtocolError.

        Frames that lie whole in ``data`` come back as views of it (no copy): use them
        before ``data``'s buffer is reused for the next read.
        """
        buf = self._buf
        if buf:  # a frame is split across reads: join them
            buf += data
            frames, pos = self._split(memoryview(buf))
            frames = [bytes(frame) for frame in frames]  # views would pin buf's size
            del buf[:pos]
            return frames
        if len(data) > HEADER_SIZE:  # the usual read: exactly one whole frame
            (size,) = _HEADER.unpack_from(data)
            if size == len(data) - HEADER_SIZE and size <= self.max_frame:
                return [memoryview(data)[HEADER_SIZE:]]
        view = memoryview(data)
        frames, pos = self._split(view)
        if pos < len(view):
            buf += view[pos:]
        return frames

    def _split(self, view: memoryview) -> tuple[list[bytes | memoryview], int]:
        """The whole frames at the start of ``view``, and where the rest begins."""
        frames: list[bytes | memoryview] = []
        pos = 0
        end = len(view)
        while end - pos >= HEADER_SIZE:
            (size,) = _HEADER.unpack_from(view, pos)
            if size > self.max_frame:
                raise ProtocolError(f"frame of {size} bytes exceeds the {self.max_frame} limit")
            if end - pos - HEADER_SIZE < size:
                break
            start = pos + HEADER_SIZE
            frames.append(view[start:start + size])
            pos = start + size
        return frames, pos
