"""The global scheduler's core: where a spilled lease request or an actor should go.

Sans-I/O. The head service feeds it the node view (registrations, heartbeats,
deaths) and asks it to place requests::

    node manager --SpillLease--> place(request) --> Placed(node)   the origin asks that node
                                               |-> Parked          all busy: it waits at the
                                               |                   origin (no answer), and
                                               \\-> Pending         no node fits: kept, and
    node joins / heartbeat shows room --> retry_pending() --> Placed ...  placed when one does
    the origin granted it itself --> withdraw(origin, req_id)

Policy (DESIGN.md, the hybrid scheduler): a node-affinity request goes to its
node (or, if soft and that node cannot take it, falls through to the default);
SPREAD goes round-robin over the nodes that fit; the default prefers the node
holding the task's large arguments, then any node with room now, then any node
that could ever fit it. Placing a request deducts its shape from the chosen
node's view until the next heartbeat reports the truth, so a burst of requests
does not all land on the one node that looked free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rtml.ids import NO_NODE, NodeID
from rtml.scheduler.resources import Shape, fits, subtract
from rtml.scheduler.strategy import SPREAD, parse_affinity


@dataclass
class NodeView:
    node_id: NodeID
    address: str
    total: Shape
    available: Shape
    alive: bool = True
    last_heartbeat: float = 0.0


@dataclass(frozen=True)
class Request:
    origin: NodeID
    req_id: int
    shape: Shape
    strategy: str = ""
    preferred: NodeID = NO_NODE
    must_move: bool = False


@dataclass(frozen=True)
class Placed:
    request: Request
    node_id: NodeID
    address: str


@dataclass(frozen=True)
class Failed:
    request: Request
    error: str


@dataclass(frozen=True)
class Pending:
    request: Request


@dataclass(frozen=True)
class Parked:
    request: Request


Decision = Placed | Failed | Pending | Parked


@dataclass
class GlobalScheduler:
    nodes: dict[NodeID, NodeView] = field(default_factory=dict)
    pending: list[Request] = field(default_factory=list)  # infeasible or parked
    _spread_next: int = 0

    # -- node view ---------------------------------------------------------------------------

    def node_added(self, node: NodeView) -> list[Decision]:
        self.nodes[node.node_id] = node
        return self.retry_pending()

    def heartbeat(self, node_id: NodeID, available: Shape, now: float,
                  total: Shape | None = None) -> list[Decision]:
        """``total``: the node's resources, when they changed (placement group bundles)."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return []
        node.available, node.last_heartbeat = dict(available), now
        if total is not None:
            node.total = dict(total)
        return self.retry_pending() if self.pending else []

    def node_died(self, node_id: NodeID) -> None:
        """Mark a node dead and drop the requests it was waiting on (nobody will answer)."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.alive = False
        self.pending = [r for r in self.pending if r.origin != node_id]

    def withdraw(self, origin: NodeID, req_id: int) -> None:
        """The origin no longer needs a place for this request (it granted it itself)."""
        self.pending = [r for r in self.pending
                        if not (r.origin == origin and r.req_id == req_id)]

    def excuse(self, now: float) -> None:
        """The scheduler's host was not running (stopped, starved) until ``now``: no node
        could be heard meanwhile, so each is given a fresh timeout from now."""
        for node in self.nodes.values():
            if node.alive:
                node.last_heartbeat = now

    def expired(self, now: float, timeout: float) -> list[NodeID]:
        """Alive nodes whose last heartbeat is older than ``timeout`` seconds."""
        return [n.node_id for n in self.nodes.values()
                if n.alive and n.last_heartbeat and now - n.last_heartbeat > timeout]

    def alive(self) -> list[NodeView]:
        return [n for n in self.nodes.values() if n.alive]

    # -- placement ---------------------------------------------------------------------------

    def place(self, request: Request) -> Decision:
        decision = self._decide(request)
        if isinstance(decision, Pending | Parked):
            self.pending.append(request)
        elif isinstance(decision, Placed):
            subtract(self.nodes[decision.node_id].available, request.shape)
        return decision

    def retry_pending(self) -> list[Decision]:
        waiting, self.pending = self.pending, []
        decisions = [self.place(request) for request in waiting]
        return [d for d in decisions if not isinstance(d, Pending | Parked)]

    def pick_for_actor(self, shape: Shape, spread: bool = False) -> NodeView | None:
        """A node for an actor of ``shape``: the roomiest that fits (round-robin if ``spread``)."""
        fitting = [n for n in self.alive() if fits(shape, n.total)]
        if not fitting:
            return None
        candidates = [n for n in fitting if fits(shape, n.available)] or fitting
        if spread:
            self._spread_next += 1
            node = candidates[self._spread_next % len(candidates)]
        else:
            node = max(candidates, key=lambda n: n.available.get("CPU", 0.0))
        subtract(node.available, shape)
        return node

    def _decide(self, request: Request) -> Decision:
        affinity = parse_affinity(request.strategy)
        if affinity is not None:
            node = self.nodes.get(affinity[0])
            if node is not None and node.alive and fits(request.shape, node.total):
                return self._to(request, node)
            if not affinity[1]:
                why = "is dead" if node is not None else "is not in the cluster"
                if node is not None and node.alive:
                    why = f"does not have {request.shape}"
                return Failed(request, f"NodeAffinitySchedulingStrategy(soft=False) pins it "
                                       f"to node {affinity[0].hex()}, which {why}; use "
                                       f"soft=True to let it run elsewhere")
        fitting = [n for n in self.alive() if fits(request.shape, n.total)]
        if not fitting:
            return Pending(request)
        roomy = [n for n in fitting if fits(request.shape, n.available)]
        if request.strategy == SPREAD:
            candidates = roomy or fitting
            self._spread_next += 1
            return self._to(request, candidates[self._spread_next % len(candidates)])
        # The origin asked because it has no room now (or cannot run it at all); our view
        # of it may be a heartbeat old, so it does not count as roomy.
        origin = self.nodes.get(request.origin)
        roomy = [n for n in roomy if n is not origin]
        preferred = self.nodes.get(request.preferred)
        if preferred is not None and preferred in roomy:
            return self._to(request, preferred)
        if roomy:
            return self._to(request, max(roomy, key=lambda n: n.available.get("CPU", 0.0)))
        if origin in fitting and not request.must_move:
            return Parked(request)  # everyone is busy: wait at home until a node frees up
        return self._to(request, fitting[0])

    def _to(self, request: Request, node: NodeView) -> Placed:
        return Placed(request, node.node_id, node.address)
