"""The nodes of a program: what each runs, and the handles other nodes reach it by.

    PyNode(fn, *args)              runs fn(*args) once; finished when it returns
    PyClassNode(ctor, *args)       builds ctor(*args), calls its run() if it has one
    CourierNode(ctor, *args)       builds ctor(*args), serves its public methods on a
                                   thread pool, runs its run() in its own thread if it
                                   has one (finished when run() returns), else serves
                                   until the program stops
    MultiThreadingColocation([n])  runs several nodes as threads of one process

Constructor arguments may hold handles anywhere inside lists, tuples and dicts;
they are dereferenced (into courier clients) inside the node, just before its
constructor runs. A handle is a name, not a connection, so it can be made
before its node runs, and nodes may hold each other's handles (a cycle is
written with ``node.configure(...)`` after both handles exist).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from rtml.launchpad import context as ctx
from rtml.launchpad.courier import HANDLER_THREADS, CourierClient, CourierServer


class Owner(Protocol):
    """The program a node was added to (``rtml.launchpad.program.Program``), as a node
    sees it: it only names it."""

    name: str


class Handle:
    """A name for a node, usable in other nodes' constructor arguments."""

    def __init__(self, node: Node) -> None:
        self.uid = node.uid
        self._node: Node | None = node
        self._description = ""  # kept when the handle travels without its node

    @property
    def description(self) -> str:
        return self._node.description if self._node is not None else self._description

    def dereference(self) -> Any:
        """A client of the node: inside a node of its program, or in the process that
        launched the program. Raises RuntimeError anywhere else."""
        context = ctx.current()
        if context is None:
            program = self._node.program if self._node is not None else None
            launched = ctx.launched_program(program) if program is not None else None
            if launched is None:
                raise RuntimeError(f"the handle of {self.description} was dereferenced "
                                   f"outside a launched program; launch the program first, "
                                   f"or pass the handle to another node's constructor")
            return self._client_of(launched.controller, launched.token)
        return self._client_of(context.controller, context.token)

    def _client_of(self, controller: Any, token: str) -> Any:
        raise RuntimeError(f"{self.description} serves no methods (only a CourierNode "
                           f"does); its handle cannot be called")

    def __reduce__(self) -> Any:
        return (_rebuild_handle, (type(self), self.uid, self.description))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description})"


class CourierHandle(Handle):
    def _client_of(self, controller: Any, token: str) -> Any:
        return CourierClient(self.uid, self.description, controller, token)


def _rebuild_handle(cls: type[Handle], uid: str, description: str) -> Handle:
    handle = cls.__new__(cls)
    handle.uid, handle._node, handle._description = uid, None, description
    return handle


