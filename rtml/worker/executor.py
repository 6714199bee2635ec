"""The worker's side of a task: resolve arguments, run user code, send results back.

    PushTask --> Executor.push --inline (tasks, sync actors)--> execute --> TaskResult
                                 --thread pool (max_concurrency > 1)-------^
                                 --asyncio loop thread (async actors)------^
    (an actor's concurrency groups: a thread pool, or a semaphore on the loop, each)

Cancellation arrives on the runtime's I/O thread; if the task is running, a
signal interrupts the main thread at its next bytecode (as Ctrl-C would).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import cloudpickle

from rtml.config import INLINE_MAX
from rtml.core import actors, context
from rtml.core.memory_store import StoredError
from rtml.core.runtime import ClientRuntime
from rtml.core.serialization import Serialized, deserialize, from_payload, plain_payload, serialize
from rtml.exceptions import (
    ActorExit,
    ObjectLostError,
    ObjectStoreFullError,
    OwnerDiedError,
    RtmlError,
    RuntimeEnvSetupError,
    TaskCancelledError,
    TaskError,
)
from rtml.ids import (
    NO_ACTOR,
    NO_NODE,
    UNKNOWN_JOB,
    ObjectID,
    TaskID,
    first_return_id,
    object_id_for,
)
from rtml.rpc import messages as m
from rtml.rpc.reactor import Connection

log = logging.getLogger(__name__)


CUDA_ENV = "CUDA_VISIBLE_DEVICES"
FAILURE_TEXT_MAX = 20_000
"""Characters of a failed attempt's traceback kept in its task record (the end of it)."""
_NO_KWARGS: Mapping[str, Any] = {}
"""The keyword arguments of a call without any. A dict, read only here (``**`` gives the
callee its own copy): ``**`` of an empty dict costs 0.15 us, of an empty MappingProxyType
0.6 us (it goes through the generic mapping protocol), of nothing 0.05."""


def set_visible_gpus(gpu_ids: Sequence[int]) -> None:
    """Show user code exactly the GPUs of its lease (none: the variable is removed)."""
    if gpu_ids:
        os.environ[CUDA_ENV] = ",".join(str(i) for i in gpu_ids)
    else:
        os.environ.pop(CUDA_ENV, None)


def _since(start: float, ts: float) -> int:
    """Microseconds from ``start`` to ``ts``; -1 for a phase not reached (``ts`` 0.0)."""
    return int((ts - start) * 1e6) if ts else -1


class _Failed(Exception):
    """An argument is an error value: the task fails with it without running."""

    def __init__(self, payload: m.Payload) -> None:
        self.payload = payload


class _Wanted(Exception):
    """A task's function is not in the control plane now: its owner is asked for it."""

    def __init__(self, function_id: bytes) -> None:
        self.function_id = function_id


