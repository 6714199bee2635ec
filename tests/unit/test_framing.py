"""rtml/rpc/framing.py (FrameDecoder) and rtml/rpc/messages.py round trips."""

from __future__ import annotations

import struct

import msgspec
import pytest

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m
from rtml.rpc.framing import HEADER_SIZE, FrameDecoder, frame


def test_frame_prefixes_big_endian_length() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert HEADER_SIZE == 4


def test_single_and_multiple_frames_in_one_feed() -> None:
    dec = FrameDecoder()
    assert dec.feed(frame(b"hello")) == [b"hello"]
    assert dec.feed(frame(b"a") + frame(b"") + frame(b"bc")) == [b"a", b"", b"bc"]


def test_frame_split_at_every_byte() -> None:
    payloads = [b"first", b"", b"x" * 300, bytes(range(256))]
    data = b"".join(frame(p) for p in payloads)
    dec = FrameDecoder()
    out: list[bytes] = []
    for i in range(len(data)):
        out.extend(dec.feed(data[i:i + 1]))
    assert out == payloads


def test_split_header_and_body_across_feeds() -> None:
    dec = FrameDecoder()
    data = frame(b"payload") + frame(b"second")
    assert dec.feed(data[:2]) == []
    assert dec.feed(data[2:6]) == []
    assert dec.feed(data[6:13]) == [b"payload"]
    assert dec.feed(data[13:]) == [b"second"]
    assert dec.feed(b"") == []


def test_a_reused_read_buffer_keeps_split_frames_intact() -> None:
    # As the reactor reads: every read lands in one buffer, overwritten by the next.
    buffer = bytearray(64)
    view = memoryview(buffer)
    dec = FrameDecoder()
    first, second = frame(b"abc"), frame(b"defghij")
    chunk = first + second[:6]
    buffer[:len(chunk)] = chunk
    frames = dec.feed(view[:len(chunk)])
    assert [bytes(f) for f in frames] == [b"abc"]  # read before the buffer is reused
    rest = second[6:] + frame(b"k")
    buffer[:len(rest)] = rest  # overwrites where the split frame's start was read
    assert [bytes(f) for f in dec.feed(view[:len(rest)])] == [b"defghij", b"k"]
    assert dec.pending() == b""


def test_trailing_partial_frame_is_kept() -> None:
    dec = FrameDecoder()
    data = frame(b"one") + frame(b"two")
    assert dec.feed(data[:-1]) == [b"one"]
    assert dec.feed(data[-1:]) == [b"two"]


def test_frame_at_the_limit_is_accepted() -> None:
    dec = FrameDecoder(max_frame=8)
    assert dec.feed(frame(b"12345678")) == [b"12345678"]


def test_oversized_frame_raises_protocol_error_before_body_arrives() -> None:
    dec = FrameDecoder(max_frame=8)
    with pytest.raises(ProtocolError):
        dec.feed(struct.pack(">I", 9))  # header only: rejected without buffering a body


def test_huge_length_header_rejected_with_default_limit() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(b"\xff\xff\xff\xff")


def test_oversized_frame_after_valid_frame() -> None:
    dec = FrameDecoder(max_frame=4)
    with pytest.raises(ProtocolError):
        dec.feed(frame(b"ok") + struct.pack(">I", 1000))


def test_protocol_error_is_an_rtml_error() -> None:
    from rtml.exceptions import RtmlError
    assert issubclass(ProtocolError, RtmlError)


def _spec() -> m.TaskSpec:
    return m.TaskSpec(
        task_id=b"t" * 16, job_id=b"j" * 4, name="mod.f", function_id=b"f" * 20,
        args=(m.TaskArg(value=m.Payload(b"data", (b"buf1", b"buf2"))),
              m.TaskArg(object_id=b"o" * 24)),
        kwarg_names=("k",), num_returns=2, owner_id=b"w" * 16, attempt=1, gpu_ids=(0, 1))


