"""Lazy task graphs (Ray's ``ray.dag``): ``.bind()`` records a call, ``execute()`` runs
the whole graph.

    f.bind(x)               FunctionNode       f.remote(x) at each execute
    Cls.bind(a)             ClassNode          Cls.remote(a): a new actor at each execute
    node.method.bind(y)     ClassMethodNode    handle.method.remote(y), after the calls
                                               bound before it on the same ClassNode
    handle.method.bind(y)   ClassMethodNode    on an existing actor
    with InputNode() as inp InputNode          what execute() is given; inp[0], inp.k,
                                               inp["k"]: InputAttributeNode
    MultiOutputNode([a, b]) MultiOutputNode    a list of the results

``execute(*args, **kwargs)`` walks the graph children first and submits each node once,
however many nodes use it; a node's result takes its place in the arguments of the
nodes that use it, also inside lists, tuples and dicts (where an ``ObjectRef`` stays a
ref, as any ref nested in an argument does). The inputs are read and checked before
anything is submitted, so a bad ``execute`` submits nothing.

This module calls the functions and classes it binds only through their ``.remote``
(and an actor handle's methods), so the modules that define ``.bind`` can import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from rtml.core.options import METHOD_OPTIONS, check_options
from rtml.core.signatures import CallCheck


class _Submits(Protocol):
    """A remote function, actor class or actor method, options applied."""

    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


class DAGNode:
    """A call recorded by ``.bind()``; ``execute()`` runs the graph it ends."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._args = args
        self._kwargs = kwargs
        self._in_args = list(_nodes_in([args, kwargs]))  # the nodes its arguments use

    def get_args(self) -> tuple[Any, ...]:
        """The arguments bound, nodes among them."""
        return self._args

    def get_kwargs(self) -> dict[str, Any]:
        """The keyword arguments bound, nodes among them."""
        return dict(self._kwargs)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Submit the graph this node ends, with ``args`` and ``kwargs`` as its input
        (read by its InputNode); return this node's result: an ``ObjectRef`` (a list of
        them for a MultiOutputNode or ``num_returns > 1``; an ``ActorHandle`` for a
        ClassNode). Before submitting anything, raises TypeError if the graph has an
        InputNode and no input was given, IndexError / KeyError (or the input's own
        error) if a part it reads is not there, ValueError if the graph has more than one
        InputNode or one made outside ``with InputNode() as inp:``."""
        order = _children_first(self)
        inputs = [node for node in order if isinstance(node, InputNode | InputAttributeNode)]
        done: dict[int, Any] = {}
        _read_inputs(inputs, _Given(args, kwargs), done)
        for node in order:
            if id(node) not in done:
                done[id(node)] = node._run(done)
        return done[id(self)]

    def _children(self) -> list[DAGNode]:
        """The nodes to run before this one."""
        return self._in_args

    def _run(self, done: dict[int, Any]) -> Any:
        """Submit this node, its children's results in ``done`` (by node id)."""
        raise NotImplementedError

    def _resolved(self, done: dict[int, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if not self._in_args:
            return self._args, self._kwargs
        return (tuple(_resolve(a, done) for a in self._args),
                {k: _resolve(v, done) for k, v in self._kwargs.items()})

    def __getattr__(self, name: str) -> Any:
        if name == "remote":
            raise AttributeError(f".remote() cannot be used on a {type(self).__name__}: "
                                 f"run the graph it ends with .execute(...)")
        if name == "bind":
            raise AttributeError(f".bind() cannot be used again on a {type(self).__name__}: "
                                 f"pass it as an argument to another .bind(...)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __reduce__(self) -> Any:
        raise TypeError(f"a {type(self).__name__} cannot be pickled or passed to .remote(): "
                        f"pass it to .bind(...) and run the graph with .execute(...)")


class FunctionNode(DAGNode):
    """``f.bind(...)``: a task, submitted once per execute."""

    def __init__(self, function: _Submits, args: tuple[Any, ...], kwargs: dict[str, Any],
                 check: CallCheck) -> None:
        check.check(args, kwargs)
        super().__init__(args, kwargs)
        self._function = function
        self._what = check.what

    def _run(self, done: dict[int, Any]) -> Any:
        args, kwargs = self._resolved(done)
        return self._function.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionNode({self._what})"


class ClassNode(DAGNode):
    """``Cls.bind(...)``: an actor, started anew at each execute (as Ray does);
    ``node.method.bind(...)`` calls it."""

    def __init__(self, actor_class: _Submits, args: tuple[Any, ...], kwargs: dict[str, Any],
                 check: CallCheck, methods: dict[str, CallCheck]) -> None:
        check.check(args, kwargs)
        super().__init__(args, kwargs)
        if any(isinstance(node, InputNode) for node in self._in_args):
            raise ValueError(f"an InputNode cannot be an argument of {check.what}.bind(...): "
                             f"pass the input to its methods' .bind(...) instead")
        self._actor_class = actor_class
        self._what = check.what
        self._methods = methods
        self._last_call: ClassMethodNode | None = None  # the method call bound last

    def _run(self, done: dict[int, Any]) -> Any:
        args, kwargs = self._resolved(done)
        return self._actor_class.remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._methods:
            if name in ("bind", "remote"):
                super().__getattr__(name)
            raise AttributeError(f"{self._what} has no method {name!r}; it has "
                                 f"{sorted(self._methods)}")
        return _UnboundMethod(self, name, {})

    def __repr__(self) -> str:
        return f"ClassNode({self._what})"


class _UnboundMethod:
    """``class_node.method``: ``.bind(...)`` records a call of it, ``.options(...)`` sets
    the call's options."""

    def __init__(self, actor: ClassNode, name: str, options: dict[str, Any]) -> None:
        self._actor = actor
        self._name = name
        self._options = options

    def options(self, **options: Any) -> _UnboundMethod:
        check_options(options, METHOD_OPTIONS, f"actor method {self._name!r}")
        return _UnboundMethod(self._actor, self._name, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode:
        actor = self._actor
        node = ClassMethodNode(actor, self._name, args, kwargs, actor._methods[self._name],
                               self._options, actor._last_call)
        actor._last_call = node
        return node

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor method {self._name!r} of a ClassNode cannot be called "
                        f"directly; use .{self._name}.bind(...)")

    def __getattr__(self, name: str) -> Any:
        if name == "remote":
            raise AttributeError(f".remote() cannot be used on a method of a ClassNode; "
                                 f"use .{self._name}.bind(...) and run the graph with "
                                 f".execute(...)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class ClassMethodNode(DAGNode):
    """An actor method call: on the actor of a ClassNode (after the calls bound on it
    before, so they reach the actor in the order they were bound), or on an existing
    actor (``handle.method.bind(...)``: ``actor`` is that method)."""

    def __init__(self, actor: ClassNode | _Submits, name: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], check: CallCheck | None,
                 options: dict[str, Any] | None = None,
                 previous: ClassMethodNode | None = None) -> None:
        if check is not None:
            check.check(args, kwargs)
        super().__init__(args, kwargs)
        self._actor = actor
        self._name = name
        self._options = options or {}
        before = [actor] if isinstance(actor, ClassNode) else []
        self._before: list[DAGNode] = before + ([previous] if previous is not None else [])

    def _children(self) -> list[DAGNode]:
        return self._before + self._in_args

    def _run(self, done: dict[int, Any]) -> Any:
        args, kwargs = self._resolved(done)
        method = self._actor
        if isinstance(method, ClassNode):
            method = getattr(done[id(method)], self._name)
            if self._options:
                method = method.options(**self._options)
        return method.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ClassMethodNode({self._name})"


class InputNode(DAGNode):
    """The input of a graph: what ``execute`` is given. One value: that value; several
    (or keywords): read them as ``inp[0]``, ``inp.key`` or ``inp["key"]``. Used as
    ``with InputNode() as inp:``, once per graph."""

    def __init__(self, *, input_type: Any = None) -> None:
        super().__init__((), {})
        self._entered = False
        self._input_type = input_type  # Ray's hint for its UI; unused here
        self._attributes: dict[tuple[int | str, bool], InputAttributeNode] = {}

    def __enter__(self) -> InputNode:
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getitem__(self, key: int | str) -> InputAttributeNode:
        return self._attribute(key, by_name=False)

    def __getattr__(self, name: str) -> InputAttributeNode:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._attribute(name, by_name=True)

    def _attribute(self, key: int | str, by_name: bool) -> InputAttributeNode:
        if not isinstance(key, int | str) or isinstance(key, bool):
            raise TypeError(f"the DAG input is read by an int index or a str key, "
                            f"not {key!r}")
        node = self._attributes.get((key, by_name))
        if node is None:
            node = self._attributes[(key, by_name)] = InputAttributeNode(self, key, by_name)
        return node

    def _value(self, given: _Given) -> Any:
        if not self._entered:
            raise ValueError("an InputNode must be made as `with InputNode() as inp:` and "
                             "the graph bound inside that block")
        if not given.args and not given.kwargs:
            raise TypeError("this DAG reads its input from an InputNode, but execute() was "
                            "given no arguments: call dag.execute(value), or "
                            "dag.execute(*args, **kwargs) read as inp[0], inp.key")
        if len(given.args) == 1 and not given.kwargs:
            return given.args[0]
        return DAGInputData(*given.args, **given.kwargs)

    def __repr__(self) -> str:
        return "InputNode()"


class InputAttributeNode(DAGNode):
    """``inp[0]``, ``inp.key``, ``inp["key"]``: part of a graph's input."""

    def __init__(self, input_node: InputNode, key: int | str, by_name: bool) -> None:
        super().__init__((), {})
        self._input = input_node
        self._key = key
        self._by_name = by_name  # inp.key, not inp[key]

    def _children(self) -> list[DAGNode]:
        return [self._input]

    def _value(self, value: Any) -> Any:
        """Read this part of the input ``value``; raises the reader's own error type
        (IndexError, KeyError, AttributeError, TypeError), naming what was read."""
        key = self._key
        try:
            if isinstance(value, DAGInputData):
                return value[key]
            return getattr(value, str(key)) if self._by_name else value[key]
        except (LookupError, AttributeError, TypeError) as exc:
            kind = next(k for k in (IndexError, KeyError, LookupError, AttributeError,
                                    TypeError) if isinstance(exc, k))
            detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise kind(f"the DAG reads its input {self!r} but execute() was given "
                       f"{_describe(value)}: {detail}") from exc

    def __repr__(self) -> str:
        return f"inp.{self._key}" if self._by_name else f"inp[{self._key!r}]"


class DAGInputData:
    """The several arguments (or keywords) one execute was given: ``[int]`` reads a
    positional one, ``[str]`` a keyword."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = list(args)
        self._kwargs = kwargs

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            if key not in self._kwargs:
                raise KeyError(f"no keyword argument {key!r} (given {sorted(self._kwargs)})")
            return self._kwargs[key]
        if not -len(self._args) <= key < len(self._args):
            raise IndexError(f"no positional argument [{key}] (given {len(self._args)})")
        return self._args[key]


class MultiOutputNode(DAGNode):
    """``MultiOutputNode([a, b])``: executes to the list of its nodes' results."""

    def __init__(self, outputs: list[Any] | tuple[Any, ...]) -> None:
        if not isinstance(outputs, list | tuple):
            raise ValueError(f"MultiOutputNode takes a list of DAG nodes, not "
                             f"{type(outputs).__name__}")
        super().__init__(tuple(outputs), {})

    def _run(self, done: dict[int, Any]) -> Any:
        return list(self._resolved(done)[0])

    def __repr__(self) -> str:
        return f"MultiOutputNode({len(self._args)})"


class _Given:
    """What one execute was given."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs


def _read_inputs(nodes: list[InputNode | InputAttributeNode], given: _Given, done: dict[int, Any]) -> None:
    """The values of a graph's input nodes (InputNode first in ``nodes``), into ``done``."""
    roots = [node for node in nodes if isinstance(node, InputNode)]
    if len(roots) > 1:
        raise ValueError(f"a DAG has one InputNode, this one has {len(roots)}: read "
                         f"several inputs from one (inp[0], inp[1], inp.key)")
    for node in nodes:
        if isinstance(node, InputNode):
            done[id(node)] = node._value(given)
        elif isinstance(node, InputAttributeNode):
            done[id(node)] = node._value(done[id(node._input)])


def _children_first(root: DAGNode) -> list[DAGNode]:
    """The graph's nodes, each once, every node after its children (iterative: a long
    chain does not reach the recursion limit)."""
    order: list[DAGNode] = []
    seen: set[int] = set()
    stack: list[tuple[DAGNode, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node._children())
                     if id(child) not in seen)
    return order


def _nodes_in(value: Any) -> Iterator[DAGNode]:
    """The nodes in ``value``, also inside lists, tuples and dicts."""
    if isinstance(value, DAGNode):
        yield value
    elif type(value) in (list, tuple):
        for item in value:
            yield from _nodes_in(item)
    elif type(value) is dict:
        for item in value.values():
            yield from _nodes_in(item)


def _resolve(value: Any, done: dict[int, Any]) -> Any:
    """``value`` with each node in it replaced by its result."""
    if isinstance(value, DAGNode):
        return done[id(value)]
    if type(value) is list:
        return [_resolve(item, done) for item in value]
    if type(value) is tuple:
        return tuple(_resolve(item, done) for item in value)
    if type(value) is dict:
        return {key: _resolve(item, done) for key, item in value.items()}
    return value


def _describe(value: Any) -> str:
    if isinstance(value, DAGInputData):
        return (f"{len(value._args)} positional argument(s) and keyword(s) "
                f"{sorted(value._kwargs)}")
    text = repr(value)
    return f"one {type(value).__name__} ({text[:60]}{'...' if len(text) > 60 else ''})"
