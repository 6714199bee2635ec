"""``@rtml.remote`` on a function: a RemoteFunction whose ``.remote()`` submits a task."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import cloudpickle

from rtml.core import context
from rtml.core.arguments import build_args
from rtml.core.object_ref import ObjectRef
from rtml.core.options import TASK_OPTIONS, check_options, strategy_of
from rtml.core.submitter import TaskRecord
from rtml.ids import new_task_id, object_id_for
from rtml.rpc import messages as m
from rtml.scheduler.resources import Shape, shape_key, task_shape

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime


class Exported:
    """Code shipped to workers once: pickled on first use, stored by content hash."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._blob: bytes | None = None
        self._function_id = b""

    def _export(self, rt: ClientRuntime) -> bytes:
        if self._blob is None:
            self._blob = cloudpickle.dumps(self._target)
            self._function_id = hashlib.sha1(self._blob).digest()
        rt.export_function(self._function_id, self._blob)
        return self._function_id


def submit_call(rt: ClientRuntime, *, name: str, function_id: bytes, args: tuple[Any, ...],
                kwargs: dict[str, Any], num_returns: int, shape: Shape, max_retries: int,
                retry_exceptions: Any, actor_id: bytes = b"", method: str = "",
                key: tuple[Any, ...] = ()) -> Any:
    """Submit one task or actor call; its ref (a list for several returns, None for 0)."""
    built = build_args(rt, args, kwargs)
    task_id = new_task_id()
    return_ids = ([object_id_for(task_id, 1)] if num_returns == 1 else
                  [object_id_for(task_id, i + 1) for i in range(num_returns)])
    spec = m.TaskSpec(task_id, rt.job_id, name, function_id, built.args, built.kwarg_names,
                      num_returns, rt.client_id, actor_id=actor_id, method=method,
                      owner_node=rt.node_id)
    record = TaskRecord(spec, shape, max_retries, retry_exceptions, built.keep_alive,
                        return_ids, has_contained=bool(built.contained), key=key,
                        parent=context.current_task())
    if built.contained:
        rt.refs.send_holds(m.AddHolds, built.contained, task_id)
    refs = [ObjectRef(oid, rt.client_id) for oid in return_ids]
    rt.owner.submit(record, built.pending, built.error)
    if num_returns == 1:
        return refs[0]
    return refs or None


class RemoteFunction(Exported):
    """A function that runs as a task on the cluster."""

    def __init__(self, function: Any, options: dict[str, Any]) -> None:
        super().__init__(function)
        self._options = check_options(dict(options), TASK_OPTIONS, "a remote function")
        self._shape = _shape_of(self._options)
        self._key = _key_of(self._shape, self._options)
        self._name = getattr(function, "__qualname__", repr(function))
        self.__doc__ = function.__doc__
        self.__name__ = getattr(function, "__name__", self._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"remote function {self._name!r} cannot be called directly; "
                        f"use {self.__name__}.remote(...) to run it as a task "
                        f"(and rtml.get(...) for its result)")

    def options(self, **options: Any) -> _Bound:
        check_options(options, TASK_OPTIONS, f"remote function {self._name!r}")
        return _Bound(self, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._submit(self._options, self._shape, self._key, args, kwargs)

    def _submit(self, options: dict[str, Any], shape: Shape, key: tuple[Any, ...],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rt = context.require_runtime()
        return submit_call(rt, name=options.get("name") or self._name,
                           function_id=self._export(rt), args=args, kwargs=kwargs,
                           num_returns=options.get("num_returns", 1), shape=shape,
                           max_retries=options.get("max_retries", 3),
                           retry_exceptions=options.get("retry_exceptions", False),
                           key=key)


class _Bound:
    """A RemoteFunction with per-call options."""

    def __init__(self, function: RemoteFunction, options: dict[str, Any]) -> None:
        self._function = function
        self._opts = options
        self._shape = _shape_of(options)
        self._key = _key_of(self._shape, options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._function._submit(self._opts, self._shape, self._key, args, kwargs)


def _key_of(shape: Shape, options: dict[str, Any]) -> tuple[Any, ...]:
    """The lease key: tasks with equal keys may share a leased worker."""
    return (*shape_key(shape), strategy_of(options))


def _shape_of(options: dict[str, Any]) -> Shape:
    """The resource shape of a task's options, computed once per options, not per call."""
    return task_shape(options.get("num_cpus"), options.get("num_gpus"),
                      options.get("memory"), options.get("resources"))
