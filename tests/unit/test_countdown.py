"""The waiter of a ``get`` of several refs: set by the last of its arrivals, or by the
first that failed."""

from __future__ import annotations

from rtml.core.runtime import _countdown
from rtml.rpc.reactor import Flag


def test_countdown_sets_on_the_last_arrival_only() -> None:
    done = Flag()
    failures: list[bytes] = []
    arrived = _countdown(3, done, lambda object_id: False, failures)
    arrived(b"a")
    arrived(b"b")
    assert not done.is_set()
    arrived(b"a")
    assert done.is_set() and failures == []


def test_a_failed_arrival_sets_it_at_once_and_is_told() -> None:
    done = Flag()
    failures: list[bytes] = []
    arrived = _countdown(3, done, lambda object_id: object_id == b"bad", failures)
    arrived(b"a")
    assert not done.is_set()
    arrived(b"bad")
    assert done.is_set() and failures == [b"bad"]
