"""Actors: ``@rtml.remote`` on a class, its handles and their methods (the calls travel
through this process's ``ActorCaller``, :mod:`rtml.core.actor_caller`).

    Cls.remote() --CreateActor--> head service --StartActor--> node manager --> dedicated worker
    handle.m.remote() -> ActorCaller queue --(address from head, once)--> PushTask to the worker
                         (connected, nothing ahead of it: sent at once, past the queue;
                          pipelined calls to a one-at-a-time actor: written in batches)
    connection lost -> in-flight calls retried (max_task_retries) or ActorDiedError;
                       the next call asks the head again (it answers after a restart, or DEAD)
    last handle gone, anywhere, and the calls made through them answered (unnamed, not
    detached) -> its life object is freed -> KillActor (ActorLives)

Calls from one caller travel over one connection, so the actor sees them in order.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from rtml.core import context, current, runtime_env
from rtml.core.arguments import build_args
from rtml.core.calls import submit_call
from rtml.core.dag import ClassMethodNode, ClassNode
from rtml.core.object_ref import ObjectRef, borrow
from rtml.core.options import (
    ACTOR_OPTIONS,
    METHOD_OPTIONS,
    capture_of,
    check_options,
    default_returns,
    in_group,
    returns_of,
    strategy_of,
)
from rtml.core.remote_function import Exported
from rtml.core.serialization import recording_contained, serialize
from rtml.core.signatures import CallCheck
from rtml.ids import ActorID, new_actor_id
from rtml.rpc import messages as m
from rtml.scheduler.bundles import group_of
from rtml.scheduler.resources import task_shape

if TYPE_CHECKING:
    from rtml.core.runtime import ClientRuntime

log = logging.getLogger(__name__)



class ActorClass(Exported):
    """A class whose instances live in their own worker processes."""

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        super().__init__(cls)
        self._cls = cls
        self._options = check_options(dict(options), ACTOR_OPTIONS, "an actor class")
        self.__name__ = cls.__name__
        self.__doc__ = cls.__doc__
        self._call_checks: tuple[CallCheck, dict[str, CallCheck]] | None = None

    @property
    def _check(self) -> CallCheck:
        return self._signatures()[0]

    @property
    def _method_checks(self) -> dict[str, CallCheck]:
        return self._signatures()[1]

    def _signatures(self) -> tuple[CallCheck, dict[str, CallCheck]]:
        """The constructor's and the methods' call checks, made on first use: unpickled
        (cloudpickle, by value) inside a method of its own class, the class is still
        being rebuilt when this object is, its ``__init__`` not yet there."""
        if self._call_checks is None:
            cls = self._cls
            self._call_checks = (CallCheck.of(cls, f"actor class {cls.__name__}"),
                                 _method_checks(cls))
        return self._call_checks

    def __reduce__(self) -> tuple[type[ActorClass], tuple[type, dict[str, Any]]]:
        # Pickled with the code that uses it (cloudpickle, by value; the state is not
        # ours to pickle: a runtime): compiled, the default would call __init__().
        return ActorClass, (self._cls, self._options)

    def _class_attribute(self, name: str) -> Any:
        """The class's own attributes (constants, static methods, nested classes), as
        through Ray's actor class; its methods are called on a handle."""
        cls = self._cls
        try:
            attr = inspect.getattr_static(cls, name)
        except AttributeError:
            raise AttributeError(f"actor class {cls.__name__!r} has no attribute "
                                 f"{name!r}") from None
        if inspect.isfunction(attr):
            raise AttributeError(f"{name!r} is a method of actor class {cls.__name__!r}: "
                                 f"call it on a handle, {cls.__name__}.remote()."
                                 f"{name}.remote(...)")
        return getattr(cls, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor class {self.__name__!r} cannot be instantiated directly; "
                        f"use {self.__name__}.remote(...) to start an actor")

    def options(self, **options: Any) -> _BoundClass:
        check_options(options, ACTOR_OPTIONS, f"actor class {self.__name__!r}")
        return _BoundClass(self, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        return self._create(self._options, args, kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> ClassNode:
        """A lazy actor (``rtml.dag``): started anew by each ``execute()`` of its graph.
        Raises TypeError if the constructor cannot take these arguments."""
        return ClassNode(self, args, kwargs, self._check, self._method_checks)

    def _create(self, options: dict[str, Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> ActorHandle:
        self._check.check(args, kwargs)
        rt = current.require_runtime()
        class_id = self._export(rt)
        env = runtime_env.resolve(rt, options.get("runtime_env"))  # (before args are held)
        built = build_args(rt, args, kwargs)
        is_async = any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)
                       for _, f in _methods(self._cls))
        captured = context.captured_group()
        place = in_group(options, task_shape(options.get("num_cpus"), options.get("num_gpus"),
                                             options.get("memory"), options.get("resources")),
                         captured)
        hold = in_group(options, task_shape(options.get("num_cpus"), options.get("num_gpus"),
                                            options.get("memory"), options.get("resources"),
                                            default_cpus=0), captured)
        spec = m.ActorSpec(
            actor_id=new_actor_id(), job_id=rt.job_id or context.current_job(),
            owner_id=rt.client_id, class_id=class_id,
            class_name=self.__name__, args=built.args, kwarg_names=built.kwarg_names,
            shape=place, hold_shape=hold,
            max_restarts=options.get("max_restarts", 0),
            max_task_retries=options.get("max_task_retries", 0),
            max_concurrency=options.get("max_concurrency", 1000 if is_async else 1),
            is_async=is_async, name=options.get("name") or "",
            namespace=options.get("namespace") or rt.config.namespace,
            detached=_lifetime(rt, options) == "detached", sys_paths=rt.sys_paths,
            strategy=strategy_of(options), runtime_env=env,
            concurrency_groups=dict(options.get("concurrency_groups") or {}),
            capture_group=capture_of(options) or (captured if group_of(place) else ""))
        life = None
        if not spec.detached:
            life = rt.put_serialized(serialize(spec.actor_id))
            rt.owner.lives.add(life, spec.actor_id)
            spec.life_id, spec.owner_node = life.id, rt.node_id
            if spec.name:  # anyone may get a handle by its name: shared at once
                rt.refs.escaped(life)
        handle = ActorHandle(spec.actor_id, self.__name__, _method_meta(self._cls),
                             spec.max_task_retries, life, self._method_checks)
        for _, ref in built.pending:
            # The actor's worker reads these from shared memory, waiting until they exist.
            rt.refs.escaped(ref)
        caller = rt.owner.caller(spec.actor_id, spec.max_task_retries)
        caller.created = spec  # before it is sent: a head restart in between sends it again
        try:
            existing = _send_create(rt, spec, options)
        except ValueError:  # the name is taken
            caller.created = None
            raise
        if existing is not None and existing.spec is not None:  # get_if_exists found it
            caller.created = None
            return handle_of(existing.spec, self._cls)
        caller.keep_alive = built.keep_alive
        return handle


def _lifetime(rt: ClientRuntime, options: dict[str, Any]) -> str:
    """The new actor's lifetime: its option, else its job's default (JobConfig's
    ``default_actor_lifetime``), which a worker asks the head for once per job."""
    given = options.get("lifetime")
    if given is not None:
        return str(given)
    job_id = rt.job_id or context.current_job()
    known = rt.job_lifetimes.get(job_id)
    if known is None:
        info: m.JobConfigInfo = rt.links.request(rt.head, lambda req_id: m.GetJobConfig(
            req_id, job_id), rt.head.timeout)
        known = rt.job_lifetimes[job_id] = info.default_lifetime
    return known


def _send_create(rt: ClientRuntime, spec: m.ActorSpec,
                 options: dict[str, Any]) -> m.ActorInfo | None:
    """Register the actor; for named actors wait for the head's verdict."""
    if not spec.name:
        rt.head.send(m.CreateActor(0, spec))
        return None
    get_if_exists = bool(options.get("get_if_exists"))
    reply: m.ActorInfo = rt.links.request(
        rt.head, lambda req_id: m.CreateActor(req_id, spec, get_if_exists),
        rt.head.timeout)
    if reply.error:
        raise ValueError(reply.error)
    return reply if reply.actor_id != spec.actor_id else None


def _methods(cls: type) -> list[tuple[str, Any]]:
    return [(name, f) for name, f in inspect.getmembers(cls, callable)
            if not name.startswith("__") or name == "__call__"]


def _method_meta(cls: type) -> dict[str, dict[str, Any]]:
    """Each method's default options: its ``@rtml.method(...)``, over its num_returns (a
    generator's items stream)."""
    return {name: {"num_returns": default_returns(f), **getattr(f, METHOD_DEFAULTS, {})}
            for name, f in _methods(cls)}


def handle_of(spec: m.ActorSpec, cls: type) -> ActorHandle:
    """A handle to the actor of ``spec``, whose class is ``cls`` (``rtml.get_actor``),
    holding its life as any other handle does (a named actor ends when the last handle
    goes, as in Ray, unless detached)."""
    life = borrow(spec.life_id, spec.owner_id, spec.owner_node) if spec.life_id else None
    return ActorHandle(spec.actor_id, spec.class_name, _method_meta(cls),
                       spec.max_task_retries, life, _method_checks(cls))


def _method_checks(cls: type) -> dict[str, CallCheck]:
    """Each method's call check; the instance (or the class, for a classmethod) is not
    the caller's to pass."""
    checks = {}
    for name, f in _methods(cls):
        static = isinstance(inspect.getattr_static(cls, name, None), (staticmethod, classmethod))
        checks[name] = CallCheck.of(f, f"actor method {cls.__name__}.{name}", bound=not static)
    return checks


class _BoundClass:
    def __init__(self, actor_class: ActorClass, options: dict[str, Any]) -> None:
        self._actor_class = actor_class
        self._opts = options

    def __reduce__(self) -> tuple[type[_BoundClass], tuple[ActorClass, dict[str, Any]]]:
        return _BoundClass, (self._actor_class, self._opts)

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        return self._actor_class._create(self._opts, args, kwargs)

    def bind(self, *args: Any, **kwargs: Any) -> ClassNode:
        """A lazy actor with these options (``rtml.dag``)."""
        actor_class = self._actor_class
        return ClassNode(self, args, kwargs, actor_class._check, actor_class._method_checks)


TERMINATE = "__ray_terminate__"
"""A method of every actor, as in Ray: queued like any call, it ends the actor (the
worker's executor runs ``exit_actor`` for it)."""


class ActorHandle:
    """A picklable handle to an actor; ``handle.method.remote(...)`` calls it.

    ``life``: the ref to the actor's life object (see :class:`ActorLives`), None for an
    actor that is not ended by its handles (named or detached).
    """

    def __init__(self, actor_id: ActorID, class_name: str, methods: dict[str, dict[str, Any]],
                 max_task_retries: int, life: ObjectRef | None = None,
                 checks: dict[str, CallCheck] | None = None) -> None:
        self._actor_id = actor_id
        self._class_name = class_name
        self._methods = methods
        self._max_task_retries = max_task_retries
        self._life = life
        self._checks: dict[str, CallCheck] = checks or {}  # none: calls go unchecked
        self._bound: dict[str, ActorMethod] = {}

    def __getattr__(self, name: str) -> ActorMethod:
        if name.startswith("_") and name != TERMINATE:
            raise AttributeError(name)
        method = self._bound.get(name)  # built once per name: a compiled class has no __dict__
        if method is not None:
            return method
        if name not in self._methods and name != TERMINATE:
            raise AttributeError(f"actor {self._class_name!r} has no method {name!r}; "
                                 f"it has {sorted(self._methods)}")
        method = ActorMethod(self, name, dict(self._methods.get(name) or {}))
        self._bound[name] = method
        return method

    def __reduce__(self) -> tuple[Any, ...]:
        _pin_if_untracked(self._life)
        return (ActorHandle, (self._actor_id, self._class_name, self._methods,
                              self._max_task_retries, self._life, self._checks))

    def __repr__(self) -> str:
        return f"ActorHandle({self._class_name}, {self._actor_id.hex()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self) -> int:
        return hash(self._actor_id)


class ActorMethod:
    """``handle.name``: keeps the actor alive as a handle does (it holds the life ref),
    but holds no reference to its handle, so that the handle, which caches it, is freed
    as soon as it is dropped (no reference cycle to wait for the garbage collector)."""

    def __init__(self, source: ActorHandle | ActorMethod, name: str,
                 options: dict[str, Any]) -> None:
        self._actor_id: ActorID = source._actor_id
        self._class_name: str = source._class_name
        self._max_task_retries: int = source._max_task_retries
        self._life: ObjectRef | None = source._life
        self._check: CallCheck | None = (source._checks.get(name) if isinstance(
            source, ActorHandle) else source._check)
        self._name = name
        self._opts = options
        self._task_name = options.get("name") or f"{source._class_name}.{name}"
        self._num_returns = returns_of(options.get("num_returns", 1))
        self._retries: int = options.get("max_task_retries", source._max_task_retries)
        self._retry_exceptions: Any = options.get("retry_exceptions", False)
        self._group: str = options.get("concurrency_group") or ""

    def options(self, **options: Any) -> ActorMethod:
        check_options(options, METHOD_OPTIONS, f"actor method {self._name!r}")
        return ActorMethod(self, self._name, {**self._opts, **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if self._check is not None:
            self._check.check(args, kwargs)
        return submit_call(current.require_runtime(), name=self._task_name,
                           function_id=b"", args=args, kwargs=kwargs,
                           num_returns=self._num_returns, shape={},
                           max_retries=self._retries, retry_exceptions=self._retry_exceptions,
                           actor_id=self._actor_id, method=self._name, keep=self._life,
                           group=self._group)

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode:
        """A lazy call of this actor's method (``rtml.dag``), made by each ``execute()``."""
        return ClassMethodNode(self, self._name, args, kwargs, self._check)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor method {self._name!r} cannot be called directly; "
                        f"use .{self._name}.remote(...)")

    def __reduce__(self) -> tuple[Any, ...]:
        _pin_if_untracked(self._life)
        return (_rebuild_method, (self._actor_id, self._class_name, self._max_task_retries,
                                  self._name, self._opts, self._life, self._check))


def _rebuild_method(actor_id: ActorID, class_name: str, max_task_retries: int, name: str,
                    options: dict[str, Any], life: ObjectRef | None = None,
                    check: CallCheck | None = None) -> ActorMethod:
    handle = ActorHandle(actor_id, class_name, {name: options}, max_task_retries, life,
                         {name: check} if check else None)
    return ActorMethod(handle, name, options)


def _pin_if_untracked(life: ObjectRef | None) -> None:
    """A handle pickled outside a value (a function's closure, say) is held by nothing
    that frees it: this process keeps its actor's life object to the job's end."""
    rt = current.get_runtime()
    if life is not None and rt is not None and not recording_contained():
        rt.owner.lives.pin(life)


METHOD_DEFAULTS = "__rtml_method_options__"
"""Where ``@rtml.method(...)`` keeps a method's default options."""


def method(*args: Any, **options: Any) -> Any:
    """``@rtml.method(num_returns=..., max_task_retries=..., retry_exceptions=...,
    concurrency_group=...)`` on an actor's method: the defaults of its calls (each call's
    ``.options(...)`` wins), as Ray's ``@ray.method``."""
    if args:
        raise TypeError("use @rtml.method(num_returns=..., ...) with keyword options")
    check_options(options, METHOD_OPTIONS, "@rtml.method")

    def wrap(f: Any) -> Any:
        setattr(f, METHOD_DEFAULTS, {**getattr(f, METHOD_DEFAULTS, {}), **options})
        return f
    return wrap
