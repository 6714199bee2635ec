"""The authentication rule every listening socket applies to its first frame.

Nothing a peer sends is acted on (and nothing is ever unpickled) until its
first frame is a ``Hello`` carrying the cluster token and our protocol version.
"""

from __future__ import annotations

import hmac

from rtml.exceptions import ProtocolError
from rtml.rpc import messages as m


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
