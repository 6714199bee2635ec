"""Node-to-node object transfer over gRPC: real sockets, an in-process server, tmp_path files."""

from __future__ import annotations

import glob
import os
import pickle
import socket
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from rtml.exceptions import ObjectLostError, ProtocolError, RtmlSystemError
from rtml.objectstore import read_segment, write_segment
from rtml.objectstore import transfer as tr
from rtml.objectstore.transfer import (
    CHUNK_BYTES,
    TransferServer,
    close_channels,
    decode_chunk,
    encode_chunk,
    pull,
)
from rtml.rpc.messages import PROTOCOL_VERSION
from rtml.rpc.protos import transfer_pb2, transfer_pb2_grpc

TOKEN = "test-token"
GOOD_METADATA = tr.call_metadata(TOKEN)


class Holder:
    """A running TransferServer over the files of one directory, recording its callbacks."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.located: list[bytes] = []
        self.served: list[tuple[bytes, bytes]] = []
        self.server = TransferServer("127.0.0.1", TOKEN, self._locate, self._on_served)
        self.address = self.server.start()

    def _locate(self, object_id: bytes) -> str | None:
        self.located.append(object_id)
        path = self.path(object_id)
        return str(path) if path.exists() else None

    def _on_served(self, object_id: bytes, requester: bytes) -> None:
        self.served.append((object_id, requester))

    def path(self, object_id: bytes) -> Path:
        return self.directory / f"rtml-{object_id.hex()}"

    def put_bytes(self, data: bytes) -> bytes:
        object_id = os.urandom(20)
        self.path(object_id).write_bytes(data)
        return object_id

    def put_value(self, value: object) -> bytes:
        object_id = os.urandom(20)
        buffers: list[pickle.PickleBuffer] = []
        inband = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        write_segment(str(self.path(object_id)), inband, buffers)
        return object_id


@pytest.fixture(autouse=True)
def _fresh_channels() -> Iterator[None]:
    """Each test starts and ends with no cached channel."""
    close_channels()
    yield
    close_channels()


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Holder]:
    src = tmp_path / "holder"
    src.mkdir()
    h = Holder(src)
    yield h
    close_channels()
    h.server.stop(0)


@pytest.fixture
def dest_dir(tmp_path: Path) -> Path:
    d = tmp_path / "puller"
    d.mkdir()
    return d


def _leftovers(directory: Path) -> list[str]:
    return glob.glob(str(directory / "*.tmp"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- round trips ---------------------------------------------------------------------------------


def test_numpy_segment_round_trip(holder: Holder, dest_dir: Path) -> None:
    array = np.arange(300_000, dtype=np.float64).reshape(600, 500)
    object_id = holder.put_value({"weights": array, "step": 7})
    dest = dest_dir / "copy"
    size = pull(holder.address, TOKEN, object_id, str(dest), requester_node=b"node-b")
    original = holder.path(object_id).read_bytes()
    assert size == len(original) == dest.stat().st_size
    assert dest.read_bytes() == original
    inband, buffers = read_segment(str(dest))
    value = pickle.loads(inband, buffers=buffers)
    assert value["step"] == 7
    np.testing.assert_array_equal(value["weights"], array)
    assert holder.served == [(object_id, b"node-b")]
    assert _leftovers(dest_dir) == []


def test_file_spanning_many_chunks(holder: Holder, dest_dir: Path) -> None:
    data = os.urandom(3 * CHUNK_BYTES + 12345)
    object_id = holder.put_bytes(data)
    dest = dest_dir / "big"
    assert pull(holder.address, TOKEN, object_id, str(dest)) == len(data)
    assert dest.read_bytes() == data


@pytest.mark.parametrize("data", [b"", b"x", bytes(range(256))])
def test_empty_and_tiny_files(holder: Holder, dest_dir: Path, data: bytes) -> None:
    object_id = holder.put_bytes(data)
    dest = dest_dir / "tiny"
    assert pull(holder.address, TOKEN, object_id, str(dest)) == len(data)
    assert dest.read_bytes() == data
    assert holder.served == [(object_id, b"")]


def test_existing_dest_is_success_without_a_call(holder: Holder, dest_dir: Path) -> None:
    dest = dest_dir / "already"
    dest.write_bytes(b"12345")
    missing = os.urandom(20)  # the holder does not even have it: no call is made
    assert pull(holder.address, TOKEN, missing, str(dest)) == 5
    assert dest.read_bytes() == b"12345"
    assert holder.located == []


def test_concurrent_pulls_of_one_object(holder: Holder, dest_dir: Path) -> None:
    data = os.urandom(2 * CHUNK_BYTES + 7)
    object_id = holder.put_bytes(data)
    sizes: dict[int, int] = {}
    errors: list[BaseException] = []

    def fetch(i: int) -> None:
        try:
            sizes[i] = pull(holder.address, TOKEN, object_id, str(dest_dir / f"copy{i}"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert sizes == {i: len(data) for i in range(6)}
    for i in range(6):
        assert (dest_dir / f"copy{i}").read_bytes() == data
    assert len(holder.served) == 6
    assert _leftovers(dest_dir) == []


def test_concurrent_pulls_into_one_dest(holder: Holder, dest_dir: Path) -> None:
    data = os.urandom(CHUNK_BYTES + 1)
    object_id = holder.put_bytes(data)
    dest = dest_dir / "shared"
    results: list[int] = []
    threads = [threading.Thread(
        target=lambda: results.append(pull(holder.address, TOKEN, object_id, str(dest))))
        for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [len(data)] * 4
    assert dest.read_bytes() == data
    assert os.listdir(dest_dir) == ["shared"]


# -- refusals and failures -----------------------------------------------------------------------


def test_wrong_token_is_refused_before_any_lookup(holder: Holder, dest_dir: Path) -> None:
    object_id = holder.put_bytes(b"secret")
    dest = dest_dir / "nope"
    with pytest.raises(RtmlSystemError, match="wrong cluster token") as info:
        pull(holder.address, "not-the-token", object_id, str(dest))
    assert holder.address in str(info.value)
    assert holder.located == []
    assert not dest.exists()
    assert os.listdir(dest_dir) == []


def _raw_pull(address: str, metadata: tuple[tuple[str, str], ...], object_id: bytes) -> Any:
    """Pull with the generated protobuf stub (as a non-rtml client would) and raw metadata."""
    with grpc.insecure_channel(address) as channel:
        stub = transfer_pb2_grpc.ObjectTransferStub(channel)
        request = transfer_pb2.PullRequest(object_id=object_id)
        return list(stub.Pull(request, metadata=metadata, timeout=10))


def test_wrong_version_is_refused(holder: Holder) -> None:
    object_id = holder.put_bytes(b"data")
    bad = ((tr.TOKEN_KEY, TOKEN), (tr.VERSION_KEY, str(PROTOCOL_VERSION + 1)))
    with pytest.raises(grpc.RpcError) as info:
        _raw_pull(holder.address, bad, object_id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details().startswith(
        f"protocol version {PROTOCOL_VERSION + 1}, this node ({holder.address}) speaks "
        f"{PROTOCOL_VERSION}")
    assert holder.located == []


def test_wrong_version_raises_system_error(holder: Holder, dest_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    object_id = holder.put_bytes(b"data")
    monkeypatch.setattr(tr, "call_metadata", lambda token: (
        (tr.TOKEN_KEY, token), (tr.VERSION_KEY, str(PROTOCOL_VERSION + 1))))
    with pytest.raises(RtmlSystemError, match="speaks") as info:
        pull(holder.address, TOKEN, object_id, str(dest_dir / "v"))
    assert f"protocol version {PROTOCOL_VERSION + 1}" in str(info.value)
    assert os.listdir(dest_dir) == []


def test_missing_metadata_is_refused(holder: Holder) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _raw_pull(holder.address, (), os.urandom(20))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert holder.located == []


def test_unknown_object_is_lost(holder: Holder, dest_dir: Path) -> None:
    object_id = os.urandom(20)
    with pytest.raises(ObjectLostError) as info:
        pull(holder.address, TOKEN, object_id, str(dest_dir / "lost"))
    message = str(info.value)
    assert object_id.hex() in message
    assert message.count(holder.address) == 2  # the source, and the node in the server's text
    assert holder.located == [object_id]
    assert os.listdir(dest_dir) == []
    assert holder.served == []


def test_unreachable_address_fails_fast(dest_dir: Path) -> None:
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RtmlSystemError, match=f"cannot reach the node at {address}"):
        pull(address, TOKEN, os.urandom(20), str(dest_dir / "x"), timeout=2.0)
    assert time.monotonic() - started < 5.0
    assert os.listdir(dest_dir) == []


def test_stopped_server_is_unreachable(holder: Holder, dest_dir: Path) -> None:
    object_id = holder.put_bytes(b"abc")
    assert pull(holder.address, TOKEN, object_id, str(dest_dir / "first")) == 3
    holder.server.stop(0)
    with pytest.raises(RtmlSystemError, match="cannot reach the node at"):
        pull(holder.address, TOKEN, object_id, str(dest_dir / "second"), timeout=2.0)
    assert sorted(os.listdir(dest_dir)) == ["first"]


def test_file_deleted_before_open_is_lost(holder: Holder, dest_dir: Path) -> None:
    object_id = holder.put_bytes(b"abc")
    path = holder.path(object_id)
    server = TransferServer("127.0.0.1", TOKEN, lambda _oid: str(path))  # stale location
    address = server.start()
    try:
        path.unlink()
        with pytest.raises(ObjectLostError, match=object_id.hex()):
            pull(address, TOKEN, object_id, str(dest_dir / "gone"))
    finally:
        server.stop(0)
    assert os.listdir(dest_dir) == []


# -- the server's stream, driven directly --------------------------------------------------------


class _Aborted(Exception):
    pass


class FakeContext:
    """The part of grpc.ServicerContext that ``TransferServer.serve`` uses."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self.aborted: tuple[Any, str] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(details)