def dereference(value: Any) -> Any:
    """``value`` with every handle inside lists, tuples and dicts replaced by its client."""
    if isinstance(value, Handle):
        return value.dereference()
    if isinstance(value, list):
        return [dereference(v) for v in value]
    if isinstance(value, tuple):
        items = [dereference(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {k: dereference(v) for k, v in value.items()}
    return value


class Node:
    """Base of every node type."""

    handle_type: type[Handle] = Handle

    def __init__(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.target = target
        self.args, self.kwargs = args, kwargs
        self.uid = uuid.uuid4().hex[:12]
        self.label = ""
        self.index: int | str = 0
        self.program: Owner | None = None
        self.should_run = True

    def disable_run(self) -> None:
        """Do not call the object's ``run()`` (a CourierNode then just serves)."""
        self.should_run = False

    @property
    def description(self) -> str:
        name = getattr(self.target, "__qualname__", type(self.target).__name__)
        where = f"'{self.label}/{self.index}'" if self.label else "(not in a program yet)"
        return f"{type(self).__name__}({name}) {where}"

    def create_handle(self) -> Handle:
        return self.handle_type(self)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "program": None}  # a node travels without its program

    def configure(self, *args: Any, **kwargs: Any) -> None:
        """Set the constructor's arguments after the node's handle exists (for cycles)."""
        self.args, self.kwargs = args, kwargs

    def served_nodes(self) -> list[Node]:
        """This node and any it runs inside it (colocation)."""
        return [self]

    def execute(self, context: ctx.NodeContext) -> None:
        """Run the node to completion in the calling thread (with ``context`` bound)."""
        raise NotImplementedError

    def _construct(self) -> Any:
        args, kwargs = dereference(self.args), dereference(self.kwargs)
        try:
            return self.target(*args, **kwargs)
        except Exception as exc:
            exc.add_note(f"in the constructor of {self.description}")
            raise


class PyNode(Node):
    """Runs a function once."""

    def execute(self, context: ctx.NodeContext) -> None:
        self._construct()


class PyClassNode(Node):
    """Builds an object and calls its ``run()``."""

    def execute(self, context: ctx.NodeContext) -> None:
        instance = self._construct()
        run = getattr(instance, "run", None)
        if callable(run) and self.should_run:
            run()


class CourierNode(Node):
    """Builds an object and serves its public methods; runs its ``run()`` if it has one.

    ``courier_kwargs={"thread_pool_size": n}`` sets how many calls it serves at once.
    """

    handle_type = CourierHandle

    def __init__(self, target: Callable[..., Any], *args: Any,
                 courier_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(target, *args, **kwargs)
        unknown = set(courier_kwargs or {}) - {"thread_pool_size"}
        if unknown:
            raise ValueError(f"unsupported courier_kwargs {sorted(unknown)} for "
                             f"{self.description}; rtml supports thread_pool_size")
        self.threads = int((courier_kwargs or {}).get("thread_pool_size", HANDLER_THREADS))

    def execute(self, context: ctx.NodeContext) -> None:
        instance = self._construct()
        server = CourierServer(instance, self.description, context.host, context.token,
                               wrap=lambda f: ctx.run_in_context(context, f),
                               threads=self.threads)
        context.controller.register(self.uid, server.address)
        try:
            run = getattr(instance, "run", None)
            if callable(run) and self.should_run:
                _run_in_thread(context, run, f"lp-run-{self.label}")
            else:
                context.stop_event.wait()
        finally:
            context.controller.unregister(self.uid)
            server.close()


def _run_in_thread(context: ctx.NodeContext, fn: Callable[[], Any], name: str) -> None:
    """Run ``fn`` in its own thread (bound to ``context``); re-raise what it raised."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=ctx.run_in_context(context, body), name=name,
                              daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


class MultiThreadingColocation(Node):
    """Runs several nodes as threads of one process; each keeps its own handle.

    It ends when all its nodes have (or, with ``return_on_first_completed``, when
    the first has), or raises the first node's error.
    """

    def __init__(self, nodes: list[Node], return_on_first_completed: bool = False) -> None:
        super().__init__(_colocated)
        self.nodes = list(nodes)
        self.return_on_first_completed = return_on_first_completed

    @property
    def description(self) -> str:
        where = f"'{self.label}/{self.index}'" if self.label else "(not in a program yet)"
        return f"MultiThreadingColocation({len(self.nodes)} nodes) {where}"

    def served_nodes(self) -> list[Node]:
        return [self, *self.nodes]

    def execute(self, context: ctx.NodeContext) -> None:
        """Run every node in its own thread; end as the class docstring says."""
        changed = threading.Condition()
        errors: list[BaseException] = []
        running = [len(self.nodes)]
        for node in self.nodes:
            inner = context.for_node(node)

            def body(node: Node = node, inner: ctx.NodeContext = inner) -> None:
                try:
                    node.execute(inner)
                except BaseException as exc:
                    errors.append(exc)
                with changed:
                    running[0] -= 1
                    changed.notify_all()

            threading.Thread(target=ctx.run_in_context(inner, body), daemon=True,
                             name=f"lp-{node.label}").start()
        enough = 1 if self.return_on_first_completed else len(self.nodes)
        with changed:
            changed.wait_for(lambda: errors or len(self.nodes) - running[0] >= enough)
        if errors:
            raise errors[0]


def _colocated() -> None:
    """Placeholder target of a colocation (its nodes do the work)."""
