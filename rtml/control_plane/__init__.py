"""The control plane: rtml's durable cluster state in Redis.

This package is the only place in rtml that speaks to Redis (through its own small
RESP client, :mod:`rtml.control_plane.resp`) or spells a key.
:func:`start_redis` runs the server, :class:`ControlPlane` reads and writes its
tables, :class:`BatchedWriter` moves task records and events there off the hot
path, and :class:`Keys` names every key. :func:`chrome_trace` turns its task records and
events into the timeline.
"""

from __future__ import annotations

from rtml.control_plane.address import OWN_USER, RedisAddress, own_password, tls_from_text, tls_text
from rtml.control_plane.keys import Keys
from rtml.control_plane.redis_server import RedisProcess, find_redis_server, start_redis
from rtml.control_plane.tables import (
    RAN,
    RAN_FAILED,
    SUBMITTED,
    ControlPlane,
    location_field,
    login_refused,
    timed_out,
    unreachable,
)
from rtml.control_plane.trace import chrome_trace
from rtml.control_plane.writer import BatchedWriter

__all__ = [
    "OWN_USER",
    "RAN",
    "RAN_FAILED",
    "SUBMITTED",
    "location_field",
    "chrome_trace",
    "BatchedWriter",
    "ControlPlane",
    "Keys",
    "RedisAddress",
    "RedisProcess",
    "find_redis_server",
    "login_refused",
    "own_password",
    "start_redis",
    "timed_out",
    "tls_from_text",
    "tls_text",
    "unreachable",
]
