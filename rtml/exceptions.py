"""Every error rtml raises, rooted at :class:`RtmlError`.

Each class says when it is raised and what to do about it. Every error pickles,
so errors travel from workers to owners and on to downstream tasks intact.
"""

from __future__ import annotations

from typing import Any

from rtml.ids import NO_OBJECT, ObjectID


class RtmlError(Exception):
    """Base of every rtml error."""


class TaskError(RtmlError):
    """The user's code raised inside a task or actor method.

    The object raised by ``get`` is also an instance of the user's exception
    class, so ``except ValueError`` works. ``cause`` is the original exception;
    ``str()`` names the task, the pid and node, and holds the remote traceback.
    """

    def __init__(self, task_name: str, traceback_text: str, cause: BaseException | None,
                 pid: int = 0, node_id: str = "") -> None:
        self.task_name = task_name
        self.traceback_text = traceback_text
        self.cause = cause
        self.pid = pid
        self.node_id = node_id
        # Not super(): in the dual class the next __init__ is the user's, whose
        # signature we cannot know.
        Exception.__init__(self, self._message())

    def _message(self) -> str:
        where = f"pid={self.pid}, node={self.node_id[:12]}" if self.pid else "driver"
        return (f"task {self.task_name!r} failed ({where}):\n{self.traceback_text.rstrip()}")

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_task_error,
                (self.task_name, self.traceback_text, self.cause, self.pid, self.node_id))

    def as_instanceof_cause(self) -> TaskError:
        """Return a TaskError that is also an instance of ``type(self.cause)``."""
        cause_cls = type(self.cause) if self.cause is not None else None
        if cause_cls is None or isinstance(self, cause_cls) or not _subclassable(cause_cls):
            return self
        cls = _dual_class(cause_cls)
        err: TaskError = cls.__new__(cls)  # type: ignore[call-overload]
        TaskError.__init__(err, self.task_name, self.traceback_text, self.cause,
                           self.pid, self.node_id)
        err.args = getattr(self.cause, "args", err.args)
        return err


_DUAL_CLASSES: dict[type, type] = {}


def _subclassable(cls: type) -> bool:
    if not issubclass(cls, Exception) or issubclass(cls, RtmlError):
        return False
    try:
        type("_Probe", (TaskError, cls), {})
    except TypeError:
        return False
    return True


def _dual_class(cause_cls: type) -> type:
    cls = _DUAL_CLASSES.get(cause_cls)
    if cls is None:
        cls = type(f"TaskError({cause_cls.__name__})", (TaskError, cause_cls),
                   {"__init__": TaskError.__init__, "__str__": TaskError.__str__,
                    "__reduce__": TaskError.__reduce__})
        _DUAL_CLASSES[cause_cls] = cls
    return cls


def _rebuild_task_error(task_name: str, traceback_text: str, cause: BaseException | None,
                        pid: int, node_id: str) -> TaskError:
    return TaskError(task_name, traceback_text, cause, pid, node_id).as_instanceof_cause()


class ActorDiedError(RtmlError):
    """The actor died or was killed and has no restarts left.

    If its constructor raised, the message contains that error. Create a new
    actor, or give it ``max_restarts`` to survive process deaths.
    """


ActorError = ActorDiedError


class ActorUnavailableError(ActorDiedError):
    """A call was lost because the actor's process died while it ran, and the actor was
    restarted (it has ``max_restarts``): the call may or may not have run, and later calls
    reach the restarted actor. Give the method ``max_task_retries`` to retry such calls
    (then they run at least once). An ``ActorDiedError`` too, as Ray's is an
    ``ActorError``."""


class WorkerCrashedError(RtmlError):
    """The worker process running the task died and ``max_retries`` is used up.

    Look for the cause in the worker log in the session directory (segfault,
    ``os._exit``, out of memory); raise ``max_retries`` if the crash is transient.
    """


class NodeDiedError(RtmlError):
    """The node running the task died and retries are used up."""


class ObjectLostError(RtmlError):
    """Every copy of the object is gone and it cannot be rebuilt; the message says why
    (objects made by ``put`` and results of actor calls are never rebuilt, a task result
    only within its task's ``max_retries`` and while the arguments it needs live).

    ``object_id``: the lost object's id, when known.
    """

    def __init__(self, message: str = "", object_id: ObjectID = NO_OBJECT) -> None:
        super().__init__(message)
        self.object_id = object_id

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.object_id)


class OwnerDiedError(ObjectLostError):
    """The process that owned the object (it called ``put``, or submitted the task making
    it) died before its value existed, so nobody can make it any more.

    Keep a ref alive past its creator by having a longer-lived process (the driver, a
    detached actor) create it, or by returning its value instead of the ref.
    """


class ObjectStoreFullError(RtmlError):
    """A new object (a ``put``, a task's return) found no room in its node's object store,
    even after spilling what could be spilled and waiting for objects to be freed.

    Drop refs you no longer need (so their objects are freed), or give the node a larger
    ``object_store_memory``.
    """


class OutOfDiskError(ObjectStoreFullError):
    """The object store is full and spilling objects to disk failed (the message names the
    directory and the error, such as no space left on the device). The objects that could
    not be spilled stay in memory, readable. Free space there, or give the node a larger
    ``object_store_memory``."""


class GetTimeoutError(RtmlError, TimeoutError):
    """``get`` or ``wait`` ran out of time; the object may still arrive later."""


class TaskCancelledError(RtmlError):
    """The task was cancelled with ``rtml.cancel``; cancelled tasks are never retried."""


class RuntimeEnvSetupError(RtmlError):
    """A task's or actor's ``runtime_env`` could not be set up on its node (a pip install
    failed, a package could not be fetched or unpacked), as Ray's. The message says which
    part failed, on which node, and how to fix it; the task is not retried (an actor's
    creation fails, and its calls raise ActorDiedError with this message)."""


class ActorExit(BaseException):
    """Raised by ``rtml.actor.exit_actor()`` inside an actor to end it: not an error. The
    actor's process runs its atexit handlers and exits; it is not restarted, and its
    calls not yet answered (this one included) raise ActorDiedError. A BaseException,
    so an ``except Exception`` in the method does not stop the exit."""


class RtmlSystemError(RtmlError):
    """An internal component failed; the message names it and what to do."""


class LogNotFoundError(RtmlError, LookupError):
    """``rtml logs`` or the dashboard asked for a node or a log file that is not there
    (no alive node with that id, no such file on it); the message says how to list
    what is. A ``LookupError`` too, so the dashboard answers it with 404."""


class ReplayError(RtmlError):
    """``rtml.debug.replay`` / ``rtml debug`` cannot rebuild the task's call; the message
    says why (not recorded, not run yet, an actor call, an argument freed or too large to
    be kept) and what to do."""


class ProtocolError(RtmlError):
    """A peer sent a frame that breaks the wire protocol (bad token, bad size, bad shape)."""


__all__ = [
    "ActorDiedError", "ActorError", "GetTimeoutError", "LogNotFoundError", "NodeDiedError",
    "ObjectLostError", "ObjectStoreFullError", "OutOfDiskError", "OwnerDiedError",
    "ProtocolError", "ReplayError", "RtmlError", "RtmlSystemError", "RuntimeEnvSetupError",
    "TaskCancelledError", "TaskError", "WorkerCrashedError",
]


# Ray's names for the same errors, so that ``except ray.exceptions.RayActorError`` (as
# Ray's documentation writes it) works with ``import rtml as ray``.
RayError = RtmlError
RayTaskError = TaskError
RayActorError = ActorDiedError
RaySystemError = RtmlSystemError
