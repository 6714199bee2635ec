"""Ray's ``ray.job_config``: ``JobConfig``, the options of a whole job given to
``rtml.init(job_config=...)`` (``rtml.core.job_config``)."""

from __future__ import annotations

from rtml.core.job_config import JobConfig

__all__ = ["JobConfig"]
