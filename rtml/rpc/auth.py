"""The handshake every connection opens with: both sides prove they hold the cluster
token, and neither sends it (``rtml.rpc.protocols.base`` draws the three frames).

    listener: challenge()            --Challenge(version, S)-->
    connector: answer(challenge_of(msg), token, hello)  <--Hello(nonce C, proof)--
    listener: check_hello(msg, token, challenge); sign(reply, ...)  --HelloReply(proof)-->
    connector: check_reply(msg, token, hello, challenge)

A proof is an HMAC-SHA256 of both nonces under the token, each side's labelled apart, so
a captured handshake answers no other challenge (the listener's nonce is fresh each
time), and a listener that does not hold the token (an impostor's socket in a session
directory) cannot answer the connector's fresh nonce. Nothing a peer sends is acted on,
and nothing is ever unpickled, before its proof checks.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import msgspec

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m

HELLO_MAX_FRAME = 16 << 10
"""The largest handshake frame (each way) read before the peer is known."""
NONCE_BYTES = 16


def challenge(tls: bool = False) -> m.Challenge:
    """A listener's first frame, with a fresh nonce; ``tls``: TLS follows it."""
    return m.Challenge(m.PROTOCOL_VERSION, os.urandom(NONCE_BYTES), tls)


def proof(token: str, side: bytes, first: bytes, second: bytes, binding: bytes = b"") -> bytes:
    """``side``'s proof (b"client" or b"server") that it holds ``token``: an HMAC-SHA256 of
    the nonces, its own last, and of the TLS channel binding if any (``rtml.rpc.tls``).
    Launchpad's wire proves its program token the same way."""
    return hmac.new(token.encode(), side + first + second + binding, hashlib.sha256).digest()


def challenge_of(msg: object) -> m.Challenge:
    """``msg`` if it is a listener's Challenge of our protocol version; else raise
    ProtocolError."""
    if not isinstance(msg, m.Challenge):
        raise ProtocolError(f"expected the listener's Challenge, got {type(msg).__name__} "
                            "(is it an rtml daemon, of this version?)")
    if msg.version != m.PROTOCOL_VERSION:
        raise ProtocolError(f"the listener speaks protocol version {msg.version}, this "
                            f"process {m.PROTOCOL_VERSION}; run the same rtml version on "
                            "every node")
    return msg


def answer(received: m.Challenge, token: str, hello: m.Hello, binding: bytes = b""
           ) -> m.Hello:
    """``hello`` answering ``received``: a fresh nonce and its proof (bound to the TLS
    certificate seen, ``binding``)."""
    nonce = os.urandom(NONCE_BYTES)
    return msgspec.structs.replace(
        hello, nonce=nonce, proof=proof(token, b"client", received.nonce, nonce, binding))


def check_hello(msg: object, token: str, sent: m.Challenge, binding: bytes = b""
                ) -> m.Hello:
    """Return ``msg`` if it is a Hello that answers ``sent`` under ``token`` (through the
    TLS certificate whose binding is ``binding``); else raise ProtocolError."""
    if not isinstance(msg, m.Hello):
        raise ProtocolError(f"first frame must be Hello, got {type(msg).__name__}")
    if msg.version != m.PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {msg.version} is not supported (this node speaks "
            f"{m.PROTOCOL_VERSION}); run the same rtml version on every node")
    expected = proof(token, b"client", sent.nonce, msg.nonce, binding)
    if len(msg.nonce) != NONCE_BYTES or not hmac.compare_digest(msg.proof, expected):
        raise ProtocolError("wrong cluster token (pass --token or set RTML_TOKEN), or a "
                            "TLS connection through another certificate than this "
                            "listener's (a man in the middle)" if binding else
                            "wrong cluster token (pass --token or set RTML_TOKEN)")
    return msg


def sign(reply: m.HelloReply, token: str, hello: m.Hello, sent: m.Challenge,
         binding: bytes = b"") -> m.HelloReply:
    """``reply`` with the listener's proof, for the connector to check."""
    reply.proof = proof(token, b"server", hello.nonce, sent.nonce, binding)
    return reply


def check_reply(msg: object, token: str, hello: m.Hello, received: m.Challenge,
                binding: bytes = b"") -> m.HelloReply:
    """Return ``msg`` if it is a HelloReply that admits us and proves the listener holds
    the token; else raise ProtocolError."""
    if not isinstance(msg, m.HelloReply):
        raise ProtocolError(f"expected HelloReply, got {type(msg).__name__}")
    if not msg.ok:
        raise ProtocolError(f"handshake refused: {msg.error}")
    if not hmac.compare_digest(msg.proof, proof(token, b"server", hello.nonce,
                                                 received.nonce, binding)):
        raise ProtocolError("the listener did not prove it holds the cluster token: it is "
                            "not this cluster's (an impostor, or another cluster's)")
    return msg
