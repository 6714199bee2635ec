"""One object = one file in its node's store directory (in ``/dev/shm``, private to the
cluster's user: ``private``), written once and mapped read-only by readers.

A value is stored as its pickle-5 in-band stream plus its out-of-band buffers
(numpy data, an Arrow IPC stream, ...). Every region starts on a 64-byte
boundary so that readers on the node hand out memoryviews straight into the
mapping: ``get`` of a large array is zero-copy.

File layout (little-endian)::

    offset 0   +--------------------------------------------------+
               | magic b"RTML" | version u16 | reserved u16 |     |  12-byte header
               | meta length u32                                  |
    12         +--------------------------------------------------+
               | meta (msgpack): [inband_offset, inband_length,   |
               |                  [[offset, length], ...]]         |
               +--------------------------------------------------+
               | zero padding up to a multiple of 64               |
    aligned    +--------------------------------------------------+
               | in-band pickle bytes                              |
               | padding -> 64                                     |
    aligned    +--------------------------------------------------+
               | buffer 0                                          |
               | padding -> 64                                     |
    aligned    +--------------------------------------------------+
               | buffer 1 ...                                      |
               +--------------------------------------------------+

Offsets in the meta are absolute (from the start of the file). The writer
creates the file with ``O_EXCL``: an object is immutable once sealed, and a
second writer of the same id is a bug that must not corrupt a reader's view.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import msgspec

from rtml.exceptions import ObjectLostError
from rtml.ids import ObjectID
from rtml.objectstore.private import open_private

__all__ = ["copy_file", "existing_size", "read_segment", "segment_path", "spill_path",
           "write_segment"]

MAGIC = b"RTML"
VERSION = 1
ALIGNMENT = 64
_HEADER = struct.Struct("<4sHHI")


class _Meta(msgspec.Struct, array_like=True, frozen=True):
    """Where the in-band stream and each out-of-band buffer live in the file."""

    inband_offset: int
    inband_length: int
    buffers: list[tuple[int, int]]


_encode_meta = msgspec.msgpack.Encoder().encode
_decode_meta = msgspec.msgpack.Decoder(_Meta).decode


def segment_path(store_dir: str, object_id: ObjectID) -> str:
    """The path of ``object_id`` in the store directory ``store_dir``."""
    return f"{store_dir}/{object_id.hex()}"


def existing_size(path: str) -> int:
    """The size of the object file at ``path``, which a writer found there already: an
    earlier attempt of the same task (only the cluster's user can make names in a store
    directory). Raises ObjectLostError if it is not private to this user."""
    fd = open_private(path)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def spill_path(spill_dir: str, object_id: ObjectID) -> str:
    """The path of ``object_id`` once spilled to disk under ``spill_dir``."""
    return os.path.join(spill_dir, f"rtml-{object_id.hex()}")


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def _as_bytes_view(buf: Any) -> memoryview:
    """A flat byte view of ``buf``; copies only a non-contiguous buffer."""
    if isinstance(buf, pickle.PickleBuffer):
        try:
            return buf.raw()
        except BufferError:  # non-contiguous: pickle would have copied it anyway
            return memoryview(bytes(buf))
    view = memoryview(buf)
    if not view.contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B")


def _layout(inband_len: int, buffer_lens: Sequence[int]) -> tuple[bytes, _Meta, int]:
    """Encode the meta and place every region; returns (meta bytes, meta, file size).

    The meta's length depends on the offsets it records and vice versa, so the
    data start is raised until the encoded meta fits in front of it.
    """
    data_start = _align(_HEADER.size + 16)
    while True:
        offset = data_start
        inband_offset = offset
        offset = _align(offset + inband_len)
        spans: list[tuple[int, int]] = []
        for length in buffer_lens:
            spans.append((offset, length))
            offset = _align(offset + length)
        meta = _Meta(inband_offset, inband_len, spans)
        encoded = _encode_meta(meta)
        needed = _align(_HEADER.size + len(encoded))
        if needed <= data_start:
            end = spans[-1][0] + spans[-1][1] if spans else inband_offset + inband_len
            return encoded, meta, end
        data_start = needed


def write_segment(path: str, inband: bytes, buffers: Sequence[Any]) -> int:
    """Write one object to a new file at ``path``; returns the file's size in bytes.

    The object is written under a private name and linked to ``path`` only when
    complete, so a reader never maps a half-written segment. Raises
    ``FileExistsError`` if ``path`` exists (the existing file is left alone) and
    ``OSError`` (e.g. ``ENOSPC``) if ``/dev/shm`` is full.
    """
    views = [_as_bytes_view(b) for b in buffers]
    inband_view = memoryview(inband).cast("B")
    encoded, meta, size = _layout(len(inband_view), [len(v) for v in views])
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        try:
            os.ftruncate(fd, size)
            _fill(fd, encoded, meta, inband_view, views)
        finally:
            os.close(fd)
        os.link(tmp, path)
    finally:
        unlink_quietly(tmp)
    return size


def _fill(fd: int, encoded: bytes, meta: _Meta, inband: memoryview,
          views: list[memoryview]) -> None:
    """Write header, meta and every region at their offsets (the one copy).

    ``pwrite`` into tmpfs is about twice as fast as filling a fresh mapping,
    which takes a page fault per 4 KiB.
    """
    pwrite_all(fd, _HEADER.pack(MAGIC, VERSION, 0, len(encoded)) + encoded, 0)
    pwrite_all(fd, inband, meta.inband_offset)
    for (offset, _length), view in zip(meta.buffers, views, strict=True):
        pwrite_all(fd, view, offset)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (pwrite may write less than asked)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)

def unlink_quietly(path: str) -> None:
    """Remove ``path`` if it exists."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Mapping(mmap.mmap):
    """A read-only mapping of one segment, with its parsed layout."""

    meta: _Meta


