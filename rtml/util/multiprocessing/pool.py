"""Python's ``multiprocessing.Pool`` on rtml actors, as Ray's ``ray.util.multiprocessing``.

    Pool(n) --n x PoolActor.remote(initializer, initargs)--> n processes, pinged: started
    apply / map / starmap (_async) --> chunks of calls --> each to the least loaded
        process (ties: in turn) --> run_chunk.remote(func, items, star) --> ref.future()
        --> AsyncResult: every chunk done --> value or error, callbacks, ready
    imap / imap_unordered --> IMapIterator: chunks submitted as results are taken
    maxtasksperchild: a process that took that many chunks is replaced at once; its
        handle is dropped, so it ends after answering the chunks it took
    close() --> no new work | join() --> all submitted (imap input too) done, callbacks
        run, processes released | terminate() --> processes killed

A process is an actor holding no CPU (``ray_remote_args`` can say otherwise); it runs
the initializer once, in its constructor, then one chunk at a time. Chunks go to the
process with the fewest unfinished chunks, counted as their futures resolve, so a
long call holds back only the chunks queued behind it. Everything here uses rtml's
public API alone; the pool lives in the process that made it.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

from rtml import api, driver
from rtml.core.actors import ActorHandle
from rtml.exceptions import ActorDiedError
from rtml.util.multiprocessing.process import PoolActor, name_of
from rtml.util.multiprocessing.results import AsyncResult, Callback, Chunk, IMapIterator

log = logging.getLogger(__name__)

CHUNKS_PER_PROCESS = 4
"""map's chunks per process when no chunksize is given, as Python's."""
IMAP_WINDOW = 4
"""imap's chunks submitted and not yet yielded, per process: a few queued behind the
running one, so a process seldom waits for the driver. 2,000 one-item chunks on 2
processes took 0.74-0.83 s with 1 queued, 0.74-0.84 s with 3, 0.63-0.72 s with 7: the
cost per chunk (~0.2 ms more than a bare actor call) is its future's thread, not this."""


class _State(enum.Enum):
    RUN = "RUN"
    CLOSE = "CLOSE"
    TERMINATE = "TERMINATE"


@dataclass(eq=False)
class _Process:
    """One process of the pool: its actor, the chunks it took, those not answered."""

    handle: ActorHandle
    taken: int = 0
    in_flight: int = 0