class Executor:
    def __init__(self, rt: ClientRuntime) -> None:
        self.rt = rt
        self.pushed: dict[bytes, bytes] = {}  # functions owners sent, until first loaded
        self.current: bytes | None = None
        self.current_job = UNKNOWN_JOB  # whose task last ran here: its drivers get our output
        self.cancelled: set[TaskID] = set()
        self.calls: dict[bytes, int] = {}  # runs by function, of those with max_calls
        context.set_cancelled(self.cancelled)  # what a task's is_canceled() reads
        self.instance: Any = None
        self.methods: dict[str, Any] = {}  # the actor's methods, bound on first call
        self.actor: m.ActorSpec | None = None
        self.actor_id = NO_ACTOR  # this worker's actor, once constructed
        self.push = self._run_and_reply
        """Runs or dispatches a call, by the kind of worker: inline (tasks, one-at-a-time
        actors), on the thread pool (threaded actors) or on the event loop (async actors)."""
        self.pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}  # by group ("")
        self.loop: asyncio.AbstractEventLoop | None = None
        self._inbox: list[tuple[Connection, m.TaskSpec]] = []  # calls for the loop
        self._inbox_lock = threading.Lock()
        self._inbox_posted = False  # a _start_calls is on its way to the loop
        self._running_calls: set[asyncio.Task[None]] = set()  # the loop keeps only weak refs
        self._cancellable: dict[TaskID, asyncio.Task[None]] = {}  # by task id, until it ends
        self.semaphores: dict[str, asyncio.Semaphore] = {}  # by concurrency group ("")
        self.visible_gpus: Sequence[int] | None = None  # as last set; None: not set yet
        self.pid = os.getpid()  # for every result: getpid is a syscall each time
        self.setup_error = ""  # why this worker's runtime env could not be set up (refuse)
        self.front = 0  # paths its runtime env put first on sys.path: owners' go behind them
        self.started = 0  # calls begun, and those ended with a value or an error: the node
        self.finished = 0  # manager's metrics (CountTasks); plain increments, as the hot path
        self.failed = 0  # allows (a threaded actor's may race: a count, not a ledger)
        signal.signal(signal.SIGUSR1, self._on_cancel_signal)

    # -- dispatch ----------------------------------------------------------------------------

    def _push_to_loop(self, conn: Connection, spec: m.TaskSpec) -> None:
        assert self.loop is not None
        # One wake-up of the loop per burst, not a Future and a wake-up per call.
        with self._inbox_lock:
            self._inbox.append((conn, spec))
            if self._inbox_posted:
                return
            self._inbox_posted = True
        self.loop.call_soon_threadsafe(self._start_calls)

    def _push_to_pool(self, conn: Connection, spec: m.TaskSpec) -> None:
        pool = self.pools.get(spec.concurrency_group)
        if pool is None:
            conn.send(self._no_group(spec))
            return
        pool.submit(self._run_and_reply, conn, spec)

    def _no_group(self, spec: m.TaskSpec) -> m.TaskResult:
        groups = sorted(g for g in (self.pools or self.semaphores) if g)
        error = ValueError(f"actor call {spec.name!r} names concurrency group "
                           f"{spec.concurrency_group!r}, which the actor does not have; its "
                           f"groups are {groups} (concurrency_groups= when it is created)")
        return self._result(spec, self._exception_returns(spec, error), time.time())

    def _run_and_reply(self, conn: Connection, spec: m.TaskSpec) -> None:
        try:
            result = self.execute(spec, conn)
        except Exception as exc:  # a bug of ours: the owner must still get an answer
            log.exception("executing %s failed", spec.name)
            result = self._result(spec, self._plain_error_returns(spec, exc), time.time())
        self.rt.refs.settle()  # see ReferenceCounter.settle: before the owner may release
        retire = bool(spec.max_calls) and self._used_up(spec)
        if retire:  # before the result: its owner must not hand this lease back to the node
            conn.send(m.WorkerRetiring())
        conn.send(result)
        if retire:
            self._retire(conn)

    def _used_up(self, spec: m.TaskSpec) -> bool:
        """Whether ``spec``'s function has now run ``max_calls`` times in this worker."""
        count = self.calls[spec.function_id] = self.calls.get(spec.function_id, 0) + 1
        return count >= spec.max_calls

    def _retire(self, conn: Connection) -> NoReturn:
        """Exit after the last result, as Ray does at ``max_calls`` (what the function held,
        GPU memory say, goes with the process); the owner resubmits what it pushed since."""
        conn.drain_blocking(5.0)  # its owner first (told before the result): then its node
        self.rt.nm.send(m.WorkerRetiring())  # (and leases it out no more)
        self.rt.nm.drain_blocking(5.0)
        sys.stdout.flush()
        sys.stderr.flush()
        log.info("exiting: a function ran max_calls times")
        os._exit(0)

    def _start_calls(self) -> None:
        """On the actor's event loop: start every call received since the last wake-up."""
        assert self.loop is not None
        with self._inbox_lock:
            calls, self._inbox = self._inbox, []
            self._inbox_posted = False
        for conn, spec in calls:  # in arrival order: they start (and run) in order
            task = self.loop.create_task(self._run_async(conn, spec))
            self._running_calls.add(task)
            task.add_done_callback(self._running_calls.discard)
            self._cancellable[spec.task_id] = task

    async def _run_async(self, conn: Connection, spec: m.TaskSpec) -> None:
        semaphore = self.semaphores.get(spec.concurrency_group)
        if semaphore is None:
            conn.send(self._no_group(spec))
            return
        try:
            async with semaphore:
                result = await self._call_async(spec, conn)
        except asyncio.CancelledError:  # cancelled while it waited for its turn
            self._cancellable.pop(spec.task_id, None)
            result = self._cancelled(spec, time.time())
        refs = self.rt.refs  # settle() without blocking the loop for the fence
        refs.drain()
        if refs.needs_fence():
            await asyncio.get_running_loop().run_in_executor(None, refs.fence)
        conn.send(result)

    async def _call_async(self, spec: m.TaskSpec, conn: Connection) -> m.TaskResult:
        start = time.time()
        self.started += 1
        args_ts = run_end_ts = 0.0
        if spec.task_id in self.cancelled:  # cancelled before it started
            self.cancelled.discard(spec.task_id)
            return self._cancelled(spec, start)
        try:
            context.set_current_task(spec)  # this asyncio task's own context
            method, args, kwargs = self._prepare(spec)
            args_ts = time.time()
            value = method(*args, **kwargs)
            if spec.num_returns == m.STREAMING:
                await self._stream_async(spec, value, conn)
                value = None  # its return: its completion
            elif inspect.isawaitable(value):
                value = await value
            run_end_ts = time.time()
            returns = self._returns(spec, value)
        except ActorExit:
            self.exit_actor()
        except _Failed as failed:
            returns = self._error_returns(spec, failed.payload)
        except ObjectStoreFullError as exc:  # no room for its return: the error itself
            returns = self._error_returns(spec, _stored_error(exc))
        except (Exception, asyncio.CancelledError) as exc:  # cancelled: a TaskError, as Ray
            returns = self._exception_returns(spec, exc)
        finally:
            self._cancellable.pop(spec.task_id, None)  # too late to cancel from here on
        return self._result(spec, returns, start, args_ts, run_end_ts)

    def refuse(self, error: str) -> None:
        """This worker's runtime env could not be set up (``error`` says why): every call
        sent to it fails with RuntimeEnvSetupError without running, and an actor's
        creation fails (``become_actor``); nothing runs without its env."""
        self.setup_error = error
        self.push = self._refuse_call

    def _refuse_call(self, conn: Connection, spec: m.TaskSpec) -> None:
        error = RuntimeEnvSetupError(f"task {spec.name!r} did not run: {self.setup_error}")
        conn.send(self._result(spec, self._error_returns(spec, _stored_error(error)),
                               time.time()))

    # -- one task ----------------------------------------------------------------------------

    def execute(self, spec: m.TaskSpec, conn: Connection
                ) -> m.TaskResult | m.FunctionWanted:
        start = time.time()
        self.started += 1
        if spec.gpu_ids != self.visible_gpus and self.actor is None:  # an actor keeps its own
            set_visible_gpus(spec.gpu_ids)
            self.visible_gpus = spec.gpu_ids
        if spec.task_id in self.cancelled:
            self.cancelled.discard(spec.task_id)
            return self._cancelled(spec, start)
        args_ts = run_end_ts = 0.0
        try:
            function, args, kwargs = self._prepare(spec)
            args_ts = time.time()
            self.current = spec.task_id
            context.set_current_task(spec)
            try:
                value = function(*args, **kwargs)
                if spec.num_returns == m.STREAMING:
                    self._stream(spec, value, conn)
                    value = None  # its return: its completion
            finally:
                self.current = None
                context.set_current_task(None)
            run_end_ts = time.time()
            returns = self._returns(spec, value)
        except TaskCancelledError:
            self.cancelled.discard(spec.task_id)
            return self._cancelled(spec, start)
        except ActorExit:
            self.exit_actor()
        except _Wanted as wanted:  # it did not run: its owner sends the function, then it
            self.started -= 1  # (begins again)
            return m.FunctionWanted(spec.task_id, wanted.function_id)
        except _Failed as failed:
            returns = self._error_returns(spec, failed.payload)
        except ObjectStoreFullError as exc:
            returns = self._error_returns(spec, _stored_error(exc))
        except Exception as exc:
            returns = self._exception_returns(spec, exc)
        return self._result(spec, returns, start, args_ts, run_end_ts)

    def _prepare(self, spec: m.TaskSpec) -> tuple[Any, Sequence[Any], Mapping[str, Any]]:
        self.current_job = spec.job_id
        if self.actor is None:  # an actor's calls belong to its job (set_process_job)
            context.set_task_job(spec.job_id)
        if spec.actor_id:
            if spec.actor_id != self.actor_id:
                raise RtmlError(f"this worker is not actor {spec.actor_id.hex()}")
            function = self.methods.get(spec.method) or self._method(spec.method)
        else:
            function = self.function(spec.function_id, ask_owner=True)
        if not spec.args:
            return function, (), _NO_KWARGS
        values = [self._arg(arg) for arg in spec.args]
        split = len(values) - len(spec.kwarg_names)
        return function, values[:split], dict(zip(spec.kwarg_names, values[split:], strict=True))

    def _method(self, name: str) -> Any:
        """The actor's method ``name``, looked up on its class as Ray does, so that an
        instance attribute of the same name (``self.called = True`` beside ``def
        called``) does not hide it; bound once. A name the class lacks is looked up on
        the instance (and raises AttributeError there)."""
        if name == actors.TERMINATE:
            return _terminate
        cls = type(self.instance)
        try:
            attr = inspect.getattr_static(cls, name)
        except AttributeError:
            return getattr(self.instance, name)
        get = getattr(type(attr), "__get__", None)
        method = get(attr, self.instance, cls) if get is not None else attr
        self.methods[name] = method
        return method

    def function(self, function_id: bytes, *, ask_owner: bool) -> Any:
        """The exported function or class ``function_id``, loaded once and cached: as its
        owner sent it, else from the control plane. A task's function that Redis does not
        have now (away, or the owner's export still waits for it) is asked of its owner
        (``ask_owner``: raises _Wanted); an actor's class is waited for."""
        function = self.rt.functions.get(function_id)
        if function is None:
            blob = self.pushed.get(function_id)
            if blob is None:
                blob = (self.rt.stored_function(function_id) if ask_owner
                        else self.rt.fetch_function(function_id))
            if blob is None:
                raise _Wanted(function_id)
            function = self.rt.functions[function_id] = cloudpickle.loads(blob)
            self.pushed.pop(function_id, None)
        return function

    def define(self, function_id: bytes, blob: bytes) -> None:
        """An owner sent the function a task of its asked for (loaded when the task comes
        again, so that an error loading it is that task's)."""
        self.pushed[function_id] = blob

    def _arg(self, arg: m.TaskArg) -> Any:
        if arg.value is not None:
            if arg.value.is_error:
                raise _Failed(arg.value)
            return from_payload(arg.value)
        try:
            value = self.rt.shared.read(arg.object_id, arg.owner_id, None, arg.node_id)
        except OwnerDiedError:
            raise
        except ObjectLostError as exc:  # its owner may rebuild it, and push the task again
            lost = ObjectLostError(f"an argument of this task is lost: {exc}", arg.object_id)
            raise _Failed(_stored_error(lost)) from None
        if isinstance(value, StoredError):
            raise _Failed(serialize(value).to_payload(is_error=True))
        return value

    def _stream(self, spec: m.TaskSpec, items: Any, conn: Connection) -> None:
        """Send each item a generator task yields to its owner as it comes, in order (its
        index names its object); the task's own return, its completion, is None."""
        task_id = spec.task_id
        for index, item in enumerate(_generator_of(spec, items)):
            if self.current is None:  # (a threaded actor's call: no cancel signal)
                self._send_item(spec, index, item, conn)
                continue
            self.current = None  # the cancel signal interrupts its code, not our sending
            try:
                self._send_item(spec, index, item, conn)
            finally:
                self.current = task_id
            if task_id in self.cancelled:  # cancelled while the item was sent
                raise TaskCancelledError(f"task {spec.name!r} was cancelled")

    async def _stream_async(self, spec: m.TaskSpec, items: Any, conn: Connection) -> None:
        """``_stream`` for an async actor: an async generator's items, or a plain one's."""
        if not inspect.isasyncgen(items):
            self._stream(spec, items, conn)
            return
        index = 0
        async for item in items:
            self._send_item(spec, index, item, conn)
            index += 1

    def _send_item(self, spec: m.TaskSpec, index: int, item: Any, conn: Connection) -> None:
        object_id = object_id_for(spec.task_id, index + 2)
        ret = self._store_return(spec, object_id, _serialize_return(spec, item))
        self.rt.refs.settle()  # as before a result: before the owner may release
        conn.send(m.GeneratorItem(spec.task_id, index, ret))

    def _returns(self, spec: m.TaskSpec, value: Any) -> tuple[m.ReturnObject, ...]:
        count = spec.num_returns
        if count == 1 or count == m.STREAMING:  # the usual case, without the lists below
            object_id = first_return_id(spec.task_id)
            payload = plain_payload(value)
            if payload is not None:
                return (m.ReturnObject(object_id, payload, len(payload.data)),)
            return (self._store_return(spec, object_id, _serialize_return(spec, value)),)
        if count == 0:
            return ()
        if not isinstance(value, (tuple, list)) or len(value) != count:
            got = len(value) if isinstance(value, (tuple, list)) else "a non-sequence"
            raise ValueError(f"task {spec.name!r} has num_returns={count} but "
                             f"returned {got} value(s); return a tuple of exactly "
                             f"{count} values")
        sers = [_serialize_return(spec, v) for v in value]
        stored: list[m.ReturnObject] = []
        try:
            for oid, ser in zip(return_ids(spec), sers, strict=True):
                stored.append(self._store_return(spec, oid, ser))
        except ObjectStoreFullError:  # the task fails: the returns stored already go
            self._let_go(spec, stored)
            raise
        return tuple(stored)

    def _let_go(self, spec: m.TaskSpec, returns: list[m.ReturnObject]) -> None:
        """Release what storing ``returns`` held for their owner (see _store_return)."""
        in_store = [ret.object_id for ret in returns if ret.value is None]
        if in_store:
            self.rt.nm.send(m.ReleaseHolds(in_store, self._holder(spec)))
        for ret in returns:
            if ret.contained:
                self.rt.nm.send(m.ReleaseHolder(ret.object_id))

    def _store_return(self, spec: m.TaskSpec, object_id: ObjectID,
                      ser: Serialized) -> m.ReturnObject:
        if ser.contained:
            self.rt.refs.send_holds(m.AddHolds, [r.id for r in ser.contained], object_id)
        size = ser.size
        if size <= INLINE_MAX:
            return m.ReturnObject(object_id, ser.to_payload(), size, contained=bool(ser.contained))
        size = self.rt.shared.write(object_id, ser, holder=self._holder(spec))
        return m.ReturnObject(object_id, None, size)

    def _holder(self, spec: m.TaskSpec) -> bytes:
        """Who holds a return stored here: its owner, or the manager of the owner's node
        (which stands in for it, when it is on another node)."""
        return spec.owner_id if spec.owner_node in (NO_NODE, self.rt.node_id) else spec.owner_node

    def _exception_returns(self, spec: m.TaskSpec,
                           exc: BaseException) -> tuple[m.ReturnObject, ...]:
        error = exc if isinstance(exc, TaskError) else self.rt.task_error(spec.name, exc)
        try:
            payload = _stored_error(error)
        except TypeError as unpicklable:  # the user's exception does not pickle: keep its text
            plain = TaskError(spec.name, f"{error.traceback_text}\n(the exception itself could "
                              f"not be pickled: {unpicklable})", None, error.pid, error.node_id)
            payload = _stored_error(plain)
        # The frames' locals (refs among them) would live until a collection of the
        # cycle through the traceback, which an idle worker may never run: the holds
        # they keep would outlive the task.
        traceback.clear_frames(exc.__traceback__)
        self._record_failure(spec, error)
        return self._error_returns(spec, payload)

    def _record_failure(self, spec: m.TaskSpec, error: TaskError) -> None:
        """Write the error of an attempt that raised to the task's record (off the path of
        a task that succeeds): its owner keeps the error only in the return object, and
        the state API, ``rtml get task`` and the dashboard show it from here."""
        cause = error.cause if error.cause is not None else error
        self.rt.writer.submit_task({"task_id": spec.task_id, "failure": {
            "attempt": spec.attempt, "error_class": type(cause).__name__,
            "traceback": error.traceback_text[-FAILURE_TEXT_MAX:], "worker_pid": self.pid,
            "node_id": self.rt.node_id.hex(), "end_ts": time.time()}})

    def _plain_error_returns(self, spec: m.TaskSpec,
                             exc: BaseException) -> tuple[m.ReturnObject, ...]:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        error = TaskError(spec.name, text, None, os.getpid(), self.rt.node_id.hex())
        return self._error_returns(spec, _stored_error(error))

    def _error_returns(self, spec: m.TaskSpec,
                       payload: m.Payload) -> tuple[m.ReturnObject, ...]:
        return tuple([m.ReturnObject(oid, payload, len(payload.data), True)
                      for oid in return_ids(spec)])

    def _result(self, spec: m.TaskSpec, returns: tuple[m.ReturnObject, ...],
                start: float, args_ts: float = 0.0, run_end_ts: float = 0.0) -> m.TaskResult:
        """The task's result, timed: ``start`` (it arrived), ``args_ts`` (its arguments
        were ready), ``run_end_ts`` (its code returned), and now (its returns are stored):
        the phases of its timeline (0.0: a phase it did not reach), sent as microseconds
        from ``start``, which pack in a byte or two (the task table keeps them)."""
        if returns and returns[0].is_error:
            self.failed += 1
        else:
            self.finished += 1
        return m.TaskResult(spec.task_id, returns, start, _since(start, time.time()), self.pid,
                            self.rt.node_id, False, _since(start, args_ts),
                            _since(start, run_end_ts))

    def _cancelled(self, spec: m.TaskSpec, start: float) -> m.TaskResult:
        error = TaskCancelledError(f"task {spec.name!r} was cancelled")
        payload = _stored_error(error)
        result = self._result(spec, self._error_returns(spec, payload), start)
        result.cancelled = True
        return result

    # -- cancellation --------------------------------------------------------------------------

    def cancel_call(self, task_id: TaskID) -> None:
        """An owner cancelled an actor call it had sent (on the I/O thread): skipped if it
        has not started; an async method running gets asyncio.CancelledError. A sync
        method running runs to completion, as in Ray."""
        self.cancelled.add(task_id)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._cancel_running_call, task_id)

    def _cancel_running_call(self, task_id: TaskID) -> None:
        task = self._cancellable.get(task_id)
        if task is not None:
            self.cancelled.discard(task_id)
            task.cancel()

    def cancel(self, task_id: TaskID) -> None:
        """Called on the thread leading the I/O loop (the main thread itself while the task
        waits in get): interrupt ``task_id`` if running, else skip it later."""
        self.cancelled.add(task_id)
        if self.current == task_id:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    def _on_cancel_signal(self, signum: int, frame: Any) -> None:
        current = self.current
        if current is not None and current in self.cancelled:
            error = TaskCancelledError("task was cancelled")
            if self.rt.reactor.leads_here():  # inside a message handler: not here
                self.rt.reactor.interrupt_leader(error)
                return
            raise error

    # -- actors ------------------------------------------------------------------------------

    def exit_actor(self) -> NoReturn:
        """The actor's code called ``exit_actor()`` (or a caller ``__ray_terminate__``):
        the head is told not to restart it, the process's atexit handlers run, and it
        exits; its calls not answered yet get ActorDiedError from their callers."""
        rt = self.rt
        try:
            rt.links.request(rt.head, lambda req_id: m.ActorExiting(req_id, self.actor_id),
                       rt.head.timeout)
        except (RtmlError, OSError) as exc:
            log.warning("the head did not hear that this actor exits (%s): it may be "
                        "restarted", exc)
        log.info("actor %s exits: exit_actor() was called", self.actor_id.hex())
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def become_actor(self, spec: m.ActorSpec, gpu_ids: tuple[int, ...], restarts: int = 0
                     ) -> str:
        """Construct the actor (started ``restarts`` times before); return the
        constructor's error text, or ''."""
        self.actor = spec
        set_visible_gpus(gpu_ids)  # for its whole life: its methods never change it
        context.set_actor(context.ActorProcess(spec, gpu_ids, restarts))
        context.set_process_job(spec.job_id)
        for path in spec.sys_paths:
            if path not in sys.path:
                sys.path.insert(self.front, path)
        if self.setup_error:  # none of its code runs without its runtime env
            return self.setup_error
        try:
            cls = self.function(spec.class_id, ask_owner=False)
            values = [self._arg(arg) for arg in spec.args]
            split = len(values) - len(spec.kwarg_names)
            self.instance = cls(*values[:split], **dict(zip(spec.kwarg_names, values[split:],
                                                             strict=True)))
        except _Failed as failed:
            return str(_error_text(failed.payload))
        except Exception as exc:
            return str(self.rt.task_error(f"{spec.class_name}.__init__", exc))
        self.actor_id = spec.actor_id  # constructed: its calls may run
        groups = {"": spec.max_concurrency, **spec.concurrency_groups}
        if spec.is_async:
            self._start_loop(groups)
            self.push = self._push_to_loop
        elif spec.max_concurrency > 1 or spec.concurrency_groups:
            self.pools = {name: concurrent.futures.ThreadPoolExecutor(
                size, thread_name_prefix=f"rtml-actor{'-' if name else ''}{name}")
                for name, size in groups.items()}
            self.push = self._push_to_pool
        return ""

    def _start_loop(self, groups: dict[str, int]) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self.semaphores = {name: asyncio.Semaphore(size) for name, size in groups.items()}
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, name="rtml-actor-loop", daemon=True).start()
        ready.wait()
        self.loop = loop


