"""Where node code finds its program: the stop calls of Launchpad's API.

A node runs with a :class:`NodeContext` (which node, which program, how to reach
the program's controller). Threads that the program layer starts for a node
(courier handlers, ``run()``) carry it in a thread-local; a node process also
sets it as the process default, so threads the user starts see it too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class NodeContext:
    """One running node: its identity, its program's controller, where it serves."""

    uid: str
    description: str
    controller: Any  # Controller | RemoteController
    host: str  # the address its courier server listens on
    token: str  # the program's token, presented on every connection
    stop_event: threading.Event = field(default_factory=threading.Event)
    handlers: list[Callable[[], None]] = field(default_factory=list)
    stopping: bool = False  # handlers registered from now on run at once
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.controller.add_stop_listener(self._on_stop)

    def for_node(self, node: Any) -> NodeContext:
        """The context of another node run in the same process (colocation)."""
        return NodeContext(node.uid, node.description, self.controller, self.host,
                           self.token)

    def _on_stop(self) -> None:
        # Handlers first: a node returns (and its process may exit) as soon as the event
        # is set, which must not cut a handler short.
        with self.lock:
            self.stopping = True
            handlers = list(self.handlers)
        for handler in handlers:
            self.run_handler(handler)
        self.stop_event.set()

    def run_handler(self, handler: Callable[[], None]) -> None:
        try:
            handler()
        except Exception:
            log.exception("a stop handler of %s failed", self.description)


_local = threading.local()
_process_default: NodeContext | None = None
_launched: list[Any] = []  # programs launched from this process (their handles)


def current() -> NodeContext | None:
    return getattr(_local, "context", None) or _process_default


def set_current(context: NodeContext | None) -> None:
    """Bind ``context`` to this thread."""
    _local.context = context


def set_process_default(context: NodeContext | None) -> None:
    global _process_default
    _process_default = context


def run_in_context(context: NodeContext, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped to run with ``context`` bound to whatever thread calls it."""
    def bound(*args: Any, **kwargs: Any) -> Any:
        previous = getattr(_local, "context", None)
        _local.context = context
        try:
            return fn(*args, **kwargs)
        finally:
            _local.context = previous
    return bound


def launched(program_handle: Any) -> None:
    _launched.append(program_handle)


def forget(program_handle: Any) -> None:
    """The program ended: ``lp.stop()`` from the launching process no longer concerns it."""
    if program_handle in _launched:
        _launched.remove(program_handle)


def launched_program(program: Any) -> Any:
    """The running launch of ``program`` from this process, if any."""
    return next((h for h in _launched if h.program is program), None)


def stop() -> None:
    """Stop the program this node belongs to (from the launching process: every
    program it launched). Nodes get their stop event and handlers, then a grace
    period, then are killed."""
    context = current()
    if context is not None:
        context.controller.request_stop()
        return
    for handle in list(_launched):
        handle.stop()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until the program is stopping (True) or ``timeout`` s passed (False)."""
    return stop_event().wait(timeout)


def stop_event() -> threading.Event:
    """The event set when this node's program stops."""
    context = current()
    if context is None:
        raise RuntimeError("lp.stop_event() / lp.wait_for_stop() work inside a node of a "
                           "launched program; call them from the node's code")
    return context.stop_event


def register_stop_handler(handler: Callable[[], None]) -> None:
    """Call ``handler()`` when this node's program stops (before the grace period ends)."""
    context = current()
    if context is None:
        raise RuntimeError("lp.register_stop_handler() works inside a node of a launched "
                           "program; call it from the node's code")
    with context.lock:
        context.handlers.append(handler)
        stopping = context.stopping
    if stopping:
        context.run_handler(handler)
