"""The head's actor directory (rtml.head.actors), driven without processes or sockets."""

from __future__ import annotations

from rtml.head.actors import (
    ActorDirectory,
    ActorState,
    Answer,
    ClaimName,
    Command,
    KillWorker,
    Record,
    ReleaseName,
    StartActor,
)
from rtml.rpc import messages as m

A, B = b"a" * 16, b"b" * 16
JOB = b"j" * 4


class Caller:
    """Stands in for a connection: keeps what the head answers on it."""

    def __init__(self) -> None:
        self.sent: list[m.Msg] = []

    def send(self, msg: m.Msg) -> None:
        self.sent.append(msg)


class Nodes:
    """The head's placement as the directory sees it: ``fits`` is the next pick."""

    def __init__(self) -> None:
        self.fits: bytes | None = A
        self.alive = {A, B}

    def pick(self, spec: m.ActorSpec) -> bytes | None:
        return self.fits

    def is_alive(self, node_id: bytes) -> bool:
        return node_id in self.alive


def spec(actor_id: bytes = b"x" * 16, **fields: object) -> m.ActorSpec:
    return m.ActorSpec(actor_id, JOB, b"o" * 16, b"c" * 16, "Counter", (), (), {"CPU": 1.0},
                       {}, **fields)  # type: ignore[arg-type]


def directory() -> tuple[ActorDirectory, Nodes]:
    nodes = Nodes()
    return ActorDirectory(nodes.pick, nodes.is_alive), nodes


def kinds(commands: list[Command]) -> list[str]:
    return [type(c).__name__ for c in commands]


def states(commands: list[Command]) -> list[str]:
    return [c.info.state for c in commands if isinstance(c, Answer)]


def test_an_actor_is_placed_then_alive_and_its_waiters_answered() -> None:
    d, _ = directory()
    owner, caller = Caller(), Caller()
    commands = d.create(owner, 5, spec(), get_if_exists=False)
    assert kinds(commands) == ["Record", "Answer", "StartActor"]
    assert commands[2] == StartActor(A, spec()) and states(commands) == ["PENDING"]
    assert d.lookup(caller, m.GetActorInfo(9, spec().actor_id)) == []  # waits for ALIVE
    commands = d.started(spec().actor_id, A, "unix:/w", "1.2.3.4:5", "")
    assert kinds(commands) == ["Record", "Answer"]
    answer = commands[1]
    assert isinstance(answer, Answer) and answer.peer is caller
    assert (answer.info.req_id, answer.info.state, answer.info.address) == (9, "ALIVE", "unix:/w")
    assert d.actors[spec().actor_id].state is ActorState.ALIVE


def test_an_actor_no_node_fits_waits_and_is_placed_when_one_does() -> None:
    d, nodes = directory()
    nodes.fits = None
    assert kinds(d.create(Caller(), 0, spec(), get_if_exists=False)) == ["Record"]
    assert d.pending == [spec().actor_id] and d.place_pending() == []
    nodes.fits = B
    assert d.place_pending() == [StartActor(B, spec())] and d.pending == []


def test_a_dead_process_restarts_while_restarts_are_left_then_the_actor_is_dead() -> None:
    d, _ = directory()
    owner, caller = Caller(), Caller()
    actor_id = spec().actor_id
    d.create(owner, 0, spec(max_restarts=1), get_if_exists=False)
    d.started(actor_id, A, "unix:/w1", "", "")
    assert kinds(d.worker_died(actor_id, "SIGKILL")) == ["Record", "StartActor"]
    assert d.actors[actor_id].state is ActorState.RESTARTING
    # A caller that saw the old address waits for the new one, not for the old one again.
    assert d.lookup(caller, m.GetActorInfo(3, actor_id, stale_address="unix:/w1")) == []
    (_, answer) = d.started(actor_id, A, "unix:/w2", "", "")
    assert isinstance(answer, Answer) and answer.info.address == "unix:/w2"
    commands = d.worker_died(actor_id, "SIGKILL")
    assert d.actors[actor_id].state is ActorState.DEAD
    assert "max_restarts=1 is used up" in d.actors[actor_id].error
    # The creator is told unasked (req_id 0), once.
    assert [(c.peer, c.info.req_id) for c in commands if isinstance(c, Answer)] == [(owner, 0)]
    assert d.worker_died(actor_id, "again") == []


