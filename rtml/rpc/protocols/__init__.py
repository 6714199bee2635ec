"""The wire protocols, one module each (``base`` is what they share); assembled, with
their codec, by ``rtml.rpc.messages``."""

__all__ = ["base", "head", "link", "node", "task"]
