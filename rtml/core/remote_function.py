"""``@rtml.remote`` on a function: a RemoteFunction whose ``.remote()`` submits a task."""

from __future__ import annotations

import hashlib
import inspect
import io
import types
from collections import ChainMap
from typing import TYPE_CHECKING, Any

import cloudpickle

from rtml.core import context, current, runtime_env
from rtml.core.calls import submit_call
from rtml.core.dag import FunctionNode
from rtml.core.options import (
    TASK_OPTIONS,
    capture_of,
    check_options,
    default_returns,
    in_group,
    returns_of,
    strategy_of,
)
from rtml.core.signatures import CallCheck
from rtml.core.submitter import with_runtime_env
from rtml.scheduler.bundles import group_of
from rtml.scheduler.resources import DEFAULT_SHAPE, shape_key, task_shape

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime


_CODE_REDUCE = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_keeping_its_file(code: types.CodeType) -> Any:
    rebuild, args = _CODE_REDUCE(code)
    return rebuild, tuple(code.co_filename if arg == "<dynamic-code>" else arg for arg in args)


class _CodePickler(cloudpickle.Pickler):
    """cloudpickle that keeps each code object's file name (cloudpickle 3 writes
    ``<dynamic-code>``), so a remote traceback names the file and line of the user's
    function, and shows the line when the file is there."""

    dispatch_table = ChainMap({types.CodeType: _code_keeping_its_file},
                              cloudpickle.Pickler.dispatch_table)


def dumps_code(target: Any) -> bytes:
    """Pickle a function or class to export it (see ``_CodePickler``)."""
    buffer = io.BytesIO()
    _CodePickler(buffer, protocol=5).dump(target)
    return buffer.getvalue()


class Exported:
    """Code shipped to workers once: pickled on first use, stored by content hash."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._blob: bytes | None = None
        self._function_id = b""
        self._exported_to: ClientRuntime | None = None  # the runtime that has it already

    def __getattr__(self, name: str) -> Any:
        # Only for names not found otherwise: an actor class reads its class's attributes
        # (a compiled subclass cannot define __getattr__ itself).
        if name.startswith("__") or "_target" not in self.__dict__:
            raise AttributeError(name)
        return self._class_attribute(name)

    def _class_attribute(self, name: str) -> Any:
        raise AttributeError(f"{type(self).__name__} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with the code that calls it (cloudpickle, by value): not our runtime.
        return {**self.__dict__, "_exported_to": None}

    def _export(self, rt: ClientRuntime) -> bytes:
        if self._exported_to is rt:
            return self._function_id
        if self._blob is None:
            self._blob = dumps_code(self._target)
            self._function_id = hashlib.sha1(self._blob).digest()
        rt.export_function(self._function_id, self._blob)
        self._exported_to = rt
        return self._function_id


class RemoteFunction(Exported):
    """A function that runs as a task on the cluster."""

    def __init__(self, function: Any, options: dict[str, Any]) -> None:
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise ValueError(f"'async def' cannot be a remote function ({function.__name__}): "
                             f"a task runs one call to completion; wrap it in a plain function "
                             f"that calls asyncio.run(...), or make it a method of an actor "
                             f"(async actors run their methods on an event loop)")
        super().__init__(function)
        self._options = check_options({"num_returns": default_returns(function), **options},
                                      TASK_OPTIONS, "a remote function")
        self._name = getattr(function, "__qualname__", repr(function))
        self._call = _CallOptions(self._name, self._options)
        self._check = CallCheck.of(function, f"remote function {self._name}")
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
        return self._submit(self._call, args, kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> FunctionNode:
        """A lazy call (``rtml.dag``): a task submitted by each ``execute()`` of its graph.
        Raises TypeError if the function cannot take these arguments."""
        return FunctionNode(self, args, kwargs, self._check)

    def _submit(self, call: _CallOptions, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._check.check(args, kwargs)
        rt = current.require_runtime()
        captured = "" if rt.job_id else context.captured_group()  # (a driver's: none)
        if captured:
            call = call.captured_in(captured)
        if call.resolved_for is not rt:  # its runtime env: worked out once per runtime
            call.resolve(rt)
        return submit_call(rt, name=call.name, function_id=self._export(rt), args=args,
                           kwargs=kwargs, num_returns=call.num_returns, shape=call.shape,
                           max_retries=call.max_retries,
                           retry_exceptions=call.retry_exceptions, key=call.lease_key,
                           resources=call.assigned, max_calls=call.max_calls,
                           capture=call.capture)


class _CallOptions:
    """What a call under one set of options needs, worked out once, not per call."""

    def __init__(self, name: str, options: dict[str, Any], captured: str = "") -> None:
        self.options = options
        self.name = options.get("name") or name
        self.num_returns = returns_of(options.get("num_returns", 1))
        self.max_retries = options.get("max_retries", 3)
        self.retry_exceptions = options.get("retry_exceptions", False)
        self.shape = in_group(options, task_shape(options.get("num_cpus"), options.get(
            "num_gpus"), options.get("memory"), options.get("resources")), captured)
        # The group its own tasks run in: its strategy's (capture_child_tasks), else the
        # one it was captured into (if it went there).
        self.capture = capture_of(options) or (captured if group_of(self.shape) else "")
        self._captured: dict[str, _CallOptions] = {}  # these options, in a captor's group
        self.key = (*shape_key(self.shape), strategy_of(options))  # tasks sharing leases
        self.assigned = None if self.shape == DEFAULT_SHAPE else self.shape
        # As Ray: a GPU task's worker exits after it by default, so what the task's
        # libraries hold on the GPU is freed.
        self.max_calls = options.get("max_calls", 1 if options.get("num_gpus") else 0)
        self.given_env = options.get("runtime_env")  # as given (checked)
        self.lease_key = self.key  # the key with the runtime env (``resolve``)
        self.resolved_for: Any = None  # the runtime ``lease_key`` was worked out under

    def resolve(self, rt: ClientRuntime) -> None:
        """Work out the calls' runtime env under ``rt`` (merged with the job's, its
        packages uploaded): tasks of another env lease other workers. Raises ValueError
        or TypeError (a bad env), RtmlSystemError."""
        env = runtime_env.resolve(rt, self.given_env)
        self.lease_key = with_runtime_env(self.key, env)
        self.resolved_for = rt

    def captured_in(self, group: str) -> _CallOptions:
        """These options for a call made by a task that captures its children into
        ``group`` (its placement group); worked out once per group."""
        call = self._captured.get(group)
        if call is None:
            call = self._captured[group] = _CallOptions(self.name, self.options, group)
        return call

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "resolved_for": None, "_captured": {}}  # (see resolve)


class _Bound:
    """A RemoteFunction with per-call options."""

    def __init__(self, function: RemoteFunction, options: dict[str, Any]) -> None:
        self._function = function
        self._call = _CallOptions(function._name, options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._function._submit(self._call, args, kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> FunctionNode:
        """A lazy call with these options (``rtml.dag``)."""
        return FunctionNode(self, args, kwargs, self._function._check)

