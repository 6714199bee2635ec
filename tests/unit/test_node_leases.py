"""The node manager's lease router (rtml.node.leases), driven without processes or sockets."""

from __future__ import annotations

from typing import Any

from rtml.node.leases import LeaseRouter, Reply, ToHead
from rtml.rpc import messages as m
from rtml.scheduler.local import Grant, LocalScheduler

HERE, THERE = b"h" * 16, b"t" * 16
OWNER = object()
ONE_CPU = {"CPU": 1.0}


def router(cpus: float = 1.0, idle_workers: int = 1, **extra: float) -> LeaseRouter:
    sched = LocalScheduler(total={"CPU": cpus, **extra}, pool_size=idle_workers)
    for n in range(idle_workers):
        sched.worker_ready(b"w%d" % n)
    return LeaseRouter(HERE, sched)


def replies(commands: list[Any]) -> list[m.Msg]:
    return [c.msg for c in commands if isinstance(c, Reply)]


def to_head(commands: list[Any]) -> list[m.Msg]:
    return [c.msg for c in commands if isinstance(c, ToHead)]


def grants(commands: list[Any]) -> list[Grant]:
    return [c for c in commands if isinstance(c, Grant)]


def test_a_request_that_fits_is_granted_here_without_the_head() -> None:
    r = router()
    commands = r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=True)
    assert len(grants(commands)) == 1 and to_head(commands) == [] and not r.spilling


def test_a_busy_node_queues_here_and_spills_then_a_local_grant_withdraws_the_spill() -> None:
    r = router(idle_workers=1)
    r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=True)  # takes the only CPU
    commands = r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=True)
    (spill,) = to_head(commands)
    assert isinstance(spill, m.SpillLease) and not spill.must_move
    assert [q.req_id for q in r.sched.pending] == [2]
    (lease_id,) = r.sched.leases
    (grant,) = grants(r.sched.return_lease(lease_id))
    assert grant.req_id == 2
    assert to_head(r.granted(OWNER, 2)) == [m.CancelLeaseRequest(spill.req_id)]
    assert not r.spilling
    assert r.placed(m.LeasePlaced(spill.req_id, THERE, "t:1")) == []  # too late: ignored


def test_a_busy_single_node_does_not_ask_the_head() -> None:
    r = router(idle_workers=1)
    r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=False)
    assert to_head(r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=False)) == []


def test_a_shape_this_node_lacks_must_move_and_goes_where_the_head_says() -> None:
    r = router()
    (spill,) = to_head(r.request(OWNER, m.RequestLease(3, {"GPU": 1.0}), other_nodes=True))
    assert isinstance(spill, m.SpillLease) and spill.must_move and not r.sched.pending
    commands = r.placed(m.LeasePlaced(spill.req_id, THERE, "t:1"))
    assert replies(commands) == [m.LeaseSpillback(3, THERE, "t:1")] and not r.spilling


def test_queued_here_and_placed_elsewhere_withdraws_the_local_request() -> None:
    r = router(idle_workers=1)
    r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=True)
    (spill,) = to_head(r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=True))
    commands = r.placed(m.LeasePlaced(spill.req_id, THERE, "t:1"))
    assert replies(commands) == [m.LeaseSpillback(2, THERE, "t:1")]
    assert not r.sched.pending


def test_placed_back_here_queues_it_here_once() -> None:
    r = router(cpus=1.0, idle_workers=1)
    (spill,) = to_head(r.request(OWNER, m.RequestLease(4, ONE_CPU, strategy="SPREAD"),
                                 other_nodes=True))
    assert not r.sched.pending
    commands = r.placed(m.LeasePlaced(spill.req_id, HERE, "h:1"))
    assert [g.req_id for g in grants(commands)] == [4]


def test_infeasible_everywhere_is_told_and_counted_as_demand_until_placed() -> None:
    r = router()
    (spill,) = to_head(r.request(OWNER, m.RequestLease(5, {"TPU": 1.0}), other_nodes=True))
    commands = r.placed(m.LeasePlaced(spill.req_id, b"", "", infeasible=True))
    assert replies(commands) == [m.LeaseInfeasible(5, {"TPU": 1.0})]
    assert r.waiting_shapes() == [{"TPU": 1.0}] and spill.req_id in r.spilling
    commands = r.placed(m.LeasePlaced(spill.req_id, THERE, "t:1"))  # a TPU node joined
    assert replies(commands) == [m.LeaseSpillback(5, THERE, "t:1")]
    assert r.waiting_shapes() == []