class Pool:
    """A pool of actor processes with the interface of ``multiprocessing.Pool``.

    ``processes``: how many (default: the cluster's CPU count; at most that many).
    ``initializer(*initargs)`` runs once in each. ``maxtasksperchild``: chunks a process
    runs before it is replaced. ``context`` is ignored. If rtml is not initialized,
    ``rtml.init(address=ray_address, num_cpus=processes)`` is called first.
    ``ray_remote_args``: options of the actors (``num_cpus``, ``resources``, ...).
    """

    def __init__(self, processes: int | None = None,
                 initializer: Callable[..., Any] | None = None,
                 initargs: Iterable[Any] | None = None, maxtasksperchild: int | None = None,
                 context: Any = None, ray_address: str | None = None,
                 ray_remote_args: dict[str, Any] | None = None) -> None:
        _check_arguments(processes, initializer, maxtasksperchild)
        if context is not None:
            log.warning("Pool(context=...) is ignored: the processes are rtml actors")
        if not driver.is_initialized():  # (num_cpus counts only for a new local cluster)
            driver.init(address=ray_address, num_cpus=processes)
        count = _process_count(processes)
        self._initializer = initializer
        self._initargs = tuple(initargs or ())
        self._maxtasksperchild = maxtasksperchild
        self._actor = PoolActor.options(**(ray_remote_args or {}))
        self._state = _State.RUN
        self._lock = threading.Lock()  # the processes, their counts, the outstanding
        self._callback_lock = threading.Lock()  # one callback at a time, as Python's
        self._turn = 0  # where the next search for the least loaded process starts
        self._outstanding: set[concurrent.futures.Future[list[Any]]] = set()
        self._retiring: set[_Process] = set()  # replaced, with chunks still to answer
        self._results: weakref.WeakSet[AsyncResult] = weakref.WeakSet()
        self._iterators: weakref.WeakSet[IMapIterator] = weakref.WeakSet()
        self._workers = [self._start() for _ in range(count)]
        self._wait_started()

    def _start(self) -> _Process:
        return _Process(self._actor.remote(self._initializer, self._initargs))

    def _wait_started(self) -> None:
        try:
            api.get([worker.handle.ping.remote() for worker in self._workers])
        except ActorDiedError as exc:
            self.terminate()
            what = (f"its initializer {name_of(self._initializer)} raised; fix it or its "
                    f"initargs" if self._initializer is not None else "its actor failed")
            raise ActorDiedError(f"a process of the Pool did not start ({what}): {exc}"
                                 ) from exc

    # -- submitting --------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state is not _State.RUN:
            done = "closed" if self._state is _State.CLOSE else "terminated"
            raise ValueError(f"Pool not running: it was {done}; make a new Pool for more work")

    def _submit(self, func: Callable[..., Any], items: list[Any], star: bool) -> Chunk:
        """Send one chunk to the least loaded process."""
        with self._lock:
            if not self._workers:
                _gone()
            worker = self._least_loaded()
            worker.taken += 1
            worker.in_flight += 1
            ref = worker.handle.run_chunk.remote(func, items, star)
            if self._maxtasksperchild is not None and worker.taken >= self._maxtasksperchild:
                self._retire(worker)
            future = ref.future()
            self._outstanding.add(future)
        future.add_done_callback(partial(self._chunk_done, worker))
        return Chunk(future, len(items))

    def _least_loaded(self) -> _Process:
        n = len(self._workers)
        in_turn = [self._workers[(self._turn + i) % n] for i in range(n)]
        worker = min(in_turn, key=lambda w: w.in_flight)  # the first of the least loaded
        self._turn = (self._workers.index(worker) + 1) % n
        return worker

    def _retire(self, worker: _Process) -> None:
        """Replace ``worker``; dropping its handle ends it once its chunks are answered."""
        self._workers[self._workers.index(worker)] = self._start()
        self._retiring.add(worker)  # (for terminate; it has a chunk in flight: this one)

    def _chunk_done(self, worker: _Process,
                    future: concurrent.futures.Future[list[Any]]) -> None:
        with self._lock:
            worker.in_flight -= 1
            self._outstanding.discard(future)
            retired = worker.in_flight == 0 and worker in self._retiring
            if retired:
                self._retiring.discard(worker)
        if retired:  # its last chunk answered: ended now, not when its handle is collected
            api.kill(worker.handle)

    def _chunksize(self, chunksize: int | None, count: int) -> int:
        """``chunksize`` checked, or Python's default for ``count`` items."""
        if chunksize is None:
            size, extra = divmod(count, len(self._workers) * CHUNKS_PER_PROCESS)
            return size + bool(extra)
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be a positive int (or None: a size chosen for "
                             f"the input), got {chunksize!r}")
        return chunksize

    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any],
                   chunksize: int | None, star: bool, callback: Callback | None,
                   error_callback: Callback | None) -> AsyncResult:
        self._check_running()
        items = list(iterable)
        size = self._chunksize(chunksize, len(items))
        chunks = [self._submit(func, items[i:i + size], star)
                  for i in range(0, len(items), size or 1)]
        return self._track(AsyncResult(chunks, False, callback, error_callback,
                                       self._callback_lock))

    def _imap(self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None,
              ordered: bool) -> IMapIterator:
        self._check_running()
        count = len(iterable) if isinstance(iterable, Sized) else 1  # (for chunksize=None)
        size = max(1, self._chunksize(chunksize, count))
        iterator = IMapIterator(partial(self._submit, func, star=False), iter(iterable),
                                size, IMAP_WINDOW * len(self._workers), ordered)
        self._iterators.add(iterator)
        return iterator

    def _track(self, result: AsyncResult) -> AsyncResult:
        self._results.add(result)
        return result

    # -- Python's interface -----------------------------------------------------------------

    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: dict[str, Any] | None = None, *,
              kwargs: dict[str, Any] | None = None) -> Any:
        """``func(*args, **kwds)`` in a pool process; its value (or raises its error).
        ``kwargs`` is Ray's name for ``kwds``."""
        return self.apply_async(func, args, kwds, kwargs=kwargs).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: dict[str, Any] | None = None, callback: Callback | None = None,
                    error_callback: Callback | None = None, *,
                    kwargs: dict[str, Any] | None = None) -> AsyncResult:
        """``apply`` without waiting: its AsyncResult. ``callback(value)`` or
        ``error_callback(error)`` runs in this process once the call is done."""
        self._check_running()
        keywords = _keywords(kwds, kwargs)
        call = partial(func, **keywords) if keywords else func
        chunk = self._submit(call, [tuple(args)], True)
        return self._track(AsyncResult([chunk], True, callback, error_callback,
                                       self._callback_lock))

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any],
            chunksize: int | None = None) -> list[Any]:
        """``[func(x) for x in iterable]``, in chunks across the processes; raises the
        first error (in input order) as the user's exception class."""
        return self.map_async(func, iterable, chunksize).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                  chunksize: int | None = None, callback: Callback | None = None,
                  error_callback: Callback | None = None) -> AsyncResult:
        """``map`` without waiting; ``callback`` gets the whole list."""
        return self._map_async(func, iterable, chunksize, False, callback, error_callback)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[Any]:
        """``[func(*args) for args in iterable]``, as ``map``."""
        return self.starmap_async(func, iterable, chunksize).get()

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None, callback: Callback | None = None,
                      error_callback: Callback | None = None) -> AsyncResult:
        """``starmap`` without waiting."""
        return self._map_async(func, iterable, chunksize, True, callback, error_callback)

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any],
             chunksize: int | None = 1) -> IMapIterator:
        """``func(x)`` for each x, yielded in input order; the input is read lazily."""
        return self._imap(func, iterable, chunksize, ordered=True)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int | None = 1) -> IMapIterator:
        """As ``imap``, each result yielded as soon as its chunk is done."""
        return self._imap(func, iterable, chunksize, ordered=False)

    def close(self) -> None:
        """Take no new work; what was submitted still runs (``join`` waits for it)."""
        with self._lock:
            if self._state is _State.RUN:
                self._state = _State.CLOSE

    def terminate(self) -> None:
        """Kill the processes at once; unfinished results raise ActorDiedError."""
        with self._lock:
            self._state = _State.TERMINATE
            doomed = [w.handle for w in [*self._workers, *self._retiring]]
            self._workers, self._retiring = [], set()
        for handle in doomed:
            api.kill(handle)

    def join(self) -> None:
        """Wait for all submitted work and its callbacks, then let the processes go; only
        after ``close`` or ``terminate``. As in Python every task runs, consumed or not:
        the rest of each imap's input is submitted (so an endless one never ends: call
        ``terminate`` instead), and its results can still be iterated afterwards."""
        if self._state is _State.RUN:
            raise ValueError("Pool is still running: call close() (or terminate()) before "
                             "join()")
        if self._state is _State.CLOSE:
            for iterator in list(self._iterators):
                iterator.submit_rest()
        self._wait_outstanding()
        for result in list(self._results):
            result.wait()
        with self._lock:
            done = [w.handle for w in [*self._workers, *self._retiring]]
            self._workers, self._retiring = [], set()
        for handle in done:  # every result is in: the processes end, as Python's do
            api.kill(handle)

    def _wait_outstanding(self) -> None:
        while True:
            with self._lock:
                pending = list(self._outstanding)
            if not pending:
                return
            concurrent.futures.wait(pending)

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()  # as Python's Pool: leaving the block does not wait for work

    def __reduce__(self) -> NoReturn:
        raise NotImplementedError("a Pool cannot be pickled or passed to a task: it lives "
                                  "in the process that made it; pass its results instead")

    def __repr__(self) -> str:
        return (f"<rtml.util.multiprocessing.Pool state={self._state.value} "
                f"pool_size={len(self._workers)}>")


