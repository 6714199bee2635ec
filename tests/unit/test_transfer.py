"""Node-to-node object transfer: real sockets, an in-process server, tmp_path files.

Small objects travel through the chunked ``Pull`` RPC, large ones (``STREAM_MIN_BYTES`` and
up) on a side stream that ``OpenStream`` opens; the tests say which path they exercise.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import select
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
from rtml.objectstore import transfer_stream as ts
from rtml.objectstore.transfer import (
    CHUNK_BYTES,
    STREAM_MIN_BYTES,
    TransferServer,
    close_channels,
    pull,
)
from rtml.objectstore.transfer_wire import decode_chunk, encode_chunk
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
        self.path(object_id).chmod(0o600)  # as the store writes them: private to its user
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


def _private_file(path: Path, data: bytes) -> None:
    """An object file as a store writes it: mode 0600."""
    path.write_bytes(data)
    path.chmod(0o600)


def _leftovers(directory: Path) -> list[str]:
    return glob.glob(str(directory / "*.tmp"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fds() -> int:
    """Descriptors open in this process (server and client threads alike)."""
    return len(os.listdir("/proc/self/fd"))


def _no_fd_leak(before: int) -> bool:
    """Whether this process is back to at most ``before`` descriptors. gRPC's own sockets
    and pipes come and go in the background, so they get a moment to settle."""
    deadline = time.monotonic() + 2.0
    while _fds() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    return _fds() <= before


def _object_fds(holder: Holder) -> int:
    """Descriptors open on the holder's object files: exact, unlike ``_fds``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since listed
            count += os.readlink(f"/proc/self/fd/{name}").startswith(str(holder.directory))
    return count


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path each ``pull`` took, in order: "stream" (side stream) or "chunks" (Pull)."""
    taken: list[str] = []
    # Both are patched where ``_receive`` looks them up: ``transfer``'s namespace.
    for name, label in (("receive_stream", "stream"), ("_receive_chunks", "chunks")):
        original = getattr(tr, name)

        def spy(*args: Any, _original: Any = original, _label: str = label) -> Any:
            taken.append(_label)
            return _original(*args)

        monkeypatch.setattr(tr, name, spy)
    return taken


@pytest.fixture(params=["splice", "mmap"])
def receiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each side-stream receiver in turn (splice is the default where os.splice exists)."""
    monkeypatch.setattr(ts, "STREAM_RECEIVER", request.param)
    return str(request.param)


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


def test_a_file_others_may_write_is_not_served(holder: Holder, dest_dir: Path) -> None:
    object_id = holder.put_bytes(b"planted")
    holder.path(object_id).chmod(0o622)
    dest = dest_dir / "x"
    with pytest.raises(ObjectLostError, match="mode 622 lets others in"):
        pull(holder.address, TOKEN, object_id, str(dest))
    assert not dest.exists() and holder.served == []


def test_existing_dest_is_success_without_a_call(holder: Holder, dest_dir: Path) -> None:
    dest = dest_dir / "already"
    _private_file(dest, b"12345")
    missing = os.urandom(20)  # the holder does not even have it: no call is made
    assert pull(holder.address, TOKEN, missing, str(dest)) == 5
    assert dest.read_bytes() == b"12345"
    dest.chmod(0o644)  # not as the store writes them: not taken as pulled
    with pytest.raises(ObjectLostError, match="mode 644 lets others in"):
        pull(holder.address, TOKEN, missing, str(dest))
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


@pytest.mark.parametrize("size", [CHUNK_BYTES + 1, STREAM_MIN_BYTES + 1],
                         ids=["chunked", "side-stream"])
def test_concurrent_pulls_into_one_dest(holder: Holder, dest_dir: Path, size: int) -> None:
    data = os.urandom(size)
    object_id = holder.put_bytes(data)
    dest = dest_dir / "shared"
    results: list[int] = []
    threads = [threading.Thread(
        target=lambda: results.append(pull(holder.address, TOKEN, object_id, str(dest))))
        for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
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
    bad = ((tr.TOKEN_KEY, tr.transfer_key(TOKEN)), (tr.VERSION_KEY, str(PROTOCOL_VERSION + 1)))
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
        (tr.TOKEN_KEY, tr.transfer_key(token)), (tr.VERSION_KEY, str(PROTOCOL_VERSION + 1))))
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
    _private_file(path, os.urandom(3 * CHUNK_BYTES))
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
    _private_file(path, data)
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
    _private_file(path, os.urandom(2 * CHUNK_BYTES))
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
    _private_file(path, b"payload")

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


# -- the side stream -----------------------------------------------------------------------------


def _stub(channel: grpc.Channel) -> Any:
    return transfer_pb2_grpc.ObjectTransferStub(channel)


