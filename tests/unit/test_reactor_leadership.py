"""Reactor leadership: a waiting thread serves the loop itself (no processes)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rtml.rpc import messages as m
from rtml.rpc import reactor as reactor_module
from rtml.rpc.framing import frame
from rtml.rpc.reactor import Connection, Flag, Reactor

WAIT_S = 10.0


class Peer:
    """A started reactor reading one end of a socketpair; the test writes the other."""

    def __init__(self) -> None:
        self.reactor = Reactor("test-io")
        ours, theirs = socket.socketpair()
        self.remote = theirs
        self.handled: dict[int, tuple[int, threading.Event]] = {}
        self.waiting: dict[int, threading.Event] = {}
        self.lock = threading.Lock()
        self.hook: Callable[[int], None] = lambda req_id: None  # runs first, per message
        self.reactor.start()
        self.reactor.add(Connection(self.reactor, ours, self._on_message, name="peer"))

    def _on_message(self, conn: Connection, msg: Any) -> None:
        self.hook(msg.req_id)
        with self.lock:
            done = self.waiting[msg.req_id]
            self.handled[msg.req_id] = (threading.get_ident(), done)
        done.set()

    def expect(self, req_id: int) -> threading.Event:
        with self.lock:
            done = self.waiting[req_id] = threading.Event()
        return done

    def send(self, req_id: int) -> None:
        self.remote.sendall(frame(m.encode(m.StoreStats(req_id))))

    def handler_thread(self, req_id: int) -> int:
        return self.handled[req_id][0]

    def close(self) -> None:
        self.reactor.stop()
        self.reactor.close()
        self.remote.close()


@pytest.fixture()
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


def background_id(peer: Peer) -> int:
    thread = peer.reactor._bg_thread
    assert thread is not None and thread.ident is not None
    return thread.ident


def test_the_waiting_thread_handles_its_own_reply(peer: Peer) -> None:
    done = peer.expect(1)
    threading.Timer(0.05, peer.send, (1,)).start()
    assert peer.reactor.wait_serving(done, WAIT_S)
    assert peer.handler_thread(1) == threading.get_ident()


def test_a_timed_out_wait_returns_false_and_the_background_resumes(peer: Peer) -> None:
    assert not peer.reactor.wait_serving(threading.Event(), 0.05)
    done = peer.expect(2)
    peer.send(2)  # nobody waits on it: the background thread must take the loop back
    assert done.wait(WAIT_S)
    assert peer.handler_thread(2) == background_id(peer)


def test_posted_calls_run_between_leaders(peer: Peer) -> None:
    assert not peer.reactor.wait_serving(threading.Event(), 0.01)
    ran = threading.Event()
    on: list[int] = []
    peer.reactor.call_soon(lambda: (on.append(threading.get_ident()), ran.set()))
    assert ran.wait(WAIT_S)
    assert on == [background_id(peer)]


def test_concurrent_waiters_all_return(peer: Peer) -> None:
    ids = list(range(10, 18))
    events = {i: peer.expect(i) for i in ids}
    results: dict[int, bool] = {}

    def wait(i: int) -> None:
        results[i] = peer.reactor.wait_serving(events[i], WAIT_S)

    threads = [threading.Thread(target=wait, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for i in ids:
        peer.send(i)
    for t in threads:
        t.join(WAIT_S + 5)
    assert results == {i: True for i in ids}
    waiters = {t.ident for t in threads} | {background_id(peer)}
    assert {peer.handler_thread(i) for i in ids} <= waiters


def test_a_wait_from_inside_a_callback_does_not_take_the_lead(peer: Peer) -> None:
    inner = threading.Event()
    outcome: list[bool] = []
    finished = threading.Event()

    def callback() -> None:  # on the leading thread: must not try to lead again
        outcome.append(peer.reactor.wait_serving(inner, 0.05))
        finished.set()

    peer.reactor.call_soon(callback)
    assert finished.wait(WAIT_S)
    assert outcome == [False]


def test_stop_releases_a_leading_waiter() -> None:
    p = Peer()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(
        p.reactor.wait_serving(threading.Event(), 1.0)))
    waiter.start()
    p.reactor.stop()
    waiter.join(WAIT_S)
    assert not waiter.is_alive() and result == [False]
    p.reactor.close()
    p.remote.close()


def test_the_grace_keeps_the_background_aside_until_work_is_posted(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor_module, "HANDBACK_GRACE", 30.0)
    assert not peer.reactor.wait_serving(threading.Event(), 0.01)
    done = peer.expect(3)
    peer.send(3)
    assert not done.wait(0.3)  # nobody leads during the grace: a get loop wakes no one
    peer.reactor.call_soon(lambda: None)  # posted work ends the grace
    assert done.wait(WAIT_S)
    assert peer.handler_thread(3) == background_id(peer)


def test_replies_expected_skip_the_grace(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor_module, "HANDBACK_GRACE", 30.0)
    peer.reactor.expecting = lambda: True
    assert not peer.reactor.wait_serving(threading.Event(), 0.01)
    done = peer.expect(4)
    peer.send(4)
    assert done.wait(WAIT_S)
    assert peer.handler_thread(4) == background_id(peer)


def test_flag_is_a_one_waiter_event() -> None:
    flag = Flag()
    assert not flag.is_set() and not flag.wait(0.01)
    threading.Timer(0.02, flag.set).start()
    assert flag.wait(WAIT_S) and flag.is_set()
    flag.set()  # setting again is harmless
    assert flag.wait(0) and flag.wait(None)
    racing = Flag()
    setters = [threading.Thread(target=racing.set) for _ in range(8)]
    for t in setters:
        t.start()
    for t in setters:
        t.join()
    assert racing.wait(0)


def test_a_flush_asked_from_another_thread_survives_the_dirty_set_swap() -> None:
    reactor = Reactor("test-flush")  # not started: this test plays the loop's steps itself
    ours, theirs = socket.socketpair()
    try:
        conn = Connection(reactor, ours, lambda c, msg: None, name="peer")
        conn.send_soon(m.StoreStats(7))  # not the loop's thread: posts the flush request
        reactor._flush_dirty()  # an iteration ends (the dirty set is swapped) ...
        reactor._run_calls()  # ... before the next one runs the posted request
        reactor._flush_dirty()
        theirs.settimeout(5)
        assert m.decode(theirs.recv(4096)[4:]) == m.StoreStats(7)
    finally:
        reactor.close()
        theirs.close()


def test_an_interrupt_in_a_handler_is_raised_after_the_hand_back(peer: Peer) -> None:
    """Ctrl-C (or a cancellation) arriving while this thread dispatches a batch must not
    cost the rest of the batch: it is raised once the loop is handed back."""
    first, second = peer.expect(21), peer.expect(22)

    def interrupt_at_21(req_id: int) -> None:
        if req_id == 21:
            peer.reactor.interrupt_leader(KeyboardInterrupt())  # as the signal handler does

    peer.hook = interrupt_at_21
    both = frame(m.encode(m.StoreStats(21))) + frame(m.encode(m.StoreStats(22)))
    threading.Timer(0.05, peer.remote.sendall, (both,)).start()
    with pytest.raises(KeyboardInterrupt):
        peer.reactor.wait_serving(threading.Event(), WAIT_S)
    assert first.wait(WAIT_S) and second.wait(WAIT_S)  # the whole batch was handled
    assert not peer.reactor.leads_here()


def test_a_poll_never_takes_the_loop(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor_module, "HANDBACK_GRACE", 30.0)
    for _ in range(5):
        assert not peer.reactor.wait_serving(threading.Event(), 0)
    done = peer.expect(23)
    peer.send(23)  # the background thread still leads: polls renewed no grace
    assert done.wait(WAIT_S)
    assert peer.handler_thread(23) == background_id(peer)


def test_a_failing_expecting_hook_still_hands_the_loop_back(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor_module, "HANDBACK_GRACE", 30.0)

    def broken() -> bool:
        raise RuntimeError("dictionary changed size during iteration")

    peer.reactor.expecting = broken
    assert not peer.reactor.wait_serving(threading.Event(), 0.01)
    done = peer.expect(24)
    peer.send(24)
    assert done.wait(WAIT_S)


def test_idle_work_runs_after_the_waiter_is_woken_and_before_the_loop_waits(peer: Peer) -> None:
    # A handler defers work with call_idle: the waiter it wakes returns without running
    # it, and the loop runs it before it next blocks, even with no further message.
    ran_on: list[int] = []
    ran = threading.Event()

    def deferred() -> None:
        ran_on.append(threading.get_ident())
        ran.set()

    def hook(req_id: int) -> None:
        peer.reactor.call_idle(deferred)

    peer.hook = hook
    done = peer.expect(3)
    threading.Timer(0.05, peer.send, (3,)).start()
    assert peer.reactor.wait_serving(done, WAIT_S)
    assert ran.wait(WAIT_S)
    assert ran_on == [background_id(peer)]  # not the waiter: it returned first


def test_a_batched_connection_hands_over_each_read_as_one_list() -> None:
    reactor = Reactor("test-batched")
    ours, theirs = socket.socketpair()
    batches: list[list[int]] = []
    closed: list[str] = []
    got = threading.Event()

    def on_batch(conn: Connection, msgs: list[Any]) -> None:
        batches.append([msg.req_id for msg in msgs])
        got.set()

    reactor.start()
    try:
        reactor.add(Connection(reactor, ours, on_batch, lambda c, why: closed.append(why),
                               name="batched", batched=True))
        theirs.sendall(b"".join(frame(m.encode(m.StoreStats(i))) for i in (1, 2, 3)))
        assert got.wait(WAIT_S)
        got.clear()
        # A bad frame: the messages before it are handled, then the connection closes.
        theirs.sendall(frame(m.encode(m.StoreStats(4))) + frame(b"\xc1 not msgpack"))
        assert got.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        reactor.stop()
        reactor.close()
        theirs.close()
    assert batches == [[1, 2, 3], [4]]
    assert closed and "bad frame" in closed[0]


def test_idle_work_is_not_starved_by_a_stream_of_callbacks(peer: Peer) -> None:
    # A callback that keeps posting itself leaves calls pending at every iteration: idle
    # work must still run (once per iteration), or a busy driver would never settle.
    ran = threading.Event()
    stop = threading.Event()

    def again() -> None:
        if not stop.is_set():
            peer.reactor.call_soon(again)

    def hook(req_id: int) -> None:
        peer.reactor.call_soon(again)
        peer.reactor.call_idle(ran.set)

    peer.hook = hook
    peer.expect(5)
    peer.send(5)
    try:
        assert ran.wait(WAIT_S)
    finally:
        stop.set()


def test_a_spinning_waiter_polls_until_its_reply_lands(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reactor_module, "SPIN", 5.0)  # longer than the reply takes
    done = peer.expect(6)
    threading.Timer(0.1, peer.send, (6,)).start()
    cpu = time.thread_time()
    assert peer.reactor.wait_serving(done, WAIT_S, spin=True)
    spent = time.thread_time() - cpu
    assert peer.handler_thread(6) == threading.get_ident()
    assert spent > 0.02  # it polled through the 0.1 s: a sleeping wait costs ~0.1 ms


def test_a_spinning_waiter_sleeps_once_the_spin_is_over(peer: Peer) -> None:
    cpu = time.thread_time()
    start = time.monotonic()
    assert not peer.reactor.wait_serving(threading.Event(), 0.3, spin=True)
    assert time.monotonic() - start >= 0.3
    assert time.thread_time() - cpu < 0.1  # SPIN (100 us) of polling, then asleep
    done = peer.expect(7)
    peer.send(7)  # the background thread takes the loop back as after any wait
    assert done.wait(WAIT_S)
