"""Building a task's argument list on the owner side.

Plain values are pickled inline (or put into shared memory when large). A
top-level ``ObjectRef`` is replaced by its value: inline if the owner already
has it, by id if it lives in shared memory or is owned elsewhere (the worker
reads it), or left pending until the owner's own task produces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rtml.config import INLINE_MAX
from rtml.core.object_ref import ObjectRef
from rtml.core.serialization import plain_payload, serialize
from rtml.ids import ObjectID
from rtml.rpc import messages as m

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime


class BuiltArgs:
    __slots__ = ("args", "kwarg_names", "keep_alive", "pending", "contained", "error")

    def __init__(self, kwarg_names: tuple[str, ...]) -> None:
        self.args: tuple[m.TaskArg, ...] = ()
        self.kwarg_names = kwarg_names
        self.keep_alive: list[Any] = []  # refs the task needs until it ends
        self.pending: list[tuple[int, ObjectRef]] = []  # owned refs not produced yet
        self.contained: list[ObjectID] = []  # ids of refs pickled inside the arguments
        self.error: m.Payload | None = None  # an argument that is a stored error


def build_args(rt: ClientRuntime, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BuiltArgs:
    """Serialize arguments. Raises TypeError naming an unpicklable argument."""
    built = BuiltArgs(tuple(kwargs) if kwargs else ())
    if args or kwargs:
        built.args = tuple([_one(rt, built, position, value, len(args))
                            for position, value in enumerate((*args, *kwargs.values()))])
    return built


def _label(position: int, positional: int, kwarg_names: Sequence[str]) -> str:
    return (f"argument {position}" if position < positional
            else f"keyword argument {kwarg_names[position - positional]!r}")


def _one(rt: ClientRuntime, built: BuiltArgs, position: int, value: Any,
         positional: int) -> m.TaskArg:
    payload = plain_payload(value)
    if payload is not None:
        return m.TaskArg(payload)
    if isinstance(value, ObjectRef):
        built.keep_alive.append(value)
        return _ref_arg(rt, built, position, value)
    try:
        ser = serialize(value)
    except TypeError as exc:
        raise TypeError(f"{_label(position, positional, built.kwarg_names)}: {exc}") from None
    built.contained += [r.id for r in ser.contained]
    built.keep_alive += ser.contained
    if ser.size <= INLINE_MAX:
        return m.TaskArg(value=ser.to_payload())
    ref = rt.put_serialized(ser)
    built.keep_alive.append(ref)
    return m.TaskArg(object_id=ref.id, node_id=rt.node_id)


def _ref_arg(rt: ClientRuntime, built: BuiltArgs, position: int, ref: ObjectRef) -> m.TaskArg:
    if ref.owner != rt.client_id:  # borrowed: the worker waits for it if need be
        return m.TaskArg(object_id=ref.id, node_id=rt.refs.location_of(ref.id),
                         owner_id=ref.owner)
    with rt.lock:
        entry = rt.store.get(ref.id)
        if entry is None and rt.owner.making(ref.id):
            built.pending.append((position, ref))
            return m.TaskArg(object_id=ref.id)
    if isinstance(entry, m.Payload):
        if entry.is_error and built.error is None:
            built.error = entry
        return m.TaskArg(value=entry)
    return m.TaskArg(object_id=ref.id, node_id=rt.refs.location_of(ref.id))
