"""The head's control-plane write queue (rtml.head.writes), with stand-in writes."""

from __future__ import annotations

import threading
import time

from rtml.head.writes import PlaneWrites


def test_writes_run_in_order_on_their_own_daemon_thread() -> None:
    done: list[tuple[int, str, bool]] = []
    writes = PlaneWrites()
    for n in range(50):
        writes.write(lambda n=n: done.append(
            (n, threading.current_thread().name, threading.current_thread().daemon)))
    assert writes.close(5.0) is True
    assert [n for n, _, _ in done] == list(range(50))
    assert {(name, daemon) for _, name, daemon in done} == {("rtml-head-plane", True)}


def test_latest_writes_only_the_newest_arguments_of_a_queued_key() -> None:
    writes = PlaneWrites()
    gate = threading.Event()
    written: list[tuple[str, int]] = []
    writes.write(gate.wait)  # holds the queue while the heartbeats arrive
    for beat in range(100):
        writes.latest(("hb", "a"), lambda node, n: written.append((node, n)), "a", beat)
        writes.latest(("hb", "b"), lambda node, n: written.append((node, n)), "b", beat)
    gate.set()
    writes.close(5.0)
    assert written == [("a", 99), ("b", 99)]


def test_a_failed_write_is_logged_and_the_next_ones_still_run(caplog) -> None:
    writes = PlaneWrites()
    after: list[int] = []

    def broken() -> None:
        raise ConnectionError("redis is down")

    writes.write(broken)
    writes.write(after.append, 1)
    writes.close(5.0)
    assert after == [1]
    assert "control-plane write broken failed" in caplog.text


def test_close_is_bounded_by_a_stuck_write_and_drops_later_writes() -> None:
    writes = PlaneWrites()
    stuck = threading.Event()
    late: list[int] = []
    writes.write(stuck.wait, 30)  # a write on a hung Redis
    writes.write(late.append, 0)  # queued before the close: runs if the stuck one ends
    started = time.monotonic()
    assert writes.close(0.2) is False
    assert time.monotonic() - started < 2.0
    writes.write(late.append, 1)
    writes.aside(late.append, 2)
    assert [t.daemon for t in threading.enumerate() if t.name.startswith("rtml-head")] \
        and all(t.daemon for t in threading.enumerate() if t.name.startswith("rtml-head"))
    stuck.set()  # the stuck write ends; what was queued behind the close is not run
    time.sleep(0.2)
    assert late == [0]


def test_aside_does_not_wait_for_the_queue() -> None:
    writes = PlaneWrites()
    gate = threading.Event()
    ran = threading.Event()
    writes.write(gate.wait, 30)
    writes.aside(ran.set)
    assert ran.wait(5)
    gate.set()
    writes.close(5.0)
