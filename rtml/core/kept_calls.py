"""What the task table keeps of each call, for replay (``rtml debug``): its arguments
(inline ones while they are small) and its options; the task's function, name and job
are in its submission record already.

    owner, a task ran: _lineage(record, result) --kept_call(spec)-->
        (RAN, ..., (args, kwarg_names, num_returns, resources))      inline args <= 8 KiB
        (RAN, ..., (bytes of inline args dropped, kwarg_names, ...))  larger
        (RAN, ..., actor id)            an actor call (not replayable: its actor's state
                                        is not kept)
    --> BatchedWriter --> the task table --> ControlPlane.task_call --> debug.KeptCall (replay)

Built on the owner's thread as the outcome record is (compiled: a loop over the call's
arguments and a 4-tuple, tens of nanoseconds), so the writer's thread only encodes it:
a no-argument call adds five bytes to its record. Arguments in the object store are
kept as their ids (a replay reads them while they live); inline ones are copied into the
table, so they are capped: the table keeps ``RTML_TASK_RECORDS_KEPT`` records (100,000
by default), and 8 KiB each bounds it to ~800 MB at worst.
"""

from __future__ import annotations

from rtml.rpc import messages as m

CALL_ARGS_KEPT = 8 * 1024
"""Bytes of inline arguments a task record keeps for replay; a call with more keeps its
options only (its replay says why it cannot run)."""


def kept_call(spec: m.TaskSpec) -> tuple[object, ...]:
    """What the outcome record of ``spec``'s task keeps of its call (see the module's
    diagram): a tuple laid out as ``rtml.debug.KeptCall``, which reads it back (a struct
    defined here would be compiled, and mypyc does not keep a msgspec struct's options)."""
    size = 0
    for arg in spec.args:
        value = arg.value
        if value is not None:
            size += len(value.data)
            for buffer in value.buffers:
                size += len(buffer)
    args: object = spec.args if size <= CALL_ARGS_KEPT else size
    return (args, spec.kwarg_names, spec.num_returns, spec.resources)
