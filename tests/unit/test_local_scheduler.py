"""rtml/scheduler/local.py: the sans-I/O LocalScheduler (leases, pool, accounting)."""

from __future__ import annotations

from rtml.scheduler.local import Grant, LocalScheduler, StartActor, StartWorker, StopWorker

W1, W2, W3, W4 = b"w1", b"w2", b"w3", b"w4"
OWNER, OTHER = object(), object()
ONE_CPU = {"CPU": 1.0}


def grants(commands: list) -> list[Grant]:
    return [c for c in commands if isinstance(c, Grant)]


def starts(commands: list) -> list[StartWorker]:
    return [c for c in commands if isinstance(c, StartWorker)]


def sched(cpus: float = 2.0, pool: int = 2, **extra: float) -> LocalScheduler:
    return LocalScheduler(total={"CPU": cpus, **extra}, pool_size=pool)


def with_idle(s: LocalScheduler, *workers: bytes) -> LocalScheduler:
    for w in workers:
        s.worker_ready(w)
    return s


def test_grants_up_to_available_resources() -> None:
    s = with_idle(sched(cpus=2), W1, W2, W3)
    g1 = grants(s.request_lease(OWNER, 1, ONE_CPU))
    g2 = grants(s.request_lease(OWNER, 2, ONE_CPU))
    g3 = grants(s.request_lease(OWNER, 3, ONE_CPU))
    assert len(g1) == 1 and len(g2) == 1 and g3 == []
    assert {g1[0].worker_id, g2[0].worker_id} <= {W1, W2, W3}
    assert g1[0].worker_id != g2[0].worker_id
    assert s.available["CPU"] == 0.0
    assert [r.req_id for r in s.pending] == [3]
    # a lease coming back frees the CPU and the waiting request gets it
    g = grants(s.return_lease(g1[0].lease_id))
    assert len(g) == 1 and g[0].req_id == 3 and g[0].client is OWNER
    assert s.available["CPU"] == 0.0


def test_grant_carries_request_identity() -> None:
    s = with_idle(sched(), W1)
    (g,) = grants(s.request_lease(OWNER, 42, ONE_CPU))
    assert g.client is OWNER and g.req_id == 42 and g.worker_id == W1
    assert g.lease_id in s.leases


def test_fractional_and_zero_cpu_requests() -> None:
    s = with_idle(sched(cpus=1), W1, W2, W3)
    assert len(grants(s.request_lease(OWNER, 1, {"CPU": 0.5}))) == 1
    assert len(grants(s.request_lease(OWNER, 2, {"CPU": 0.5}))) == 1
    assert len(grants(s.request_lease(OWNER, 3, {"CPU": 0.0}))) == 1  # num_cpus=0 allowed
    assert abs(s.available["CPU"]) < 1e-9


def test_custom_resources_are_accounted() -> None:
    s = with_idle(sched(cpus=4, custom=1.0), W1, W2)
    assert len(grants(s.request_lease(OWNER, 1, {"CPU": 1.0, "custom": 1.0}))) == 1
    assert grants(s.request_lease(OWNER, 2, {"CPU": 1.0, "custom": 1.0})) == []
    assert s.available["custom"] == 0.0 and s.available["CPU"] == 3.0


def test_fifo_order_among_fitting_requests() -> None:
    s = sched(cpus=4, pool=0)
    for req in (1, 2, 3):
        s.request_lease(OWNER, req, ONE_CPU)
    got = grants(s.worker_ready(W1)) + grants(s.worker_ready(W2)) + grants(s.worker_ready(W3))
    assert [g.req_id for g in got] == [1, 2, 3]


def test_request_that_does_not_fit_yet_does_not_block_later_ones() -> None:
    s = with_idle(sched(cpus=2), W1, W2)
    s.request_lease(OWNER, 1, ONE_CPU)
    assert grants(s.request_lease(OWNER, 2, {"CPU": 2.0})) == []  # needs both CPUs
    g = grants(s.request_lease(OWNER, 3, ONE_CPU))
    assert [x.req_id for x in g] == [3]


def test_no_idle_worker_asks_for_workers_once() -> None:
    s = sched(cpus=2, pool=0)
    c1 = s.request_lease(OWNER, 1, ONE_CPU)
    assert grants(c1) == [] and len(starts(c1)) == 1
    c2 = s.request_lease(OWNER, 2, ONE_CPU)
    assert len(starts(c2)) == 1  # one more for the second waiting request
    c3 = s.request_lease(OWNER, 3, ONE_CPU)
    assert starts(c3) == []  # does not fit (2 CPUs), so no worker for it
    assert s.starting == 2
    g = grants(s.worker_ready(W1))
    assert [x.req_id for x in g] == [1] and s.starting == 1