SAMPLES = [
    m.Challenge(m.PROTOCOL_VERSION, b"s" * 16),
    m.Hello(m.PROTOCOL_VERSION, "driver", b"c" * 16, 123, b"j" * 4, ["/a", "/b"],
            nonce=b"n" * 16, proof=b"p" * 32),
    m.HelloReply(True, "", b"n" * 16, {"store_dir": "/dev/shm/rtml-abc"}),
    m.PushTask(_spec()),
    m.TaskResult(b"t" * 16, (m.ReturnObject(b"o" * 24, m.Payload(b"v"), 1),
                             m.ReturnObject(b"p" * 24, None, 4096, is_error=True)),
                 1.5, 2500, 99, b"n" * 16, cancelled=True, args_us=0, ran_us=1800),
    m.RequestLease(7, {"CPU": 1.0, "GPU": 0.5, "custom": 2.0}),
    m.LeaseGranted(7, 3, b"w" * 16, "unix:/tmp/x.sock", (1,)),
    m.LeaseFailed(7, "infeasible"),
    m.ReturnLease(3),
    m.WorkerBlocked(),
    m.WorkerUnblocked(),
    m.SealObject(b"o" * 24, 100, b"h" * 16),
    m.AddHolds([b"a" * 24, b"b" * 24], b"h" * 16),
    m.ReleaseHolds([b"a" * 24], b"h" * 16),
    m.WaitObject(5, b"o" * 24, b"w" * 16),
    m.ObjectAvailable(5, b"o" * 24, "lost"),
    m.CancelTask(b"t" * 16, b"w" * 16, True),
    m.StoreStats(1),
    m.StoreStatsReply(1, {"num_objects": 2, "used_bytes": 10}),
    m.BecomeActor(m.ActorSpec(b"a" * 16, b"j" * 4, b"w" * 16, b"c" * 20, "Counter", (),
                              (), {"CPU": 1.0}, {}, max_restarts=1, name="n",
                              namespace="ns", detached=True), (2,)),
    m.ActorInfo(4, b"a" * 16, "ALIVE", "unix:/x", "", None),
    m.KillActor(b"a" * 16, no_restart=False),
    m.ClusterInfo(9, [m.NodeInfo(b"n" * 16, True, "10.0.0.2:7000", {"CPU": 2.0}, {"CPU": 1.0}, "/tmp/s")]),
    m.Shutdown(),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda msg: type(msg).__name__)
def test_message_round_trip(msg: m.Msg) -> None:
    data = m.encode(msg)
    back = m.decode(data)
    assert type(back) is type(msg)
    assert back == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda msg: type(msg).__name__)
def test_message_round_trip_through_frames(msg: m.Msg) -> None:
    dec = FrameDecoder()
    data = frame(m.encode(msg)) * 2
    got = dec.feed(data[:5]) + dec.feed(data[5:])
    assert [m.decode(p) for p in got] == [msg, msg]


def test_message_tags_are_unique() -> None:
    tags = {}
    for cls in m.Msg.__subclasses__():
        tag = cls.__struct_config__.tag
        assert tag not in tags, f"{cls.__name__} and {tags[tag]} share tag {tag}"
        tags[tag] = cls.__name__


def test_decoding_garbage_raises() -> None:
    with pytest.raises(msgspec.DecodeError):
        m.decode(b"\xc1\xc1\xc1")
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        m.decode(msgspec.msgpack.encode([9999, "x"]))  # unknown tag


def test_messages_decoded_and_built_are_not_tracked_by_the_collector() -> None:
    import gc
    spec = m.TaskSpec(b"t" * 16, b"job", "f", b"", (m.TaskArg(value=m.Payload(b"x")),), (), 1,
                      b"o" * 16)
    pushed = m.decode(m.encode(m.PushTask(spec)))
    assert isinstance(pushed, m.PushTask) and pushed.spec == spec
    result = m.TaskResult(b"t" * 16, (m.ReturnObject(b"r", m.Payload(b"v")),), 0.0, 0, 1,
                          b"n")
    for value in (spec, spec.args[0], spec.args[0].value, pushed, pushed.spec, result):
        assert not gc.is_tracked(value), type(value).__name__
    # A task's sequences, decoded or defaulted, are tuples: an empty one is shared and
    # untracked (a list is always tracked, and the collector walks it).
    plain = m.decode(m.encode(m.PushTask(m.TaskSpec(b"t" * 16, b"job", "f", b"", (), (), 1,
                                                    b"o" * 16, gpu_ids=(0,)))))
    assert isinstance(plain, m.PushTask)
    assert type(plain.spec.gpu_ids) is tuple and plain.spec.gpu_ids == (0,)
    for seq in (plain.spec.args, plain.spec.kwarg_names, spec.gpu_ids, m.Payload(b"v").buffers):
        assert type(seq) is tuple and not seq and not gc.is_tracked(seq)
