"""NodeLinks: fences answered after everything sent before them, never left hanging; the
other end's answers delivered."""

from __future__ import annotations

import asyncio
import socket

from rtml.node.links import NodeLinks
from rtml.rpc import messages as m
from rtml.rpc.auth import challenge, check_hello, sign
from rtml.rpc.client import make_hello
from rtml.rpc.framing import FrameDecoder, frame

NODE = b"n" * 16
TOKEN = "t" * 32


class PeerNode:
    """A node manager's link end: accepts the hello, records messages, answers fences
    (after ``delay``, to show the fence waits for it)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.seen: list[object] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        sent = challenge()
        writer.write(frame(m.encode(sent)))
        while data := await reader.read(1 << 16):
            for payload in decoder.feed(data):
                msg = m.decode(payload)
                self.seen.append(msg)
                if isinstance(msg, m.Hello):
                    hello = check_hello(msg, TOKEN, sent)
                    writer.write(frame(m.encode(sign(m.HelloReply(ok=True), TOKEN, hello,
                                                     sent))))
                elif isinstance(msg, m.LinkFence):
                    await asyncio.sleep(self.delay)
                    writer.write(frame(m.encode(m.LinkFenced(msg.req_id))))
                elif isinstance(msg, m.LocateObject):
                    writer.write(frame(m.encode(m.ObjectLocated(msg.req_id, msg.object_id,
                                                                NODE))))
        writer.close()


def _links(answers: list[object] | None = None) -> NodeLinks:
    return NodeLinks(TOKEN, make_hello("node", b"me" * 8),
                     (answers if answers is not None else []).append)


def test_a_fence_returns_after_the_messages_sent_before_it_are_handled() -> None:
    async def scenario() -> list[object]:
        peer = PeerNode(delay=0.05)
        server = await asyncio.start_server(peer.serve, "127.0.0.1", 0)
        links = _links()
        port = server.sockets[0].getsockname()[1]
        links.address_known(NODE, f"127.0.0.1:{port}")
        links.send(NODE, m.AddHolds([b"o" * 20], b"h" * 16))
        await asyncio.wait_for(links.fence(NODE), 5)
        kinds = [type(msg) for msg in peer.seen]
        links.close()
        server.close()
        return kinds

    assert asyncio.run(scenario()) == [m.Hello, m.AddHolds, m.LinkFence]


def test_a_fence_to_an_unreachable_node_returns() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> None:
        links = _links()
        links.address_known(NODE, f"127.0.0.1:{port}")
        await asyncio.wait_for(links.fence(NODE), 15)
        links.close()

    asyncio.run(scenario())


def test_forgetting_a_dead_node_releases_its_fences() -> None:
    async def scenario() -> bool:
        links = _links()  # the node's address never arrives: the fence stays queued
        fence = asyncio.ensure_future(links.fence(NODE))
        await asyncio.sleep(0.05)
        pending = not fence.done()
        links.forget(NODE)
        await asyncio.wait_for(fence, 5)
        return pending

    assert asyncio.run(scenario()) is True


def test_answers_other_than_fences_reach_on_answer() -> None:
    async def scenario() -> list[object]:
        peer = PeerNode()
        server = await asyncio.start_server(peer.serve, "127.0.0.1", 0)
        answers: list[object] = []
        links = _links(answers)
        links.address_known(NODE, f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        links.send(NODE, m.LocateObject(7, b"o" * 20, b"c" * 16))
        await asyncio.wait_for(links.fence(NODE), 5)  # answered after the locate
        links.close()
        server.close()
        return answers

    assert asyncio.run(scenario()) == [m.ObjectLocated(7, b"o" * 20, NODE)]