def test_blocked_worker_lends_its_cpu() -> None:
    s = with_idle(sched(cpus=1), W1, W2)
    (g1,) = grants(s.request_lease(OWNER, 1, ONE_CPU))
    assert grants(s.request_lease(OWNER, 2, ONE_CPU)) == []
    # the task on g1's worker blocks in rtml.get: its CPU goes to the waiting request
    g = grants(s.worker_blocked(g1.worker_id))
    assert [x.req_id for x in g] == [2]
    assert s.available["CPU"] == 0.0
    assert s.worker_blocked(g1.worker_id) == []  # idempotent
    # unblocking takes the CPU back (may go negative until the nested task finishes)
    s.worker_unblocked(g1.worker_id)
    assert s.available["CPU"] == -1.0
    s.return_lease(g[0].lease_id)
    s.return_lease(g1.lease_id)
    assert s.available["CPU"] == 1.0


def test_lease_returned_while_blocked_does_not_double_count() -> None:
    s = with_idle(sched(cpus=1), W1)
    (g1,) = grants(s.request_lease(OWNER, 1, ONE_CPU))
    s.worker_blocked(g1.worker_id)
    assert s.available["CPU"] == 1.0
    s.return_lease(g1.lease_id)
    assert s.available["CPU"] == 1.0


def test_infeasible_request_stays_pending() -> None:
    s = with_idle(sched(cpus=2), W1)
    shape = {"CPU": 1.0, "GPU": 1.0}
    assert not s.feasible(shape)
    assert s.feasible(ONE_CPU)
    cmds = s.request_lease(OWNER, 1, shape)
    assert grants(cmds) == [] and starts(cmds) == []
    assert shape in s.pending_shapes()
    s.worker_ready(W2)
    assert [r.req_id for r in s.pending] == [1]
    assert s.cancel_request(OWNER, 1) is True
    assert not s.pending


def test_client_gone_stops_its_workers_and_drops_its_requests() -> None:
    s = with_idle(sched(cpus=2), W1, W2)
    (g1,) = grants(s.request_lease(OWNER, 1, ONE_CPU))
    (g2,) = grants(s.request_lease(OTHER, 1, ONE_CPU))
    s.request_lease(OWNER, 2, ONE_CPU)  # pending: no CPU left
    s.request_lease(OTHER, 3, ONE_CPU)  # pending
    cmds = s.client_gone(OWNER)
    # OWNER's worker may still run its task: it is stopped, not handed to OTHER
    assert [c.worker_id for c in cmds if isinstance(c, StopWorker)] == [g1.worker_id]
    assert grants(cmds) == []
    assert all(r.client is not OWNER for r in s.pending)
    # once that worker has exited and a fresh one is ready, OTHER's request gets it
    s.worker_died(g1.worker_id)
    got = grants(s.worker_ready(W3))
    assert [(g.client, g.req_id, g.worker_id) for g in got] == [(OTHER, 3, W3)]
    assert all(lease.client is not OWNER for lease in s.leases.values())
    stopped = [c.worker_id for c in s.client_gone(OTHER) if isinstance(c, StopWorker)]
    assert sorted(stopped) == sorted([g2.worker_id, W3])
    for worker_id in stopped:
        s.worker_died(worker_id)
    assert s.available["CPU"] == 2.0 and not s.leases


def test_worker_died_frees_resources_and_ensure_pool_refills() -> None:
    s = sched(cpus=2, pool=2)
    assert len(s.ensure_pool(0)) == 2
    assert s.ensure_pool(0) == []  # already starting
    s.worker_ready(W1)
    s.worker_ready(W2)
    assert s.starting == 0
    (g1,) = grants(s.request_lease(OWNER, 1, ONE_CPU))
    s.worker_died(g1.worker_id)
    assert g1.lease_id not in s.leases and s.available["CPU"] == 2.0
    assert g1.worker_id not in s.idle
    refill = s.ensure_pool(1)
    assert starts(refill) == [StartWorker()] and s.starting == 1
    s.worker_died(W2 if g1.worker_id == W1 else W1)  # an idle worker dies too
    assert not s.idle
    assert len(s.ensure_pool(0)) == 1 and s.starting == 2


def test_return_of_unknown_lease_is_ignored() -> None:
    s = with_idle(sched(), W1)
    assert s.return_lease(12345) == []
    assert s.available["CPU"] == 2.0


def test_actor_placement_holds_its_shape() -> None:
    s = sched(cpus=1, pool=0)
    cmds = s.place_actor(b"a1", {"CPU": 1.0}, {})
    assert StartActor(b"a1") in cmds
    assert s.available["CPU"] == 1.0  # num_cpus defaults to 0 while alive
    cmds = s.place_actor(b"a2", {"CPU": 1.0}, {"CPU": 1.0})
    assert StartActor(b"a2") in cmds and s.available["CPU"] == 0.0
    assert s.place_actor(b"a3", {"CPU": 1.0}, {"CPU": 1.0}) == []
    cmds = s.actor_gone(b"a2")
    assert StartActor(b"a3") in cmds


