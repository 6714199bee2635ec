"""Progress bars of remote tasks, drawn in the driver (Ray's ``tqdm_ray``).

    task: tqdm_ray.tqdm(...).update() --every flush interval--> a line "<MAGIC>{json}" on
        its stdout --WorkerOutput--> the driver: Bars.take(pid, text) draws it with tqdm
        (one bar per task's bar, by its uuid) and prints the other lines as they were
"""

from __future__ import annotations

import json
from typing import Any

MAGIC = "__rtml_tqdm__:"
"""Starts a line that carries a remote bar's state, not text to print."""


class Bars:
    """The driver's bars, by the uuid each remote bar sends."""

    def __init__(self) -> None:
        self._bars: dict[str, Any] = {}

    def take(self, text: str) -> str:
        """Draw the bar states in ``text``; return its other lines."""
        if MAGIC not in text:
            return text
        rest = []
        for line in text.splitlines(True):
            if line.startswith(MAGIC):
                self._draw(line[len(MAGIC):])
            else:
                rest.append(line)
        return "".join(rest)

    def _draw(self, payload: str) -> None:
        try:
            state = json.loads(payload)
            uuid, n = str(state["uuid"]), int(state["x"])
        except (ValueError, KeyError, TypeError):
            return  # not one of ours after all
        import tqdm
        bar = self._bars.get(uuid)
        if bar is None:
            bar = self._bars[uuid] = tqdm.tqdm(total=state.get("total"), desc=state.get(
                "desc"), position=len(self._bars), leave=True)
        if state.get("desc") and state["desc"] != bar.desc:
            bar.set_description(state["desc"], refresh=False)
        bar.update(n - bar.n)
        if state.get("closed"):
            bar.close()
            del self._bars[uuid]


class ProgressBar:
    """A bar over refs becoming ready, for ``get`` and ``wait`` (``progress=``): tqdm's
    terminal bar, or its notebook widget in Jupyter. Advanced from the I/O thread as each
    ref is ready (tqdm serializes its updates and redraws at most every 0.1 s)."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm  # (only when asked for: tqdm.auto looks for Jupyter)

        self._bar = tqdm(total=total, desc=desc, unit="obj", dynamic_ncols=True)

    def arrived(self, _: bytes) -> None:
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def progress_label(progress: object, default: str) -> str:
    """The bar's label for a ``progress=`` option: ``default`` for True, else the text
    given; "" for False or None (no bar). Raises TypeError naming the option otherwise."""
    if progress is None or progress is False:
        return ""
    if progress is True:
        return default
    if isinstance(progress, str) and progress:
        return progress
    raise TypeError(f"progress= takes True (a bar), a non-empty str (a bar with that label) "
                    f"or False, got {progress!r}")
