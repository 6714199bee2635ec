"""Ray's ``ray.experimental``: ``tqdm_ray``, progress bars of remote tasks shown in the
driver."""

from __future__ import annotations

from rtml.experimental import tqdm_ray

__all__ = ["tqdm_ray"]
