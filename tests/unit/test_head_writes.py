"""The head's control-plane write queue (rtml.head.writes), with stand-in writes."""

from __future__ import annotations

import asyncio
import threading
import time

from rtml.head.writes import PlaneWrites


def test_writes_run_in_order_off_the_loop_and_then_runs_on_the_loop() -> None:
    done: list[tuple[str, str]] = []

    async def scenario() -> None:
        writes = PlaneWrites()
        loop_thread = threading.current_thread().name
        told = asyncio.Event()
        for n in range(50):
            writes.write(lambda n=n: done.append((str(n), threading.current_thread().name)))
        writes.write(lambda: None, then=lambda: (
            done.append(("then", threading.current_thread().name)), told.set()))
        await asyncio.wait_for(told.wait(), 5)
        await asyncio.to_thread(writes.close, 5.0)
        assert [name for name, _ in done] == [str(n) for n in range(50)] + ["then"]
        assert {thread for name, thread in done if name != "then"} == {"rtml-head-plane_0"}
        assert done[-1][1] == loop_thread

    asyncio.run(scenario())


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


def test_close_is_bounded_and_drops_later_writes() -> None:
    writes = PlaneWrites()
    stuck = threading.Event()
    late: list[int] = []
    writes.write(stuck.wait, 30)
    started = time.monotonic()
    writes.close(0.2)
    assert time.monotonic() - started < 2.0
    writes.write(late.append, 1)
    writes.aside(late.append, 2)
    stuck.set()
    time.sleep(0.1)
    assert late == []


def test_aside_does_not_wait_for_the_queue() -> None:
    writes = PlaneWrites()
    gate = threading.Event()
    ran = threading.Event()
    writes.write(gate.wait, 30)
    writes.aside(ran.set)
    assert ran.wait(5)
    gate.set()
    writes.close(5.0)
