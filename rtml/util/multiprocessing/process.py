"""One process of a Pool: an actor that runs the pool's initializer once, then chunks.

    Pool --PoolProcess.remote(initializer, initargs)--> actor: initializer(*initargs)
    Pool --run_chunk.remote(func, items, star)-------> [func(x) | func(*x) for x in items]
         <--------------------------------------------- [value | Failure(error), ...]

A call that raises does not fail its chunk: its place in the list holds a ``Failure``
whose error is a TaskError that is also an instance of the user's exception class
(as rtml makes for a task that raised), so the calls after it still run and the pool
hands back each result, or error, at its own position. An error that is not an
``Exception`` (``SystemExit``, ``KeyboardInterrupt``) fails the whole chunk.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import cloudpickle

from rtml import api
from rtml.exceptions import TaskError


@dataclass(frozen=True)
class Failure:
    """A call of the user's function that raised; ``error`` is what ``get`` raises."""

    error: BaseException


class PoolProcess:
    """The actor behind each process of a Pool (``@remote`` is applied below, so the
    class stays importable by name in the workers)."""

    def __init__(self, initializer: Callable[..., Any] | None,
                 initargs: tuple[Any, ...]) -> None:
        if initializer is not None:
            initializer(*initargs)

    def ping(self) -> None:
        """Answered once the constructor (the initializer) has run."""

    def run_chunk(self, func: Callable[..., Any], items: list[Any], star: bool) -> list[Any]:
        """``func`` on each item (``func(*item)`` if ``star``), in order."""
        return [call(func, item, star) for item in items]


PoolActor = api.remote(num_cpus=0)(PoolProcess)
"""As Ray's: a pool process holds no CPU while alive (``ray_remote_args`` can say
otherwise), so a task it runs that submits tasks of its own does not starve them."""


def call(func: Callable[..., Any], item: Any, star: bool) -> Any:
    """``func(item)`` (``func(*item)`` if ``star``), or the Failure of its error."""
    try:
        return func(*item) if star else func(item)
    except Exception as exc:  # noqa: BLE001 - handed to the caller of get(), at its place
        return Failure(task_error(name_of(func), exc))


def name_of(func: Callable[..., Any]) -> str:
    """The name errors give ``func``: its qualified name (a partial's function's)."""
    while isinstance(func, partial):
        func = func.func
    return getattr(func, "__qualname__", None) or repr(func)


def task_error(name: str, exc: Exception) -> TaskError:
    """``exc`` as rtml gives a task's error: a TaskError with the remote traceback, the
    pid and node, that is also an instance of ``type(exc)`` (only its text if ``exc``
    does not pickle: it could not reach the caller otherwise)."""
    text = "".join(traceback.format_exception(exc))
    traceback.clear_frames(exc.__traceback__)  # the frames' locals would live on with it
    pid, node = os.getpid(), api.get_runtime_context().get_node_id()
    try:
        cloudpickle.dumps(exc)
    except Exception as unpicklable:  # noqa: BLE001 - any pickling failure is the same
        return TaskError(name, f"{text}(the exception itself could not be pickled: "
                         f"{unpicklable})", None, pid, node)
    return TaskError(name, text, exc, pid, node).as_instanceof_cause()
