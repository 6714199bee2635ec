"""Resource shapes: ``{"CPU": 1.0, "GPU": 0.5, "custom": 2.0}`` arithmetic."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

Shape = dict[str, float]
DEFAULT_SHAPE: Shape = {"CPU": 1.0}
"""A task's, given no resource options (not to be changed)."""
_EPS = 1e-9


def fits(shape: Shape, available: Shape) -> bool:
    """Whether every quantity in ``shape`` is available."""
    return all(available.get(k, 0.0) + _EPS >= v for k, v in shape.items() if v > 0)


def subtract(available: Shape, shape: Shape) -> None:
    for k, v in shape.items():
        if v:
            available[k] = available.get(k, 0.0) - v


def add(available: Shape, shape: Shape) -> None:
    for k, v in shape.items():
        if v:
            available[k] = available.get(k, 0.0) + v


def shape_key(shape: Shape) -> tuple[tuple[str, float], ...]:
    """A hashable, order-free key for a shape (zero entries dropped)."""
    return tuple(sorted((k, float(v)) for k, v in shape.items() if v))


def bad_amount(shape: Mapping[Any, Any]) -> str:
    """What is wrong with a shape ("" if nothing): every name a str, every amount a
    finite number >= 0. A NaN compares false with everything (a node's accounting would
    never give that resource again); a negative amount would add to it. Checked at the
    API, and again where a shape arrives from the wire (node manager, head)."""
    for name, amount in shape.items():
        if not isinstance(name, str):
            return f"resource names must be str, got {name!r}"
        if (isinstance(amount, bool) or not isinstance(amount, int | float)
                or not math.isfinite(amount) or amount < 0):
            return f"resource {name!r} must be a finite number >= 0, got {amount!r}"
    return ""


def task_shape(num_cpus: float | None, num_gpus: float | None, memory: float | None,
               resources: dict[str, float] | None, default_cpus: float = 1.0) -> Shape:
    """Build a shape from task options. Raises ValueError on a negative amount."""
    shape: Shape = {"CPU": float(default_cpus if num_cpus is None else num_cpus)}
    if num_gpus:
        shape["GPU"] = float(num_gpus)
    if memory:
        shape["memory"] = float(memory)
    for name, amount in (resources or {}).items():
        if name in ("CPU", "GPU"):
            raise ValueError(f"use num_cpus/num_gpus instead of resources={{{name!r}: ...}}")
        shape[name] = float(amount)
    bad = bad_amount(shape)
    if bad:
        raise ValueError(bad)
    return shape