def test_a_failed_constructor_kills_the_worker_and_ends_the_actor() -> None:
    d, _ = directory()
    actor_id = spec().actor_id
    d.create(Caller(), 0, spec(max_restarts=5), get_if_exists=False)
    assert d.started(actor_id, A, "unix:/w", "", "ZeroDivisionError") == [KillWorker(A, actor_id)]
    commands = d.worker_died(actor_id, "killed")
    actor = d.actors[actor_id]
    assert actor.state is ActorState.DEAD and actor.restarts == 0
    assert "constructor failed: ZeroDivisionError" in actor.error
    assert "DEAD" in states(commands)


def test_killed_while_starting_its_worker_is_killed_when_it_comes_up() -> None:
    d, _ = directory()
    actor_id = spec().actor_id
    d.create(Caller(), 0, spec(max_restarts=3), get_if_exists=False)
    assert d.kill(actor_id, no_restart=False, reason="") == [KillWorker(A, actor_id)]
    assert d.started(actor_id, A, "unix:/w", "", "") == [KillWorker(A, actor_id)]
    d.worker_died(actor_id, "killed")
    assert d.actors[actor_id].state is ActorState.DEAD  # a PENDING actor is never restarted


def test_a_started_message_for_a_dead_actor_kills_that_worker() -> None:
    d, nodes = directory()
    actor_id = spec().actor_id
    d.create(Caller(), 0, spec(), get_if_exists=False)
    nodes.alive.discard(A)
    d.node_died(A, "no heartbeat")
    assert d.actors[actor_id].state is ActorState.DEAD
    assert d.started(actor_id, B, "unix:/late", "", "") == [KillWorker(B, actor_id)]
    assert d.actors[actor_id].state is ActorState.DEAD


def test_a_node_death_restarts_its_actors_elsewhere() -> None:
    d, nodes = directory()
    first, second = spec(b"1" * 16, max_restarts=-1), spec(b"2" * 16)
    d.create(Caller(), 0, first, get_if_exists=False)
    d.create(Caller(), 0, second, get_if_exists=False)
    nodes.alive.discard(A)
    nodes.fits = B
    commands = d.node_died(A, "no heartbeat")
    assert StartActor(B, first, restarts=1) in commands  # its runtime context says so
    assert d.actors[first.actor_id].node_id == B
    assert d.actors[second.actor_id].state is ActorState.DEAD
    assert f"its node {A.hex()} died" in d.actors[second.actor_id].error


def test_names_are_claimed_refused_shared_and_released() -> None:
    d, _ = directory()
    named = spec(name="counter", namespace="ns")
    assert ClaimName("ns", "counter", named.actor_id) in d.create(Caller(), 0, named, False)
    clash = spec(b"y" * 16, name="counter", namespace="ns")
    (refused,) = d.create(Caller(), 4, clash, get_if_exists=False)
    assert isinstance(refused, Answer) and refused.info.state == "DEAD"
    assert "already exists in namespace 'ns'" in refused.info.error
    (shared,) = d.create(Caller(), 4, clash, get_if_exists=True)
    assert isinstance(shared, Answer) and shared.info.actor_id == named.actor_id
    assert clash.actor_id not in d.actors
    d.started(named.actor_id, A, "unix:/w", "", "")
    # Killed for good: the name is free at once, before the worker's exit makes it DEAD.
    commands = d.kill(named.actor_id, no_restart=True, reason="")
    assert ReleaseName("ns", "counter", named.actor_id) in commands
    assert d.named("ns", "counter") is None
    assert any(isinstance(c, ClaimName) for c in d.create(Caller(), 0, clash, False))
    assert d.named("ns", "counter") is d.actors[clash.actor_id]
    died = d.worker_died(named.actor_id, "killed")  # the old one ends: released once only
    assert not any(isinstance(c, ReleaseName) for c in died)
    assert d.actors[named.actor_id].state is ActorState.DEAD


