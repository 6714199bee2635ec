"""What every launcher shares: the program's controller, outcomes, restarts, stop and wait.

    node outcome (controller) --> finished: when every node has, the program is done
                              \\-> failed:  restarts left for its group? restart the node
                                           else: remember the first error, stop the program
    stop() --> controller.request_stop() (nodes see lp.wait_for_stop / stop handlers)
           --> after `grace_period` s: kill what still runs; the program is done
    wait() --> blocks until done; re-raises the first error

A test launch (``test_mt``, ``test_mp``, ``test_case=``) restarts nothing and its
grace period defaults to TEST_GRACE_PERIOD. A thread launch with ``serialize=False``
runs the nodes themselves rather than copies, so they may share objects that do
not pickle (a ``threading.Event``, a mock) with the test that launched them.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from rtml.launchpad import context as ctx
from rtml.launchpad.controller import CONNECT_TIMEOUT, Controller
from rtml.launchpad.nodes import Node
from rtml.launchpad.program import Program

log = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD = 5.0
TEST_GRACE_PERIOD = 2.0
"""A test's nodes get less time to stop: a test that waits longer for a stuck node only
takes longer to fail."""
WAIT_SLICE = 0.5


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch, beyond the launch type (see ``lp.launch``)."""

    max_restarts: dict[str, int] = field(default_factory=dict)  # group label -> restarts
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)  # rtml actor options
    grace_period: float = DEFAULT_GRACE_PERIOD  # math.inf: never kill
    connect_timeout: float = CONNECT_TIMEOUT
    serialize: bool = True  # run copies of the nodes (cloudpickle) rather than the nodes
    for_test: bool = False


def node_failure(node: Node, error: BaseException) -> BaseException:
    """``error`` with a note naming the node (kept picklable for the trip to the launcher)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    error.add_note(f"{node.description} failed:\n{text}")
    return error


def _pickled(node: Node) -> bytes:
    """The node as it travels to where it runs. Raises TypeError naming the node."""
    try:
        return bytes(cloudpickle.dumps(node))
    except Exception as exc:
        raise TypeError(f"{node.description} cannot be sent to where it runs: its "
                        f"constructor arguments must pickle ({exc}); in a thread launch "
                        f"(local_mt, test_mt), lp.launch(..., serialize_py_nodes=False) "
                        f"runs the nodes without copying them") from None


class ProgramHandle:
    """A launched program: ``wait()`` for it to end, ``stop()`` it."""

    def __init__(self, program: Program, launch_type: str, options: LaunchOptions) -> None:
        self.program = program
        self.launch_type = launch_type
        self.options = options
        self.grace_period = options.grace_period
        self.token = secrets.token_hex(16)
        self.nodes = {node.uid: node for node in program.get_all_nodes()}
        descriptions = {n.uid: n.description for node in self.nodes.values()
                        for n in node.served_nodes()}
        self.controller = Controller(program.name, descriptions, self._on_outcome,
                                     options.connect_timeout)
        self._restarts = {uid: options.max_restarts.get(node.label, 0)
                          for uid, node in self.nodes.items()}
        self._running = set(self.nodes)
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._killer: threading.Timer | None = None
        self.controller.add_stop_listener(self._on_stop)
        ctx.launched(self)

    # -- what a launch type provides ---------------------------------------------------------

    def start_node(self, node: Node) -> None:
        raise NotImplementedError

    def kill_all(self) -> None:
        """Force every node that still runs to end (after the grace period)."""
        raise NotImplementedError

    # -- shared behaviour -------------------------------------------------------------------

    def start(self) -> ProgramHandle:
        """Start every node. Raises TypeError naming a node that cannot be pickled
        (before any node starts); a failure to start one stops those already started."""
        self.blobs = {uid: _pickled(node) for uid, node in self.nodes.items()} \
            if self.options.serialize else {}
        if not self.nodes:
            self.done.set()
        try:
            for node in self.nodes.values():
                self.start_node(node)
        except BaseException:
            self.stop()
            self._kill()
            raise
        return self

    def _on_outcome(self, uid: str, error: BaseException | None) -> None:
        node = self.nodes.get(uid)
        if node is None:
            return  # a node inside a colocation: its colocation reports for it
        restart = False
        with self._lock:
            if uid not in self._running:
                return
            if error is not None and not self.controller.stopped.is_set() \
                    and self._restarts[uid] != 0:
                self._restarts[uid] -= 1
                restart = True
            else:
                self._running.discard(uid)
                if error is not None and self.error is None:
                    self.error = error
        if restart:
            log.warning("%s failed; restarting it (%s restart(s) left): %s", node.description,
                        "unlimited" if self._restarts[uid] < 0 else self._restarts[uid], error)
            self.restart_node(node)
        elif error is not None:
            self.stop()
        if not self._running:
            self._finish()

    def restart_node(self, node: Node) -> None:
        self.start_node(node)

    def crashed(self, node: Node, why: str, final: bool = False) -> None:
        """A node ended without reporting (its process died); ``final``: no restart."""
        if final:
            with self._lock:
                self._restarts[node.uid] = 0
        self._on_outcome(node.uid, RuntimeError(f"{node.description} {why}"))

    def running(self, node: Node) -> bool:
        with self._lock:
            return node.uid in self._running

    def stop(self) -> None:
        """Ask every node to stop; kill what still runs after the grace period."""
        self.controller.request_stop()

    def _on_stop(self) -> None:
        with self._lock:
            if self._killer is not None or self.done.is_set() or math.isinf(self.grace_period):
                return
            self._killer = threading.Timer(self.grace_period, self._kill)
            self._killer.daemon = True
            self._killer.start()

    def _kill(self) -> None:
        if self.done.is_set():
            return
        with self._lock:
            late = [self.nodes[uid].description for uid in self._running]
        if late:
            log.warning("killing %d node(s) still running %.1f s after stop: %s", len(late),
                        self.grace_period, ", ".join(late))
        try:
            self.kill_all()
        finally:
            self._finish()  # whatever killing did, the program is over: wait() returns

    def _finish(self) -> None:
        if self.done.is_set():
            return
        self.done.set()
        ctx.forget(self)
        if self._killer is not None:
            self._killer.cancel()
        self.controller.request_stop()  # idle servers of a finished program go too
        self.cleanup()

    def cleanup(self) -> None:
        """Release what the launch type holds once the program is done."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the program ends; re-raise the first node error. False on timeout."""
        if not self._wait_done(timeout):
            return False
        if self.error is not None:
            raise self.error
        return True

    def _wait_done(self, timeout: float | None) -> bool:
        """``done.wait(timeout)`` in slices. A thread launch kills a node by raising
        SystemExit in its thread, which may land inside ``done.set()`` between waking two
        waiters; a waiter that re-checks the flag cannot be left asleep by it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_SLICE if deadline is None else min(WAIT_SLICE,
                                                           deadline - time.monotonic())
            if self.done.wait(max(left, 0.0)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def __enter__(self) -> ProgramHandle:
        return self

    def end_test(self) -> None:
        """The cleanup of the test that launched the program (``test_case=``): stop it,
        wait for it, re-raise a node's error. Raises TimeoutError if it outlives the kill."""
        self.stop()
        if not self.wait(self.grace_period + 10):
            raise TimeoutError(f"program {self.program.name!r} still runs "
                               f"{self.grace_period + 10:g} s after the test stopped it")

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self._wait_done(self.grace_period + 5)
