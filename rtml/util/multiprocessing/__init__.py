"""Python's ``multiprocessing.Pool`` on rtml actors, as Ray's ``ray.util.multiprocessing``.

    from rtml.util.multiprocessing import Pool

    with Pool() as pool:                      # one actor per CPU of the cluster
        squares = pool.map(square, range(100))

Its face: ``Pool`` (``pool``: the pool and its scheduling of chunks), ``TimeoutError``
(``multiprocessing.TimeoutError``, which ``AsyncResult.get`` and ``imap``'s ``next``
raise). ``results`` (AsyncResult, IMapIterator) and ``process`` (the actor) are the
pool's private parts.
"""

from __future__ import annotations

from multiprocessing import TimeoutError

from rtml.util.multiprocessing.pool import Pool

__all__ = ["Pool", "TimeoutError"]