def test_an_error_from_the_head_fails_the_request() -> None:
    r = router()
    (spill,) = to_head(r.request(OWNER, m.RequestLease(6, {"GPU": 1.0}), other_nodes=True))
    commands = r.placed(m.LeasePlaced(spill.req_id, b"", "", error="no such node"))
    assert replies(commands) == [m.LeaseFailed(6, "no such node")]


def test_hard_affinity_to_this_node_without_the_resources_fails_at_once() -> None:
    r = router()
    strategy = f"node:{HERE.hex()}"
    (failed,) = replies(r.request(OWNER, m.RequestLease(7, {"GPU": 1.0}, strategy=strategy),
                                  other_nodes=True))
    assert isinstance(failed, m.LeaseFailed) and HERE.hex() in failed.reason
    assert not r.spilling and not r.sched.pending


def test_affinity_to_another_node_spills_and_a_spilled_request_never_spills_again() -> None:
    r = router(idle_workers=0)
    elsewhere = m.RequestLease(8, ONE_CPU, strategy=f"node:{THERE.hex()}")
    assert len(to_head(r.request(OWNER, elsewhere, other_nodes=True))) == 1
    spilled = m.RequestLease(9, ONE_CPU, spilled=True)
    assert to_head(r.request(OWNER, spilled, other_nodes=True)) == []
    assert [q.req_id for q in r.sched.pending] == [9]


def test_a_client_that_leaves_or_cancels_withdraws_its_spills() -> None:
    r = router(idle_workers=0)
    other = object()
    (first,) = to_head(r.request(OWNER, m.RequestLease(1, {"GPU": 1.0}), other_nodes=True))
    (second,) = to_head(r.request(other, m.RequestLease(1, {"GPU": 1.0}), other_nodes=True))
    assert to_head(r.client_gone(OWNER)) == [m.CancelLeaseRequest(first.req_id)]
    assert to_head(r.cancel(other, 1)) == [m.CancelLeaseRequest(second.req_id)]
    assert not r.spilling and to_head(r.cancel(other, 1)) == []


def test_queued_here_and_placed_back_here_is_not_queued_twice() -> None:
    r = router(idle_workers=1)
    r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=True)
    (spill,) = to_head(r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=True))
    assert r.placed(m.LeasePlaced(spill.req_id, HERE, "h:1")) == []
    assert [q.req_id for q in r.sched.pending] == [2]


def test_a_request_granted_here_before_the_head_answers_keeps_that_grant() -> None:
    r = router(idle_workers=1)
    r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=True)
    (spill,) = to_head(r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=True))
    (lease_id,) = r.sched.leases
    (grant,) = grants(r.sched.return_lease(lease_id))  # granted; the withdrawal not yet sent
    assert grant.req_id == 2
    assert r.placed(m.LeasePlaced(spill.req_id, THERE, "t:1")) == []  # no second lease
    assert r.placed(m.LeasePlaced(spill.req_id, b"", "", error="gone")) == []


def test_only_requests_no_node_can_serve_count_as_waiting_demand() -> None:
    r = router(idle_workers=0)
    to_head(r.request(OWNER, m.RequestLease(1, {"GPU": 1.0}), other_nodes=True))
    assert r.waiting_shapes() == []  # the head is placing it; nothing waits here
    r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=False)
    assert r.waiting_shapes() == [ONE_CPU]


def test_a_head_that_took_over_is_asked_again_for_every_request_it_was_placing() -> None:
    r = router(idle_workers=1)
    r.request(OWNER, m.RequestLease(1, ONE_CPU), other_nodes=True)  # granted here
    (busy,) = to_head(r.request(OWNER, m.RequestLease(2, ONE_CPU), other_nodes=True))
    (gpu,) = to_head(r.request(OWNER, m.RequestLease(3, {"GPU": 1.0}), other_nodes=True))
    assert r.respill() == [busy, gpu]  # the same spill ids: its answers find them
    commands = r.placed(m.LeasePlaced(gpu.req_id, THERE, "t:1"))
    assert replies(commands) == [m.LeaseSpillback(3, THERE, "t:1")]
    assert r.respill() == [busy]
