"""The node's shared-memory object store.

``segment`` is the on-disk format (one object per file in the node's store directory,
mapped read-only and zero-copy by readers); ``private`` makes and checks that directory
(in ``/dev/shm``, open to the cluster's user alone) and every file read from it; ``store`` is the sans-I/O core that the
node manager drives (holds, LRU spilling, restores, deferred deletion); ``remote``
counts the holds other nodes have on this node's objects; ``transfer`` moves objects
between nodes (its ``transfer_stream`` and ``transfer_wire`` are private). The shell
that drives them is ``rtml.node.objects``.
"""

from __future__ import annotations

from rtml.objectstore.private import (
    check_store_dir,
    create_store_dir,
    open_private,
    remove_store_dir,
    store_dir_of,
    store_dirs,
)
from rtml.objectstore.segment import (
    copy_file,
    existing_size,
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
    "private",
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
    "check_store_dir",
    "copy_file",
    "create_store_dir",
    "existing_size",
    "open_private",
    "read_segment",
    "remove_store_dir",
    "segment_path",
    "spill_path",
    "store_dir_of",
    "store_dirs",
    "write_segment",
]
