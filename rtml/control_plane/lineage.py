"""What the task table keeps of each call, for replay (``rtml debug``): its spec, with
its inline arguments while they are small.

    owner (a task ran) --(RAN, ..., spec)--> BatchedWriter's thread --kept_call(spec)-->
        the TaskSpec, encoded as it is (function id, arguments, options)
                                                          its inline arguments <= 8 KiB
        {"spec": the TaskSpec without its arguments, "args_dropped": their bytes}  larger
    an actor call: its actor id only (it cannot be replayed: its actor's state is not kept)

Arguments in the object store are kept as their ids (a replay reads them while they
live); inline ones are copied into the table, so they are capped: the table keeps
``RTML_TASK_RECORDS_KEPT`` records (100,000 by default), and 8 KiB each bounds it to
~800 MB at worst. The cap is applied on the writer's thread, never on the path of a task.
"""

from __future__ import annotations

from typing import Any

import msgspec

CALL_ARGS_KEPT = 8 * 1024
"""Bytes of inline arguments a task record keeps for replay; a call with more keeps its
function and options only (its replay says why it cannot run)."""


def kept_call(spec: Any) -> Any:
    """The call record of ``spec`` (a TaskSpec): the spec itself, or when its inline
    arguments are over CALL_ARGS_KEPT, ``{"spec": it without them, "args_dropped": their
    bytes}``. (Most tasks take the first branch after one loop over their arguments: the
    writer's thread runs this for every task, in the driver's process.)"""
    size = 0
    for arg in spec.args:
        value = arg.value
        if value is not None:
            size += len(value.data)
            if value.buffers:
                size += sum(len(buffer) for buffer in value.buffers)
    if size <= CALL_ARGS_KEPT:
        return spec
    return {"spec": msgspec.structs.replace(spec, args=()), "args_dropped": size}
