"""The waiter of a ``get`` of several refs: set by the last of its arrivals, or by the
first that failed."""

from __future__ import annotations

from rtml.core.runtime import _countdown
from rtml.rpc import messages as m
from rtml.rpc.reactor import Flag

FAILED = m.Payload(b"error", is_error=True)
FINE = m.Payload(b"value")


def test_countdown_sets_on_the_last_arrival_only() -> None:
    done = Flag()
    failures: list[bytes] = []
    arrived = _countdown(3, done, {b"a": FINE, b"b": FINE}, failures)
    arrived(b"a")
    arrived(b"b")
    assert not done.is_set()
    arrived(b"a")
    assert done.is_set() and failures == []


def test_a_failed_arrival_sets_it_at_once_and_is_told() -> None:
    done = Flag()
    failures: list[bytes] = []
    arrived = _countdown(3, done, {b"a": FINE, b"bad": FAILED}, failures)
    arrived(b"a")
    assert not done.is_set()
    arrived(b"bad")
    assert done.is_set() and failures == [b"bad"]
