"""The node's shared-memory object store.

``segment`` is the on-disk format (one object per ``/dev/shm`` file, mapped
read-only and zero-copy by readers); ``store`` is the sans-I/O core that the
node manager drives (holds, LRU spilling, restores, deferred deletion); ``remote``
counts the holds other nodes have on this node's objects; ``transfer`` moves objects
between nodes (its ``transfer_stream`` and ``transfer_wire`` are private). The shell
that drives them is ``rtml.node.objects``.
"""

from __future__ import annotations

from rtml.objectstore.segment import (
    copy_file,
    read_segment,
    segment_path,
    spill_path,
    write_segment,
)
from rtml.objectstore.store import (
    Delete,
    NotifyLost,
    NotifyReady,
    Restore,
    Spill,
    StoreCore,
)

__all__ = [
    "remote",
    "segment",
    "store",
    "transfer",
    "Delete",
    "NotifyLost",
    "NotifyReady",
    "Restore",
    "Spill",
    "StoreCore",
    "copy_file",
    "read_segment",
    "segment_path",
    "spill_path",
    "write_segment",
]
