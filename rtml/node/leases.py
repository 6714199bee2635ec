"""Where a lease request goes: queued here, spilled to the head, or both (the hybrid
scheduler's node half), as a pure state machine over the node's ``LocalScheduler``.

    RequestLease --spilled by another node, or pinned here and fits--> queue here
                 --pinned here (hard) and does not fit-------------> LeaseFailed
                 --no node shape fits here, SPREAD, pinned elsewhere--> spill (must move)
                 --fits here but busy, other nodes exist----> queue here AND spill
    LeasePlaced (the head's answer to a spill):
        infeasible everywhere for now --> LeaseInfeasible to the client (it waits on)
        error                         --> LeaseFailed (unless granted here meanwhile)
        this node                     --> queue here (if it was not already)
        another node                  --> LeaseSpillback(node, address), and the local
                                          request is withdrawn
    granted here, cancelled, or the client left --> the spill is withdrawn at the head

Commands out: ``Reply(client, msg)`` to the requesting client, ``ToHead(msg)``, and the
local scheduler's own commands (``Grant``, ``StartWorker``...), which the node manager
carries out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rtml.ids import NodeID, WorkerID
from rtml.rpc import messages as m
from rtml.scheduler.local import LocalScheduler
from rtml.scheduler.resources import Shape, bad_amount, fits
from rtml.scheduler.strategy import SPREAD, parse_affinity


@dataclass(frozen=True)
class Reply:
    client: Any
    msg: m.Msg


@dataclass(frozen=True)
class ToHead:
    msg: m.Msg


@dataclass
class Spilling:
    """A lease request the head is placing; ``queued_here`` if it also waits locally."""

    client: Any
    msg: m.RequestLease
    queued_here: bool
    infeasible: bool = False


class LeaseRouter:
    """The node's lease requests: the local queue (``sched``) and those at the head."""

    def __init__(self, node_id: NodeID, sched: LocalScheduler,
                 worker_of: Callable[[Any], WorkerID | None] = lambda client: None) -> None:
        """``worker_of(client)``: the id of the worker a client is, or None."""
        self.node_id = node_id
        self.sched = sched
        self.worker_of = worker_of
        self.spilling: dict[int, Spilling] = {}  # by spill id (our req_id at the head)
        self._spill_of: dict[tuple[Any, int], int] = {}  # (client, its req_id) -> spill id
        self._spill_ids = 0

    def request(self, client: Any, msg: m.RequestLease, other_nodes: bool) -> list[Any]:
        """A client asks for a lease (``other_nodes``: the cluster has other live nodes)."""
        bad = bad_amount(msg.shape)
        if bad:  # (the API refuses it first: only a hand-made request gets here)
            return [Reply(client, m.LeaseFailed(msg.req_id, f"lease refused: {bad}"))]
        feasible = self.sched.feasible(msg.shape)
        affinity = parse_affinity(msg.strategy)
        pinned_here = affinity is not None and affinity[0] == self.node_id
        if msg.spilled or (pinned_here and feasible):
            return self._queue(client, msg)
        if pinned_here and affinity is not None and not affinity[1]:
            return [Reply(client, m.LeaseFailed(msg.req_id, (
                f"NodeAffinitySchedulingStrategy(soft=False) pins it to node "
                f"{self.node_id.hex()}, which does not have {msg.shape}")))]
        if not feasible or msg.strategy == SPREAD or (affinity and not pinned_here):
            return self._spill(client, msg, queued_here=False)
        busy = not fits(msg.shape, self.sched.available)
        commands = self._queue(client, msg)
        if busy and other_nodes:  # the hybrid step: maybe another node has room now
            commands += self._spill(client, msg, queued_here=True)
        return commands

    def placed(self, placed: m.LeasePlaced) -> list[Any]:
        """The head answered spill ``placed.req_id``."""
        spilling = self.spilling.get(placed.req_id)
        if spilling is None:
            return []
        client, msg = spilling.client, spilling.msg
        if placed.infeasible:
            spilling.infeasible = True
            return [Reply(client, m.LeaseInfeasible(msg.req_id, msg.shape))]
        del self.spilling[placed.req_id]
        self._spill_of.pop((client, msg.req_id), None)
        if placed.node_id == self.node_id and not placed.error:
            return [] if spilling.queued_here else self._queue(client, msg)
        if spilling.queued_here and not self.sched.cancel_request(client, msg.req_id):
            return []  # granted here meanwhile: that grant stands
        if placed.error:
            return [Reply(client, m.LeaseFailed(msg.req_id, placed.error))]
        return [Reply(client, m.LeaseSpillback(msg.req_id, placed.node_id, placed.address))]

    def granted(self, client: Any, req_id: int) -> list[Any]:
        """The request was granted here: the head may stop placing it."""
        return self._withdraw(client, req_id) if self._spill_of else []

    def cancel(self, client: Any, req_id: int) -> list[Any]:
        """The client gave the request up."""
        self.sched.cancel_request(client, req_id)
        return self._withdraw(client, req_id)

    def client_gone(self, client: Any) -> list[Any]:
        commands = self.sched.client_gone(client)
        for spilling in list(self.spilling.values()):
            if spilling.client is client:
                commands += self._withdraw(client, spilling.msg.req_id)
        return commands

    def respill(self) -> list[m.SpillLease]:
        """Every request the head was placing, to ask again of a head that restarted."""
        return [self._spill_msg(spill_id, spilling)
                for spill_id, spilling in self.spilling.items()]

    def waiting_shapes(self) -> list[Shape]:
        """The demand no node can serve now (for the heartbeat): queued here, or
        infeasible everywhere."""
        return self.sched.pending_shapes() + [
            s.msg.shape for s in self.spilling.values() if s.infeasible]

    def _queue(self, client: Any, msg: m.RequestLease) -> list[Any]:
        commands: list[Any] = []
        if not self.sched.feasible(msg.shape):
            commands.append(Reply(client, m.LeaseInfeasible(msg.req_id, msg.shape)))
        return commands + self.sched.request_lease(client, msg.req_id, msg.shape,
                                                   self.worker_of(client), msg.runtime_env)

    def _spill(self, client: Any, msg: m.RequestLease, queued_here: bool) -> list[Any]:
        self._spill_ids += 1
        self.spilling[self._spill_ids] = Spilling(client, msg, queued_here)
        self._spill_of[(client, msg.req_id)] = self._spill_ids
        return [ToHead(self._spill_msg(self._spill_ids, self.spilling[self._spill_ids]))]

    @staticmethod
    def _spill_msg(spill_id: int, spilling: Spilling) -> m.SpillLease:
        msg = spilling.msg
        return m.SpillLease(spill_id, msg.shape, msg.strategy, msg.preferred_node,
                            must_move=not spilling.queued_here)

    def _withdraw(self, client: Any, req_id: int) -> list[Any]:
        spill_id = self._spill_of.pop((client, req_id), None)
        if spill_id is None:
            return []
        del self.spilling[spill_id]
        return [ToHead(m.CancelLeaseRequest(spill_id))]