def _open_stream(channel: grpc.Channel, object_id: bytes,
                 metadata: tuple[tuple[str, str], ...] = GOOD_METADATA) -> Any:
    """``OpenStream`` through the generated stub, as a non-rtml client would call it."""
    return _stub(channel).OpenStream(transfer_pb2.PullRequest(object_id=object_id),
                                     metadata=metadata, timeout=10)


def _redeem(port: int, ticket: bytes) -> bytes:
    """Everything the side port sends for ``ticket`` until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(ticket)
        parts = []
        while part := conn.recv(1 << 20):
            parts.append(part)
    return b"".join(parts)


@pytest.fixture
def channel(holder: Holder) -> Iterator[grpc.Channel]:
    """A stub channel to the holder, connected (so its descriptors are open) before use."""
    with grpc.insecure_channel(holder.address) as chan:
        small = holder.put_bytes(b"warm-up")
        assert _open_stream(chan, small).ticket == b""  # small: no ticket, no descriptor
        holder.located.clear()
        yield chan


def test_large_object_round_trip_via_side_stream(holder: Holder, dest_dir: Path,
                                                 paths: list[str], receiver: str) -> None:
    array = np.random.default_rng(7).random((1000, 700))  # 5.6 MB of float64
    object_id = holder.put_value({"weights": array, "step": 9})
    original = holder.path(object_id).read_bytes()
    assert len(original) >= STREAM_MIN_BYTES
    dest = dest_dir / "copy"
    size = pull(holder.address, TOKEN, object_id, str(dest), requester_node=b"node-b")
    assert paths == ["stream"]
    assert size == len(original) == dest.stat().st_size
    assert dest.read_bytes() == original
    inband, buffers = read_segment(str(dest))
    value = pickle.loads(inband, buffers=buffers)
    assert value["step"] == 9
    np.testing.assert_array_equal(value["weights"], array)
    assert holder.served == [(object_id, b"node-b")]
    assert _leftovers(dest_dir) == []


@pytest.mark.parametrize(("size", "path"), [(STREAM_MIN_BYTES - 1, "chunks"),
                                            (STREAM_MIN_BYTES, "stream"),
                                            (STREAM_MIN_BYTES + 3 * CHUNK_BYTES + 5, "stream")])
def test_size_picks_the_path(holder: Holder, dest_dir: Path, paths: list[str], size: int,
                             path: str) -> None:
    data = os.urandom(size)
    object_id = holder.put_bytes(data)
    dest = dest_dir / "copy"
    assert pull(holder.address, TOKEN, object_id, str(dest)) == size
    assert paths == [path]
    assert dest.read_bytes() == data
    assert holder.served == [(object_id, b"")]
    assert holder.located == [object_id] * (2 if path == "chunks" else 1)  # OpenStream, Pull


def test_small_objects_use_pull(holder: Holder, dest_dir: Path, paths: list[str]) -> None:
    object_id = holder.put_bytes(b"small")
    assert pull(holder.address, TOKEN, object_id, str(dest_dir / "s")) == 5
    assert paths == ["chunks"]


def test_holder_without_open_stream_is_pulled_in_chunks(holder: Holder, dest_dir: Path,
                                                        paths: list[str]) -> None:
    """A holder from before side streams answers UNIMPLEMENTED: the puller uses Pull."""
    data = os.urandom(STREAM_MIN_BYTES + 1)
    object_id = holder.put_bytes(data)
    only_pull = grpc.unary_stream_rpc_method_handler(
        holder.server.serve, request_deserializer=transfer_pb2.PullRequest.FromString)
    old = grpc.server(tr.futures.ThreadPoolExecutor(2), handlers=[
        grpc.method_handlers_generic_handler(tr._SERVICE, {"Pull": only_pull})])
    address = f"127.0.0.1:{old.add_insecure_port('127.0.0.1:0')}"
    old.start()
    try:
        assert pull(address, TOKEN, object_id, str(dest_dir / "old")) == len(data)
    finally:
        close_channels()
        old.stop(0).wait()
    assert paths == ["chunks"]
    assert (dest_dir / "old").read_bytes() == data


def test_open_stream_authenticates_before_any_lookup(holder: Holder) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    bad_version = ((tr.TOKEN_KEY, tr.transfer_key(TOKEN)), (tr.VERSION_KEY, str(PROTOCOL_VERSION + 1)))
    with grpc.insecure_channel(holder.address) as chan:
        for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED),
                               (((tr.TOKEN_KEY, "nope"), (tr.VERSION_KEY, str(PROTOCOL_VERSION))),
                                grpc.StatusCode.UNAUTHENTICATED),
                               (bad_version, grpc.StatusCode.FAILED_PRECONDITION)):
            with pytest.raises(grpc.RpcError) as info:
                _open_stream(chan, object_id, metadata)
            assert info.value.code() == code
        with pytest.raises(grpc.RpcError) as info:
            _open_stream(chan, os.urandom(20))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(holder.located) == 1  # only the authenticated call looked anything up


def test_idle_side_connections_do_not_keep_a_pull_out(holder: Holder, dest_dir: Path,
                                                      paths: list[str]) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES + 3))
    idle = [socket.create_connection(("127.0.0.1", holder.server.stream_port))
            for _ in range(3 * ts._MAX_UNREDEEMED)]  # none shows a ticket
    try:
        time.sleep(0.2)
        dest = dest_dir / "copy"
        assert pull(holder.address, TOKEN, object_id, str(dest)) == STREAM_MIN_BYTES + 3
        assert paths == ["stream"]
        assert dest.read_bytes() == holder.path(object_id).read_bytes()
    finally:
        for sock in idle:
            sock.close()


def test_stub_client_can_use_the_side_stream(holder: Holder, channel: grpc.Channel) -> None:
    data = os.urandom(STREAM_MIN_BYTES + 17)
    object_id = holder.put_bytes(data)
    ticket = _open_stream(channel, object_id)
    assert (len(ticket.ticket), ticket.total_size) == (ts.TICKET_BYTES, len(data))
    assert _redeem(ticket.port, ticket.ticket) == data
    assert holder.served == [(object_id, b"")]  # recorded before the connection closed


def test_forged_ticket_gets_nothing(holder: Holder, channel: grpc.Channel,
                                    caplog: pytest.LogCaptureFixture) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    port = _open_stream(channel, object_id).port
    before = _fds()  # the real ticket holds one descriptor, counted here
    assert _redeem(port, os.urandom(ts.TICKET_BYTES)) == b""
    assert _object_fds(holder) == 1  # the real ticket's, untouched
    assert _no_fd_leak(before)
    assert "ticket unknown" in caplog.text
    assert holder.served == []


def test_reused_ticket_gets_nothing(holder: Holder, channel: grpc.Channel,
                                    caplog: pytest.LogCaptureFixture) -> None:
    data = os.urandom(STREAM_MIN_BYTES + 1)
    object_id = holder.put_bytes(data)
    before = _fds()
    ticket = _open_stream(channel, object_id)
    assert _object_fds(holder) == 1  # the open object file, owned by the ticket
    assert _redeem(ticket.port, ticket.ticket) == data
    assert _object_fds(holder) == 0  # closed before the connection was
    assert _redeem(ticket.port, ticket.ticket) == b""
    assert _no_fd_leak(before)
    assert "ticket already used" in caplog.text
    assert holder.served == [(object_id, b"")]


def test_expired_ticket_gets_nothing(holder: Holder, channel: grpc.Channel,
                                     caplog: pytest.LogCaptureFixture) -> None:
    holder.server.ticket_ttl = 0.2
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    before = _fds()
    ticket = _open_stream(channel, object_id)
    time.sleep(0.4)
    assert _redeem(ticket.port, ticket.ticket) == b""
    assert _object_fds(holder) == 0
    assert _no_fd_leak(before)
    assert "ticket expired" in caplog.text
    assert holder.served == []


def test_unused_ticket_closes_its_descriptor_when_it_expires(holder: Holder,
                                                             channel: grpc.Channel) -> None:
    holder.server.ticket_ttl = 0.2
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    before = _fds()
    _open_stream(channel, object_id)
    assert _object_fds(holder) == 1
    deadline = time.monotonic() + 5  # the listener sweeps at least once a second
    while _object_fds(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _object_fds(holder) == 0
    assert _no_fd_leak(before)


def test_stop_closes_the_side_port_and_pending_tickets(holder: Holder,
                                                       channel: grpc.Channel) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    before = _fds()
    ticket = _open_stream(channel, object_id)
    assert _object_fds(holder) == 1
    holder.server.stop(0)
    assert _object_fds(holder) == 0  # the pending ticket's file is closed
    assert _no_fd_leak(before)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", ticket.port), timeout=5)


def test_connection_without_ticket_is_closed_after_the_wait(
        holder: Holder, caplog: pytest.LogCaptureFixture) -> None:
    holder.server.ticket_wait = 0.3
    port = holder.server.stream_port
    before = _fds()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"x" * (ts.TICKET_BYTES - 1))  # one byte short, then silence
        started = time.monotonic()
        assert conn.recv(1) == b""
        waited = time.monotonic() - started
    assert 0.2 < waited < 3.0
    assert _no_fd_leak(before)
    assert "no ticket within 0.3s (31 of 32 bytes)" in caplog.text


def test_refused_ticket_is_a_system_error(holder: Holder, dest_dir: Path) -> None:
    holder.server.ticket_ttl = 0.0  # expired on arrival
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    with pytest.raises(RtmlSystemError, match="without sending anything") as info:
        pull(holder.address, TOKEN, object_id, str(dest_dir / "x"))
    assert holder.address in str(info.value) and object_id.hex() in str(info.value)
    assert os.listdir(dest_dir) == []
    assert holder.served == []


def test_holder_stopping_mid_transfer(holder: Holder, dest_dir: Path,
                                      monkeypatch: pytest.MonkeyPatch, receiver: str) -> None:
    object_id = holder.put_bytes(os.urandom(48 * 1024 * 1024))  # far more than socket buffers
    original = ts._RECEIVERS[receiver]

    def stop_then_receive(conn: socket.socket, fd: int, total: int, job: Any) -> int:
        select.select([conn], [], [], 10)  # the first bytes are here: the holder is sending
        holder.server.stop(0)  # cuts the stream its thread is blocked in
        return original(conn, fd, total, job)

    monkeypatch.setitem(ts._RECEIVERS, receiver, stop_then_receive)
    dest = dest_dir / "cut"
    # The holder's side ends with a FIN (a short read) or, at times, a reset.
    with pytest.raises(RtmlSystemError,
                       match=r"closed the side stream .* after \d+ of|side stream .* failed .*"
                             "Connection reset") as info:
        pull(holder.address, TOKEN, object_id, str(dest))
    message = str(info.value)
    assert holder.address in message and object_id.hex() in message
    assert os.listdir(dest_dir) == []  # neither dest nor the temporary file
    assert holder.served == []


def test_object_shrinking_before_the_side_stream_is_cut_short(
        holder: Holder, dest_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES + 100))
    original = ts._connect

    def truncate_then_connect(job: Any, ticket: Any) -> socket.socket:
        os.truncate(holder.path(object_id), 1000)  # the open descriptor sees it too
        return original(job, ticket)

    monkeypatch.setattr(ts, "_connect", truncate_then_connect)
    with pytest.raises(RtmlSystemError, match=f"after 1000 of {STREAM_MIN_BYTES + 100} bytes"):
        pull(holder.address, TOKEN, object_id, str(dest_dir / "short"))
    assert os.listdir(dest_dir) == []
    assert holder.served == []
    assert f"object {object_id.hex()} shrank" in caplog.text


def test_side_stream_that_stalls_times_out(holder: Holder, dest_dir: Path,
                                           receiver: str) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never sends
        holder.server.stream_port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RtmlSystemError, match="took longer than 0.5s on its side stream"):
            pull(holder.address, TOKEN, object_id, str(dest_dir / "slow"), timeout=0.5)
    assert time.monotonic() - started < 5.0
    assert os.listdir(dest_dir) == []


def test_unreachable_side_port_is_a_system_error(holder: Holder, dest_dir: Path) -> None:
    object_id = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    holder.server.stream_port = _free_port()  # nothing listens there
    with pytest.raises(RtmlSystemError, match="its side stream .* failed") as info:
        pull(holder.address, TOKEN, object_id, str(dest_dir / "x"))
    assert holder.address in str(info.value)
    assert os.listdir(dest_dir) == []


def test_concurrent_large_pulls_of_one_object(holder: Holder, dest_dir: Path,
                                              paths: list[str], receiver: str) -> None:
    data = os.urandom(STREAM_MIN_BYTES + CHUNK_BYTES + 3)
    object_id = holder.put_bytes(data)
    sizes: dict[int, int] = {}
    errors: list[BaseException] = []

    def fetch(i: int) -> None:
        try:
            sizes[i] = pull(holder.address, TOKEN, object_id, str(dest_dir / f"copy{i}"),
                            requester_node=b"node-%d" % i)
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sizes == {i: len(data) for i in range(6)}
    for i in range(6):
        assert (dest_dir / f"copy{i}").read_bytes() == data
    assert paths == ["stream"] * 6
    assert sorted(holder.served) == sorted((object_id, b"node-%d" % i) for i in range(6))
    assert _leftovers(dest_dir) == []


def test_on_served_once_per_completed_pull(holder: Holder, dest_dir: Path) -> None:
    large = holder.put_bytes(os.urandom(STREAM_MIN_BYTES))
    small = holder.put_bytes(b"tiny")
    for name, object_id, node in (("a", large, b"n1"), ("b", large, b"n2"), ("c", small, b"n3")):
        pull(holder.address, TOKEN, object_id, str(dest_dir / name), requester_node=node)
    pull(holder.address, TOKEN, large, str(dest_dir / "a"), requester_node=b"n4")  # exists
    assert holder.served == [(large, b"n1"), (large, b"n2"), (small, b"n3")]
