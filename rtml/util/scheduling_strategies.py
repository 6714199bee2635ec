"""Ray's ``ray.util.scheduling_strategies``: the strategy objects ``.options()`` takes."""

from __future__ import annotations

from rtml.core.options import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]
