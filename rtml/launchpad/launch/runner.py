"""Running one node wherever a launcher put it (a thread, a process, an rtml actor)."""

from __future__ import annotations

import contextlib
import logging

from rtml.launchpad import context as ctx
from rtml.launchpad.launch.program_handle import node_failure
from rtml.launchpad.nodes import Node

log = logging.getLogger(__name__)


def run_node(node: Node, context: ctx.NodeContext) -> bool:
    """Run ``node`` to its end and report how it ended; True if it ended cleanly."""
    ctx.set_current(context)
    try:
        node.execute(context)
    except BaseException as exc:  # noqa: BLE001 - every failure is the program's business
        if context.stop_event.is_set() and isinstance(exc, (SystemExit, ConnectionError)):
            _report(context, None)  # interrupted or cut off by the program's own stop
            return True
        log.error("%s failed: %r", node.description, exc)
        _report(context, node_failure(node, exc))
        return False
    finally:
        ctx.set_current(None)
    _report(context, None)
    return True


def _report(context: ctx.NodeContext, error: BaseException | None) -> None:
    with contextlib.suppress(ConnectionError, OSError):  # the launcher may be gone
        if error is None:
            context.controller.finished(context.uid)
        else:
            context.controller.failed(context.uid, _picklable(error))


def _picklable(error: BaseException) -> BaseException:
    from rtml.launchpad import wire

    try:
        wire.cloudpickle.dumps(error)
        return error
    except Exception:
        text = "\n".join(getattr(error, "__notes__", []))
        return RuntimeError(f"{error!r} (not picklable)\n{text}")
