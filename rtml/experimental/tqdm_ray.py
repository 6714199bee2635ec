"""Ray's ``ray.experimental.tqdm_ray``: a tqdm-like bar for remote tasks and actors,
drawn in the driver (``rtml.core.progress`` draws the data flow). In a driver it is
tqdm itself."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from rtml.core import context
from rtml.core.progress import MAGIC

__all__ = ["safe_print", "tqdm"]


class tqdm:  # noqa: N801 - Ray's (and tqdm's) name
    """``tqdm(iterable, desc=..., total=...)``: iterate or ``update()``; the state goes to
    the driver at most every ``flush_interval_s`` seconds, and when it is closed."""

    def __init__(self, iterable: Iterable[Any] | None = None, desc: str | None = None,
                 total: int | None = None, position: int | None = None,
                 flush_interval_s: float = 1.0, **_: Any) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable = iterable
        self.desc = desc or ""
        self.total = total
        self.n = 0
        self._uuid = uuid.uuid4().hex
        self._interval = flush_interval_s
        self._sent = 0.0
        self._closed = False
        self._local = None
        if context.current_spec() is None and context.current_actor() is None:
            import tqdm as real  # a driver: the bar is drawn here
            self._local = real.tqdm(total=total, desc=desc, position=position)

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this tqdm was made without an iterable; call update() instead")
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._local is not None:
            self._local.update(n)
        elif time.monotonic() - self._sent >= self._interval:
            self._send()

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""
        if self._local is not None:
            self._local.set_description(desc, refresh=refresh)
        elif refresh:
            self._send()

    def refresh(self) -> None:
        if self._local is None:
            self._send()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._local is not None:
            self._local.close()
        else:
            self._send()

    def __enter__(self) -> tqdm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self) -> None:
        self._sent = time.monotonic()
        state = {"uuid": self._uuid, "x": self.n, "total": self.total, "desc": self.desc,
                 "closed": self._closed}
        sys.stdout.write(f"{MAGIC}{json.dumps(state)}\n")
        sys.stdout.flush()


def safe_print(*args: Any, **kwargs: Any) -> None:
    """``print`` that does not tear the bars (tqdm.write in a driver)."""
    import tqdm as real
    real.tqdm.write(" ".join(str(a) for a in args), **kwargs)