def test_a_kill_that_lets_the_actor_restart_keeps_its_name() -> None:
    d, _ = directory()
    named = spec(name="svc", namespace="ns", max_restarts=1)
    d.create(Caller(), 0, named, get_if_exists=False)
    d.started(named.actor_id, A, "unix:/w", "", "")
    assert not any(isinstance(c, ReleaseName)
                   for c in d.kill(named.actor_id, no_restart=False, reason=""))
    assert kinds(d.worker_died(named.actor_id, "killed")) == ["Record", "StartActor"]
    assert d.named("ns", "svc") is d.actors[named.actor_id]


def test_a_job_end_kills_its_actors_but_not_detached_ones() -> None:
    d, _ = directory()
    mine, detached = spec(b"1" * 16), spec(b"2" * 16, detached=True)
    d.create(Caller(), 0, mine, get_if_exists=False)
    d.create(Caller(), 0, detached, get_if_exists=False)
    assert d.job_ended(JOB, "its driver exited") == [KillWorker(A, mine.actor_id)]


def test_an_owner_gone_ends_the_actors_it_created_pending_ones_too_but_not_detached() -> None:
    d, nodes = directory()
    creator, other = Caller(), Caller()
    placed, detached, theirs = spec(b"1" * 16), spec(b"2" * 16, detached=True), spec(b"3" * 16)
    d.create(creator, 0, placed, get_if_exists=False)
    d.create(creator, 0, detached, get_if_exists=False)
    d.create(other, 0, theirs, get_if_exists=False)
    nodes.fits = None
    waiting = spec(b"4" * 16, name="svc", namespace="ns")
    d.create(creator, 0, waiting, get_if_exists=False)  # no node fits: it waits
    assert d.pending == [waiting.actor_id]
    commands = d.owner_gone(creator)
    assert [c for c in commands if isinstance(c, KillWorker)] == [KillWorker(A, placed.actor_id)]
    assert d.actors[waiting.actor_id].state is ActorState.DEAD and d.pending == []
    assert ReleaseName("ns", "svc", waiting.actor_id) in commands
    assert d.actors[detached.actor_id].state is ActorState.PENDING  # (placed, not started)
    assert "its owner" in d.actors[placed.actor_id].error
    assert creator.sent == []  # nobody left to tell
    assert kinds(d.worker_died(placed.actor_id, "killed")) == ["Record"]  # no restart
    assert d.actors[placed.actor_id].state is ActorState.DEAD
    assert d.owner_gone(other) == [KillWorker(A, theirs.actor_id)]


def test_an_actor_whose_node_is_gone_dies_at_once_when_killed() -> None:
    d, nodes = directory()
    actor_id = spec().actor_id
    waiter = Caller()
    d.create(Caller(), 0, spec(max_restarts=-1), get_if_exists=False)
    d.started(actor_id, A, "unix:/w", "", "")
    assert d.lookup(waiter, m.GetActorInfo(1, actor_id, stale_address="unix:/w")) == []
    nodes.alive.discard(A)
    commands = d.kill(actor_id, no_restart=False, reason="it was killed")
    assert kinds(commands)[0] == "Record" and d.actors[actor_id].state is ActorState.DEAD
    assert [(c.peer, c.info.state) for c in commands if isinstance(c, Answer)][0] == (
        waiter, "DEAD")


