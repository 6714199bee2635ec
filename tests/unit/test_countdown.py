"""The waiter of a ``get`` of several refs: set by the last of its arrivals, or by the
first that failed."""

from __future__ import annotations

from rtml.core.runtime import _countdown
from rtml.rpc.reactor import Flag


def test_countdown_sets_on_the_last_arrival_only() -> None:
    done = Flag()
    arrived = _countdown(3, done, lambda object_id: False)
    arrived(b"a")
    arrived(b"b")
    assert not done.is_set()
    arrived(b"a")
    assert done.is_set()


def test_a_failed_arrival_sets_it_at_once() -> None:
    done = Flag()
    arrived = _countdown(3, done, lambda object_id: object_id == b"bad")
    arrived(b"a")
    assert not done.is_set()
    arrived(b"bad")
    assert done.is_set()