def _check_arguments(processes: int | None, initializer: Callable[..., Any] | None,
                     maxtasksperchild: int | None) -> None:
    if processes is not None and processes < 1:
        raise ValueError(f"Pool(processes={processes}): the number of processes must be at "
                         f"least 1 (None: the cluster's CPU count)")
    if initializer is not None and not callable(initializer):
        raise TypeError(f"Pool(initializer=...) must be callable, got {initializer!r}")
    if maxtasksperchild is not None and (not isinstance(maxtasksperchild, int)
                                         or maxtasksperchild < 1):
        raise ValueError(f"maxtasksperchild must be a positive int or None, got "
                         f"{maxtasksperchild!r}")


def _process_count(processes: int | None) -> int:
    """``processes``, or the cluster's CPU count; no more than that count (as Ray)."""
    cpus = int(api.cluster_resources().get("CPU", 0))
    count = cpus if processes is None else processes
    if count < 1:
        raise ValueError("the cluster has no CPU, so Pool() has no default size: pass "
                         "processes=N, or join a cluster with CPUs")
    if count > cpus:
        raise ValueError(f"Pool(processes={count}) on a cluster of {cpus} CPUs: ask for at "
                         f"most {cpus} (processes=None takes them all), or add nodes")
    return count


def _keywords(kwds: dict[str, Any] | None, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    if kwds is not None and kwargs is not None:
        raise TypeError("pass the keyword arguments as kwds= (Python's name) or kwargs= "
                        "(Ray's), not both")
    return dict(kwds or kwargs or {})


def _gone() -> NoReturn:
    raise ValueError("Pool not running: it was terminated or joined, so its processes are "
                     "gone; make a new Pool for more work")