def test_reap_idle_stops_only_extra_workers_idle_long_enough() -> None:
    s = with_idle(sched(cpus=2, pool=2), W1, W2, W3, W4)
    assert s.reap_idle(ticks=3) == [] and s.reap_idle(ticks=3) == []
    reaped = s.reap_idle(ticks=3)
    assert reaped == [W1, W2] and list(s.idle) == [W3, W4]  # the pool keeps its size
    assert s.reap_idle(ticks=3) == []


def test_reap_idle_counts_only_uninterrupted_idleness() -> None:
    s = with_idle(sched(cpus=2, pool=0), W1)
    s.reap_idle(ticks=2)
    lease = grants(s.request_lease(OWNER, 1, ONE_CPU))[0]
    assert s.reap_idle(ticks=2) == []  # leased: not idle, its count restarts
    s.return_lease(lease.lease_id)
    assert s.reap_idle(ticks=2) == []
    assert s.reap_idle(ticks=2) == [W1]


def test_worker_that_dies_while_starting_is_replaced() -> None:
    s = sched(cpus=2, pool=0)
    assert len(starts(s.request_lease(OWNER, 1, ONE_CPU))) == 1
    assert s.starting == 1
    # e.g. it crashed while importing: the waiting request asks for a new worker
    assert len(starts(s.worker_died(b"never-ready", was_starting=True))) == 1
    assert s.starting == 1


def test_a_worker_is_never_granted_its_own_lease_request() -> None:
    # A worker whose task submitted tasks, then ended, is idle: granted to itself it would
    # have to connect to itself from the thread serving its connections (a 10 s stall).
    s = with_idle(sched(cpus=2), W1)
    assert grants(s.request_lease(OWNER, 1, ONE_CPU, requester=W1)) == []
    commands = s.worker_ready(W2)
    (g,) = grants(commands)
    assert (g.req_id, g.worker_id) == (1, W2)
    assert list(s.idle) == [W1]  # still there for anyone else
    (other,) = grants(s.request_lease(OTHER, 2, ONE_CPU))
    assert other.worker_id == W1


def test_a_workers_request_waits_for_a_new_worker_when_only_it_is_idle() -> None:
    s = with_idle(sched(cpus=2, pool=1), W1)
    commands = s.request_lease(OWNER, 1, ONE_CPU, requester=W1)
    assert grants(commands) == [] and len(starts(commands)) == 1


def test_gpu_and_cpu_leases_never_share_a_worker() -> None:
    s = with_idle(sched(cpus=4, pool=2, GPU=2.0), W1, W2)
    (cpu,) = grants(s.request_lease(OWNER, 1, ONE_CPU))
    s.return_lease(cpu.lease_id)  # W1 is idle again, a CPU worker now
    (gpu,) = grants(s.request_lease(OWNER, 2, {"CPU": 1.0, "GPU": 1.0}))
    assert gpu.worker_id != cpu.worker_id
    s.return_lease(gpu.lease_id)
    # only CPU workers idle: a GPU lease waits for a fresh worker, never takes one of them
    (cpu2,) = grants(s.request_lease(OWNER, 3, ONE_CPU))
    assert cpu2.worker_id == cpu.worker_id
    commands = s.request_lease(OWNER, 4, {"GPU": 1.0})
    (again,) = grants(commands)
    assert again.worker_id == gpu.worker_id  # the GPU worker, not a CPU one
    s.return_lease(cpu2.lease_id)  # a CPU worker idle; a GPU lease starts a worker instead
    commands = s.request_lease(OWNER, 5, {"GPU": 0.5})
    assert grants(commands) == [] and len(starts(commands)) == 1
    (fresh,) = grants(s.worker_ready(W3))
    assert fresh.worker_id == W3 and fresh.req_id == 5


def test_a_reaped_or_dead_worker_forgets_its_kind() -> None:
    s = with_idle(sched(cpus=2, pool=0, GPU=1.0), W1)
    (g,) = grants(s.request_lease(OWNER, 1, {"GPU": 1.0}))
    s.return_lease(g.lease_id)
    assert s.gpu_worker == {W1: True}
    assert s.reap_idle(ticks=1) == [W1] and s.gpu_worker == {}
    s.worker_ready(W2)
    grants(s.request_lease(OWNER, 2, ONE_CPU))
    assert s.gpu_worker == {W2: False}
    s.worker_died(W2)
    assert s.gpu_worker == {}