def _terminate() -> NoReturn:
    raise ActorExit()


def _stored_error(error: BaseException) -> m.Payload:
    """An error as a task's return value (``get`` raises it)."""
    return serialize(StoredError(error)).to_payload(is_error=True)


def _generator_of(spec: m.TaskSpec, items: Any) -> Any:
    """What a streaming task's function returned, if it is an iterator; else raise."""
    if inspect.isgenerator(items) or (hasattr(items, "__next__") and hasattr(items, "__iter__")):
        return items
    raise TypeError(f"task {spec.name!r} has num_returns='streaming' but returned "
                    f"{type(items).__name__}, not a generator; use yield in its function, "
                    f"or leave num_returns at its default")


def return_ids(spec: m.TaskSpec) -> list[ObjectID]:
    if spec.num_returns == 1 or spec.num_returns == m.STREAMING:
        return [first_return_id(spec.task_id)]
    task_id = spec.task_id
    return [object_id_for(task_id, i + 1) for i in range(spec.num_returns)]


def _serialize_return(spec: m.TaskSpec, value: Any) -> Serialized:
    try:
        return serialize(value)
    except TypeError as exc:
        raise TypeError(f"the return value of {spec.name!r} cannot be pickled: {exc}") from None


def _error_text(payload: m.Payload) -> str:
    value = deserialize(payload.data, payload.buffers)
    return str(value.error if isinstance(value, StoredError) else value)
