"""The wire protocols (rtml.rpc.protocols): each message in one protocol, every one decodable."""

from __future__ import annotations

import typing

import msgspec
import pytest

from rtml.rpc import messages as m
from rtml.rpc.protocols import base, head, link, node, task

PROTOCOLS = {"task": task, "node": node, "link": link, "head": head}


def defined(module: object) -> set[type]:
    return {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, m.Msg)
            and v is not m.Msg and v.__module__ == module.__name__}  # type: ignore[attr-defined]


def test_each_protocol_lists_exactly_the_messages_it_defines() -> None:
    for name, module in PROTOCOLS.items():
        assert set(typing.get_args(module.Message)) == defined(module), name
    assert set(typing.get_args(base.Handshake)) == defined(base) == {m.Challenge, m.Hello,
                                                                     m.HelloReply}


def test_the_codec_decodes_every_message_of_every_protocol_and_tags_are_unique() -> None:
    everything = set().union(*(defined(module) for module in (base, *PROTOCOLS.values())))
    assert set(typing.get_args(m.Message)) == everything
    tags = [cls.__struct_config__.tag for cls in everything]
    assert len(tags) == len(set(tags))
    assert all(getattr(m, cls.__name__) is cls for cls in everything)


@pytest.mark.parametrize("msg", [
    m.Hello(m.PROTOCOL_VERSION, "driver", b"c" * 16, 1),
    m.PushTask(m.TaskSpec(b"t" * 20, b"j" * 4, "f", b"x" * 16, (), (), 1, b"o" * 16)),
    m.RequestLease(3, {"CPU": 1.0}, strategy="SPREAD"),
    m.LinkFence(9),
    m.LocateObject(4, b"o" * 20, b"c" * 16),
    m.ObjectLocated(4, b"o" * 20, b"", "gone", owner_died=True),
    m.ReleaseHolder(b"o" * 20, b"n" * 16),
    m.ActorInfo(1, b"a" * 16, "ALIVE", "unix:/w"),
], ids=lambda msg: type(msg).__name__)
def test_a_message_round_trips_as_its_own_class(msg: m.Msg) -> None:
    assert m.decode(m.encode(msg)) == msg


def test_an_unknown_tag_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        m.decode(msgspec.msgpack.encode([999, "x"]))
