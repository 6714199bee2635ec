"""The one-file-per-object format: round trips, alignment, zero-copy reads, errors."""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from rtml.exceptions import ObjectLostError
from rtml.objectstore import (
    copy_file,
    create_store_dir,
    read_segment,
    remove_store_dir,
    segment,
    segment_path,
    spill_path,
    write_segment,
)


@pytest.fixture
def store_dir() -> Iterator[str]:
    """A store directory unique to the test; fails the test if it leaves a segment behind."""
    path = create_store_dir(uuid.uuid4().hex)
    yield path
    leftovers = os.listdir(path)
    remove_store_dir(path)
    assert not leftovers, f"test left shm segments behind: {leftovers}"


@pytest.fixture
def seg(store_dir: str) -> Iterator[str]:
    """A fresh segment path, unlinked after the test."""
    path = segment_path(store_dir, os.urandom(20))
    yield path
    if os.path.exists(path):
        os.unlink(path)


def _put(path: str, value: object) -> int:
    buffers: list[pickle.PickleBuffer] = []
    inband = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return write_segment(path, inband, buffers)


def _get(path: str) -> object:
    inband, bufs = read_segment(path)
    return pickle.loads(bytes(inband), buffers=bufs)


def _mapping_path(address: int) -> str | None:
    """The file backing the mapping of this process that contains ``address``."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) == 6 else ""
    return None


def test_paths() -> None:
    oid = bytes(range(20))
    assert segment_path("/dev/shm/rtml-abc123", oid) == f"/dev/shm/rtml-abc123/{oid.hex()}"
    assert spill_path("/tmp/spill", oid) == f"/tmp/spill/rtml-{oid.hex()}"


def test_round_trip_bytes(seg: str) -> None:
    size = write_segment(seg, b"hello world", [])
    assert size == os.path.getsize(seg)
    assert oct(os.stat(seg).st_mode & 0o777) == "0o600"
    inband, bufs = read_segment(seg)
    assert bytes(inband) == b"hello world" and bufs == []
    assert inband.readonly


def test_round_trip_numpy_dict_zero_copy(seg: str) -> None:
    value = {
        "a": np.arange(1000, dtype=np.float64),
        "b": np.ones((17, 3), dtype=np.int8),
        "c": np.random.default_rng(0).random((64, 64)).astype(np.float32),
        "meta": "not a buffer",
    }
    _put(seg, value)
    back = _get(seg)
    assert isinstance(back, dict) and back["meta"] == "not a buffer"
    for key in ("a", "b", "c"):
        arr = back[key]
        np.testing.assert_array_equal(arr, value[key])
        assert arr.dtype == value[key].dtype and not arr.flags.writeable
        assert _mapping_path(arr.__array_interface__["data"][0]) == seg
        with pytest.raises(ValueError):
            arr[0] = 1


def test_round_trip_arrow_ipc_zero_copy(seg: str) -> None:
    table = pa.table(
        {
            "x": pa.array(np.arange(10_000, dtype=np.int64)),
            "s": pa.array([f"row{i}" for i in range(10_000)]),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    write_segment(seg, b"", [sink.getvalue()])
    _inband, bufs = read_segment(seg)
    assert len(bufs) == 1
    back = pa.ipc.open_stream(pa.py_buffer(bufs[0])).read_all()
    assert back.equals(table)
    data_address = back.column("x").chunk(0).buffers()[1].address
    assert _mapping_path(data_address) == seg


def test_every_region_is_64_byte_aligned(seg: str) -> None:
    buffers = [np.arange(n, dtype=np.uint8) for n in (1, 63, 64, 65, 0, 1000)]
    write_segment(seg, b"x" * 13, buffers)
    inband, bufs = read_segment(seg)
    base = _address(inband) - _offset_of(inband, seg)
    assert base % 4096 == 0  # the mapping starts on a page
    for view, original in zip([inband, *bufs], [b"x" * 13, *buffers], strict=True):
        assert (_address(view) - base) % 64 == 0
        assert bytes(view) == bytes(original)


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0] if len(view) else 0


def _offset_of(view: memoryview, path: str) -> int:
    """Offset of ``view`` from the start of the file mapping, via /proc/self/maps."""
    address = _address(view)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end and len(fields) == 6 and fields[5].strip() == path:
                return address - start + int(fields[2], 16)
    raise AssertionError("view is not inside the segment's mapping")


def test_empty_buffers_are_allowed(seg: str) -> None:
    write_segment(seg, b"", [b"", bytearray(b"abc")])
    inband, bufs = read_segment(seg)
    assert bytes(inband) == b"" and [bytes(b) for b in bufs] == [b"", b"abc"]


def test_second_write_is_refused_and_keeps_the_first(seg: str) -> None:
    write_segment(seg, b"first", [])
    with pytest.raises(FileExistsError):
        write_segment(seg, b"second", [])
    assert bytes(read_segment(seg)[0]) == b"first"


def test_failed_write_removes_the_file(seg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def fill_then_fail(mm: object, *args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segment, "_fill", fill_then_fail)
    with pytest.raises(OSError, match="No space"):
        write_segment(seg, b"x", [b"ok"])
    assert not os.path.exists(seg)


def test_non_contiguous_buffer_is_copied_correctly(seg: str) -> None:
    arr = np.arange(100, dtype=np.int32)[::3]
    write_segment(seg, b"", [memoryview(arr)])
    _inband, bufs = read_segment(seg)
    assert bytes(bufs[0]) == arr.tobytes()


@pytest.mark.parametrize("damage", ["magic", "truncate_header", "truncate_data", "meta"])
def test_corrupt_file_raises_object_lost(seg: str, damage: str) -> None:
    size = _put(seg, np.arange(1000, dtype=np.float64))
    with open(seg, "r+b") as f:
        if damage == "magic":
            f.write(b"XXXX")
        elif damage == "truncate_header":
            f.truncate(5)
        elif damage == "truncate_data":
            f.truncate(size - 100)
        else:
            f.seek(12)
            f.write(b"\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    with pytest.raises(ObjectLostError):
        read_segment(seg)


def test_missing_file_raises_file_not_found(store_dir: str) -> None:
    with pytest.raises(FileNotFoundError):
        read_segment(segment_path(store_dir, b"\x00" * 20))


def test_copy_file_spill_and_restore(seg: str, tmp_path: os.PathLike[str]) -> None:
    value = {"arr": np.arange(50_000, dtype=np.int64)}
    _put(seg, value)
    spilled = spill_path(str(tmp_path), b"\x01" * 20)
    copy_file(seg, spilled)
    os.unlink(seg)
    assert not os.path.exists(spilled + ".tmp")
    copy_file(spilled, seg)
    np.testing.assert_array_equal(_get(seg)["arr"], value["arr"])


def test_copy_file_missing_source(tmp_path: os.PathLike[str]) -> None:
    dst = os.path.join(str(tmp_path), "dst")
    with pytest.raises(FileNotFoundError):
        copy_file(os.path.join(str(tmp_path), "nope"), dst)
    assert not os.path.exists(dst) and not os.path.exists(dst + ".tmp")