def test_lookups_of_unknown_actors_answer_missing() -> None:
    d, _ = directory()
    (answer,) = d.lookup(Caller(), m.GetActorInfo(2, b"z" * 16))
    assert isinstance(answer, Answer) and answer.info.state == "MISSING"
    (answer,) = d.lookup(Caller(), m.GetActorInfo(2, b"", name="nobody"))
    assert isinstance(answer, Answer) and answer.info.state == "MISSING"
    assert not any(isinstance(c, Record) for c in d.kill(b"z" * 16, True, ""))


def test_records_hold_the_state_of_their_own_transition() -> None:
    d, nodes = directory()
    actor_id = spec().actor_id
    (created, *_) = d.create(Caller(), 0, spec(max_restarts=2), get_if_exists=False)
    assert isinstance(created, Record)
    # Recorded with the node it starts on: a head that takes over asks that node for it.
    assert (created.state, created.node_id) == (ActorState.PENDING, A)
    d.started(actor_id, A, "unix:/w", "", "")
    nodes.fits = B
    (restarting, start) = d.worker_died(actor_id, "SIGKILL")
    assert isinstance(restarting, Record) and restarting.state is ActorState.RESTARTING
    assert restarting.node_id == B and restarting.restarts == 1  # where it starts again
    assert start == StartActor(B, spec(max_restarts=2), restarts=1)
    nodes.fits = None
    (waiting,) = d.worker_died(actor_id, "SIGKILL")  # no node fits: recorded without one
    assert isinstance(waiting, Record) and waiting.node_id == b""


def test_an_actor_killed_while_waiting_for_a_node_leaves_the_waiting_list() -> None:
    d, nodes = directory()
    nodes.fits = None
    d.create(Caller(), 0, spec(), get_if_exists=False)
    assert kinds(d.kill(spec().actor_id, no_restart=True, reason="")) == ["Record", "Answer"]
    assert d.pending == [] and d.actors[spec().actor_id].state is ActorState.DEAD
    nodes.fits = A
    assert d.place_pending() == []


# -- recovery after a head restart ---------------------------------------------------------

def recorded(commands: list[Command]) -> list[str]:
    return [c.state.value for c in commands if isinstance(c, Record)]


def recovering() -> tuple[ActorDirectory, Nodes]:
    d, nodes = directory()
    d.recovering = True
    return d, nodes


def test_a_restored_alive_actor_answers_at_once_and_stays_where_it_runs() -> None:
    d, _ = recovering()
    d.restore(spec(), ActorState.ALIVE, A, "unix:/w", "1.2.3.4:5", 0, "")
    (answer,) = d.lookup(Caller(), m.GetActorInfo(1, spec().actor_id))
    assert isinstance(answer, Answer)
    assert (answer.info.state, answer.info.address, answer.info.node_id) == (
        "ALIVE", "unix:/w", A)
    hosted = [m.HostedActor(spec(), "unix:/w", "1.2.3.4:5")]
    assert recorded(d.node_back(A, hosted)) == ["ALIVE"]  # recorded again, nothing started
    assert not any(isinstance(c, StartActor) for c in d.nodes_back())


def test_a_node_that_rejoins_without_a_recorded_actor_reports_its_death() -> None:
    d, nodes = recovering()
    d.restore(spec(max_restarts=1), ActorState.ALIVE, A, "unix:/w", "", 0, "")
    nodes.fits = B
    commands = d.node_back(A, [])
    assert recorded(commands) == ["RESTARTING"]
    assert not any(isinstance(c, StartActor) for c in commands)  # placement waits
    (start,) = [c for c in d.nodes_back() if isinstance(c, StartActor)]
    assert start.node_id == B and d.actors[spec().actor_id].restarts == 1


def test_an_actor_starting_when_the_head_died_is_not_started_twice() -> None:
    d, _ = recovering()
    d.restore(spec(), ActorState.PENDING, A, "", "", 0, "")
    assert d.node_back(A, [m.HostedActor(spec())]) == []  # still starting there
    assert d.nodes_back() == []
    # Its constructor finishes: it is ALIVE where it started.
    assert recorded(d.started(spec().actor_id, A, "unix:/w", "", "")) == ["ALIVE"]


