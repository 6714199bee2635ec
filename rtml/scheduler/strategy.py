"""A scheduling strategy's wire form, in one place: written by the client runtime
(``rtml.core.options``), read by the node manager's lease router and the head.

    ""                  DEFAULT: the caller's node while it has room, else where it fits
    "SPREAD"            over the nodes that fit, one after another
    "node:<hex>"        NodeAffinitySchedulingStrategy(node_id, soft=False): there or fail
    "node:<hex>:soft"   NodeAffinitySchedulingStrategy(node_id, soft=True): there if it can
"""

from __future__ import annotations

from rtml.ids import NodeID

DEFAULT = ""
SPREAD = "SPREAD"


def affinity(node_hex: str, soft: bool) -> str:
    return f"node:{node_hex}" + (":soft" if soft else "")


def parse_affinity(strategy: str) -> tuple[NodeID, bool] | None:
    """``"node:<hex>[:soft]"`` -> (node id, soft); None for other strategies."""
    if not strategy.startswith("node:"):
        return None
    _, hex_id, *rest = strategy.split(":")
    return NodeID(bytes.fromhex(hex_id)), rest == ["soft"]