_mapped: weakref.WeakValueDictionary[str, _Mapping] = weakref.WeakValueDictionary()
"""Segments mapped in this process, by path, while any value read from them lives: two
reads of one object share one mapping (``np.shares_memory`` holds for their arrays, as
in Ray) and the second costs no ``mmap``. Segments are immutable, so a mapping stays
right for as long as it lives, even if its file is unlinked meanwhile."""


def read_segment(path: str) -> tuple[memoryview, list[memoryview]]:
    """Map the object at ``path`` read-only; returns (in-band bytes, buffers).

    Every returned memoryview points into the mapping (no copy) and keeps it
    alive. Raises ``FileNotFoundError`` if the file does not exist and
    ``ObjectLostError`` if it is not private to this user, truncated or corrupt.
    """
    mm = _mapped.get(path)
    if mm is None:
        mm = _map(path)
    view = memoryview(mm)
    meta = mm.meta
    inband = view[meta.inband_offset : meta.inband_offset + meta.inband_length]
    return inband, [view[off : off + length] for off, length in meta.buffers]


def _map(path: str) -> _Mapping:
    fd = open_private(path)
    try:
        size = os.fstat(fd).st_size
        if size < _HEADER.size:
            raise ObjectLostError(
                f"object file {path} is truncated ({size} bytes); "
                "the object must be rebuilt or re-fetched"
            )
        mm = _Mapping(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    view = memoryview(mm)
    try:
        mm.meta = _parse(view, path)
    except ObjectLostError:
        view.release()
        mm.close()
        raise
    view.release()
    _mapped[path] = mm
    return mm


def _parse(view: memoryview, path: str) -> _Meta:
    """Validate the header and meta against the file size; raises ObjectLostError."""
    magic, version, _reserved, meta_len = _HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise _corrupt(path, f"bad magic/version {magic!r}/{version}")
    meta_end = _HEADER.size + meta_len
    if meta_end > len(view):
        raise _corrupt(path, "meta runs past the end of the file")
    try:
        meta = _decode_meta(view[_HEADER.size : meta_end])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _corrupt(path, f"unreadable meta ({exc})") from None
    spans = [(meta.inband_offset, meta.inband_length), *meta.buffers]
    if any(off < meta_end or length < 0 or off + length > len(view) for off, length in spans):
        raise _corrupt(path, "a region lies outside the file")
    return meta


def _corrupt(path: str, why: str) -> ObjectLostError:
    return ObjectLostError(
        f"object file {path} is corrupt: {why}; the object must be rebuilt or re-fetched"
    )


def copy_file(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` atomically (via ``dst + ".tmp"``), for spill and restore.

    ``dst`` either does not change or appears complete. Raises
    ``FileNotFoundError`` if ``src`` is missing, ``ObjectLostError`` if it is not private
    to this user and ``OSError`` if the target filesystem is full (the temporary file is
    removed).
    """
    tmp = dst + ".tmp"
    src_fd = open_private(src)
    try:
        dst_fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        try:
            _sendfile_all(src_fd, dst_fd, os.fstat(src_fd).st_size)
        finally:
            os.close(dst_fd)
        os.replace(tmp, dst)
    except BaseException:
        unlink_quietly(tmp)
        raise
    finally:
        os.close(src_fd)


def _sendfile_all(src_fd: int, dst_fd: int, size: int) -> None:
    offset = 0
    while offset < size:
        sent = os.sendfile(dst_fd, src_fd, offset, size - offset)
        if sent == 0:  # src shrank under us
            raise ObjectLostError(f"source file shrank while copying ({offset}/{size} bytes)")
        offset += sent
