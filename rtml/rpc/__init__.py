"""The wire: framing, the typed messages (``protocols``, one module per protocol, and
``messages``, all of them with their codec), the token handshake (``auth``), the caps on
connections that have not passed it (``admission``), and the connections that
carry them (``reactor``: the client runtime's threads; ``server``: the asyncio daemons'
side; ``client``: an asyncio client of a daemon); ``tls``: optional TLS on the TCP
listeners, bound to the token's proofs; ``protos``: the gRPC transfer service."""

__all__ = ["admission", "auth", "client", "framing", "messages", "protos", "reactor", "server", "tls"]