def test_an_actor_whose_start_order_was_lost_is_placed_again_once_nodes_are_back() -> None:
    d, _ = recovering()
    d.restore(spec(), ActorState.PENDING, A, "", "", 0, "")
    assert d.node_back(A, []) == []  # not there, and placement waits
    (start,) = [c for c in d.nodes_back() if isinstance(c, StartActor)]
    assert start.node_id == A


def test_an_actor_on_a_node_that_never_rejoins_restarts_or_dies_by_its_limit() -> None:
    d, nodes = recovering()
    d.restore(spec(b"1" * 16, max_restarts=0), ActorState.PENDING, B, "", "", 0, "")
    d.restore(spec(b"2" * 16, max_restarts=1), ActorState.ALIVE, B, "unix:/w", "", 0, "")
    nodes.alive = {A}
    commands = d.node_died(B, "it did not rejoin")
    assert d.actors[b"1" * 16].state is ActorState.DEAD
    assert d.actors[b"2" * 16].state is ActorState.RESTARTING
    assert not any(isinstance(c, StartActor) for c in commands)
    (start,) = [c for c in d.nodes_back() if isinstance(c, StartActor)]
    assert start == StartActor(A, spec(b"2" * 16, max_restarts=1), restarts=1)


def test_a_node_that_rejoins_with_an_actor_nobody_recorded_adopts_it() -> None:
    d, _ = recovering()
    commands = d.node_back(A, [m.HostedActor(spec(), "unix:/w", "")])
    assert recorded(commands) == ["ALIVE"]
    assert d.actors[spec().actor_id].orphaned  # its owner must still come back


def test_a_dead_actor_hosted_by_a_rejoining_node_is_killed_there() -> None:
    d, _ = recovering()
    d.restore(spec(), ActorState.DEAD, A, "", "", 0, "killed")
    assert d.node_back(A, [m.HostedActor(spec(), "unix:/w")]) == [
        KillWorker(A, spec().actor_id)]
    (answer,) = d.lookup(Caller(), m.GetActorInfo(1, spec().actor_id))
    assert isinstance(answer, Answer) and answer.info.error == "killed"


def test_orphans_end_unless_their_creator_sends_them_again() -> None:
    d, _ = recovering()
    d.restore(spec(b"1" * 16, name="kept"), ActorState.ALIVE, A, "unix:/1", "", 0, "")
    d.restore(spec(b"2" * 16), ActorState.ALIVE, A, "unix:/2", "", 0, "")
    d.restore(spec(b"3" * 16, detached=True), ActorState.ALIVE, A, "unix:/3", "", 0, "")
    creator = Caller()
    assert d.create(creator, 0, spec(b"1" * 16, name="kept"), get_if_exists=False) == []
    commands = d.owners_gone()
    assert commands == [KillWorker(A, b"2" * 16)]  # not the reclaimed one, not detached
    assert d.actors[b"1" * 16].owner is creator
    # A name recorded before the restart is still taken.
    (answer,) = d.create(Caller(), 1, spec(b"4" * 16, name="kept"), get_if_exists=False)
    assert isinstance(answer, Answer) and "already exists" in answer.info.error


def test_a_creation_sent_again_for_an_unknown_actor_waits_for_the_nodes() -> None:
    d, _ = recovering()
    commands = d.create(Caller(), 0, spec(), get_if_exists=False)
    assert not any(isinstance(c, StartActor) for c in commands)
    assert d.node_back(A, [m.HostedActor(spec(), "unix:/w")]) != []  # it was there
    assert not any(isinstance(c, StartActor) for c in d.nodes_back())
    assert d.actors[spec().actor_id].state is ActorState.ALIVE
