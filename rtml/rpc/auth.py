"""The authentication rule every listening socket applies to its first frame, and the
one every connecting side applies to the answer.

Nothing a peer sends is acted on (and nothing is ever unpickled) until its
first frame is a ``Hello`` carrying the cluster token and our protocol version.
"""

from __future__ import annotations

import hmac

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m

HELLO_MAX_FRAME = 1 << 20
"""The largest first frame (each way) read before the peer is known."""


def check_hello(msg: object, token: str) -> m.Hello:
    """Return ``msg`` if it is a valid Hello for ``token``; else raise ProtocolError."""
    if not isinstance(msg, m.Hello):
        raise ProtocolError(f"first frame must be Hello, got {type(msg).__name__}")
    if not hmac.compare_digest(msg.token.encode(), token.encode()):
        raise ProtocolError("wrong cluster token (pass --token or set RTML_TOKEN)")
    if msg.version != m.PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {msg.version} is not supported (this node speaks "
            f"{m.PROTOCOL_VERSION}); run the same rtml version on every node")
    return msg


def check_reply(msg: object) -> m.HelloReply:
    """Return ``msg`` if it is a HelloReply that admits us; else raise ProtocolError."""
    if not isinstance(msg, m.HelloReply):
        raise ProtocolError(f"expected HelloReply, got {type(msg).__name__}")
    if not msg.ok:
        raise ProtocolError(f"handshake refused: {msg.error}")
    return msg