def test_file_shrinking_mid_stream_aborts_not_found(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(os.urandom(3 * CHUNK_BYTES))
    server = TransferServer("127.0.0.1", TOKEN, lambda _oid: str(path))
    object_id = os.urandom(20)
    context = FakeContext(GOOD_METADATA)
    stream = server.serve(transfer_pb2.PullRequest(object_id=object_id), context)
    first = decode_chunk(next(stream))
    assert (first.total_size, first.offset, len(first.data)) == (3 * CHUNK_BYTES, 0, CHUNK_BYTES)
    os.truncate(path, CHUNK_BYTES)  # spilled or deleted through a bug: must not crash
    with pytest.raises(_Aborted):
        next(stream)
    assert context.aborted is not None
    assert context.aborted[0] == grpc.StatusCode.NOT_FOUND
    assert object_id.hex() in context.aborted[1] and "shrank" in context.aborted[1]


def test_file_unlinked_mid_stream_is_sent_whole(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK_BYTES + 5)
    path = tmp_path / "obj"
    path.write_bytes(data)
    served: list[bytes] = []
    server = TransferServer("127.0.0.1", TOKEN, lambda _oid: str(path),
                            lambda oid, _node: served.append(oid))
    stream = server.serve(transfer_pb2.PullRequest(object_id=b"id"), FakeContext(GOOD_METADATA))
    parts = [bytes(decode_chunk(next(stream)).data)]
    path.unlink()  # the open descriptor still reads the immutable object
    parts += [bytes(decode_chunk(message).data) for message in stream]
    assert b"".join(parts) == data
    assert served == [b"id"]


def test_streams_leak_no_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(os.urandom(2 * CHUNK_BYTES))
    server = TransferServer("127.0.0.1", TOKEN, lambda _oid: str(path))

    def stream() -> Generator[bytes, None, None]:
        return server.serve(transfer_pb2.PullRequest(object_id=b"id"), FakeContext(GOOD_METADATA))

    before = len(os.listdir("/proc/self/fd"))
    assert sum(len(decode_chunk(m).data) for m in stream()) == 2 * CHUNK_BYTES  # drained
    partial = stream()
    next(partial)
    assert len(os.listdir("/proc/self/fd")) == before + 1  # the open object file
    partial.close()  # a cancelled call
    unstarted = stream()  # cancelled before the first chunk was asked for
    del unstarted
    assert len(os.listdir("/proc/self/fd")) == before


def test_on_served_failure_does_not_fail_the_pull(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(b"payload")

    def broken(_oid: bytes, _node: bytes) -> None:
        raise RuntimeError("bookkeeping down")

    server = TransferServer("127.0.0.1", TOKEN, lambda _oid: str(path), broken)
    chunks = [decode_chunk(m) for m in server.serve(
        transfer_pb2.PullRequest(object_id=b"id"), FakeContext(GOOD_METADATA))]
    assert [(c.total_size, c.offset, bytes(c.data)) for c in chunks] == [(7, 0, b"payload")]


# -- the hand-coded Chunk wire format ------------------------------------------------------------


@pytest.mark.parametrize(("total", "offset", "data"), [
    (0, 0, b""), (5, 0, b"abcde"), (0, 1 << 20, b"x" * 300), (2**40 + 3, 0, b"\x00"),
    (0, 2**63 - 1, b"tail"), (127, 128, b"edge"),
])
def test_chunk_encoding_matches_protobuf(total: int, offset: int, data: bytes) -> None:
    encoded = encode_chunk(total, offset, data)
    assert encoded == transfer_pb2.Chunk(total_size=total, offset=offset,
                                         data=data).SerializeToString()
    parsed = transfer_pb2.Chunk.FromString(encoded)
    assert (parsed.total_size, parsed.offset, parsed.data) == (total, offset, data)
    decoded = decode_chunk(encoded)
    assert (decoded.total_size, decoded.offset, bytes(decoded.data)) == (total, offset, data)


def test_chunk_decoding_skips_unknown_fields_in_any_order() -> None:
    # data first, an unknown varint (field 9), an unknown fixed64 (field 10), then offset.
    message = (b"\x1a\x03abc" + b"\x48\x96\x01" + b"\x51" + b"\x00" * 8 + b"\x10\x05")
    decoded = decode_chunk(message)
    assert (decoded.total_size, decoded.offset, bytes(decoded.data)) == (0, 5, b"abc")


@pytest.mark.parametrize("message", [b"\x1a\x05abc", b"\x10", b"\x10\x80", b"\x0f\x01",
                                     b"\x10" + b"\xff" * 11])
def test_malformed_chunks_are_protocol_errors(message: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_chunk(message)


def test_pulls_through_the_generated_stub_parse_as_protobuf(holder: Holder) -> None:
    data = os.urandom(CHUNK_BYTES + 10)
    object_id = holder.put_bytes(data)
    chunks = _raw_pull(holder.address, GOOD_METADATA, object_id)
    assert [c.offset for c in chunks] == [0, CHUNK_BYTES]
    assert [c.total_size for c in chunks] == [len(data), 0]
    assert b"".join(c.data for c in chunks) == data
