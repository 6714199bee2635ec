"""The global scheduler's core (rtml.scheduler.placement), without processes or sockets."""

from __future__ import annotations

from rtml.scheduler.placement import (
    Failed,
    GlobalScheduler,
    NodeView,
    Parked,
    Pending,
    Placed,
    Request,
)
from rtml.scheduler.strategy import parse_affinity

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16
ONE_CPU = {"CPU": 1.0}


def cluster(**cpus: float) -> GlobalScheduler:
    sched = GlobalScheduler()
    for name, count in cpus.items():
        node_id = {"a": A, "b": B, "c": C}[name]
        sched.node_added(NodeView(node_id, f"{name}:1", {"CPU": count}, {"CPU": count},
                                  last_heartbeat=1.0))
    return sched


def test_parse_affinity() -> None:
    assert parse_affinity("") is None and parse_affinity("SPREAD") is None
    assert parse_affinity(f"node:{A.hex()}") == (A, False)
    assert parse_affinity(f"node:{A.hex()}:soft") == (A, True)


def test_a_full_origin_spills_to_the_roomiest_other_node() -> None:
    sched = cluster(a=1, b=1, c=2)
    decision = sched.place(Request(A, 1, ONE_CPU))
    assert isinstance(decision, Placed) and decision.node_id == C
    assert sched.nodes[C].available["CPU"] == 1.0  # deducted until the next heartbeat


def test_the_node_holding_the_arguments_is_preferred() -> None:
    sched = cluster(a=1, b=1, c=4)
    decision = sched.place(Request(A, 1, ONE_CPU, preferred=B))
    assert isinstance(decision, Placed) and decision.node_id == B


def test_when_every_node_is_busy_the_request_parks_then_moves_on_a_heartbeat() -> None:
    sched = cluster(a=1, b=1)
    sched.nodes[B].available["CPU"] = 0.0
    assert isinstance(sched.place(Request(A, 7, ONE_CPU)), Parked)
    assert sched.heartbeat(B, {"CPU": 0.0}, now=2.0) == []
    (decision,) = sched.heartbeat(B, {"CPU": 1.0}, now=3.0)
    assert isinstance(decision, Placed) and decision.node_id == B
    assert decision.request.req_id == 7 and not sched.pending


def test_a_withdrawn_request_is_not_placed_later() -> None:
    sched = cluster(a=1, b=1)
    sched.nodes[B].available["CPU"] = 0.0
    sched.place(Request(A, 7, ONE_CPU))
    sched.withdraw(A, 7)
    assert sched.heartbeat(B, {"CPU": 1.0}, now=2.0) == []


def test_infeasible_requests_wait_for_a_node_that_fits() -> None:
    sched = cluster(a=1)
    gpu = {"CPU": 1.0, "GPU": 1.0}
    assert isinstance(sched.place(Request(A, 1, gpu, must_move=True)), Pending)
    (decision,) = sched.node_added(NodeView(B, "b:1", {"CPU": 1.0, "GPU": 1.0},
                                            {"CPU": 1.0, "GPU": 1.0}))
    assert isinstance(decision, Placed) and decision.node_id == B


def test_spread_goes_round_robin() -> None:
    sched = cluster(a=4, b=4, c=4)
    chosen = [sched.place(Request(A, i, ONE_CPU, strategy="SPREAD", must_move=True))
              for i in range(6)]
    nodes = [d.node_id for d in chosen if isinstance(d, Placed)]
    assert len(nodes) == 6 and set(nodes) == {A, B, C}
    assert all(nodes.count(n) == 2 for n in (A, B, C))


def test_hard_affinity_to_a_missing_or_dead_node_fails_soft_falls_back() -> None:
    sched = cluster(a=1, b=1)
    ghost = b"z" * 16
    decision = sched.place(Request(A, 1, ONE_CPU, strategy=f"node:{ghost.hex()}",
                                   must_move=True))
    assert isinstance(decision, Failed) and "not in the cluster" in decision.error
    sched.node_died(B)
    decision = sched.place(Request(A, 2, ONE_CPU, strategy=f"node:{B.hex()}",
                                   must_move=True))
    assert isinstance(decision, Failed) and "is dead" in decision.error
    decision = sched.place(Request(A, 3, ONE_CPU, strategy=f"node:{B.hex()}:soft",
                                   must_move=True))
    assert isinstance(decision, Placed) and decision.node_id == A


def test_silent_nodes_expire_and_their_requests_are_dropped() -> None:
    sched = cluster(a=1, b=1)
    sched.nodes[A].available["CPU"] = 0.0
    sched.nodes[B].available["CPU"] = 0.0
    sched.place(Request(B, 1, ONE_CPU))  # parked at B
    sched.heartbeat(A, {"CPU": 0.0}, now=10.0)
    assert sched.expired(now=10.5, timeout=5.0) == [B]
    sched.node_died(B)
    assert not sched.pending and [n.node_id for n in sched.alive()] == [A]


def test_actors_go_to_the_roomiest_fitting_node() -> None:
    sched = cluster(a=1, b=3)
    node = sched.pick_for_actor(ONE_CPU)
    assert node is not None and node.node_id == B
    assert sched.pick_for_actor({"GPU": 1.0}) is None
