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
