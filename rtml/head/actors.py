"""The actor directory: every actor's life, as a pure state machine (no socket, no Redis).

    CreateActor --create--> PENDING --place: a node fits--> StartActor(node)
                               |                              |
                               | no node fits: waits for      v
                               | place_pending()          started() --error--> DEAD
                               v                              |
                           RESTARTING <--worker_died()--- ALIVE (address)
                          (restarts left)    |  node_died()
                                             +--no restarts left, or killed--> DEAD

Each event returns the commands that carry it out, which the head service executes:
``StartActor`` / ``KillWorker`` go to a node manager, ``Answer`` to a caller waiting for
the actor's address (or its death), ``Record`` to the control plane and the timeline,
``ClaimName`` / ``ReleaseName`` to the control plane's named-actor table. A DEAD actor
also answers its creator unasked (``req_id`` 0), which lets go of the constructor's
arguments.

Placement is the head's: the directory is given ``pick_node(spec) -> node id | None``
and ``node_alive(node_id)`` and asks them, so a test drives it with plain functions.

A head that restarted rebuilds the directory (recovery):

    restore(record)... from the control plane: every actor as last recorded, its owner
                       "orphaned" (not yet reconnected) unless detached
    create(spec) again  its creator reconnected and sent it again: its own again
    node_back(node, hosted)  a node re-registered with the actors it runs or is starting:
                       those are placed there (ALIVE if constructed); ones recorded there
                       but not hosted died (ALIVE) or were never started (placed again)
    nodes_back()       every node recorded alive is back or declared dead: placement,
                       held back until now so nothing starts twice, resumes
    owners_gone()      the reconnection window closed: actors still orphaned end, as
                       when their owner dies
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from rtml.ids import NO_NODE, ActorID, JobID, NodeID
from rtml.rpc import messages as m


class Caller(Protocol):
    """A connection the head answers on (the shell's ``Peer``)."""

    def send(self, msg: m.Msg) -> None: ...


class ActorState(enum.StrEnum):
    PENDING = "PENDING"
    """Created; waiting for a node, or for its worker to start there."""
    ALIVE = "ALIVE"
    """Its constructor ran; callers reach it at ``address``."""
    RESTARTING = "RESTARTING"
    """Its process died with restarts left; being placed again."""
    DEAD = "DEAD"
    """For good: killed, constructor failed, restarts used up, or out of scope."""


@dataclass(frozen=True)
class Waiter:
    """A caller waiting for an actor to be ALIVE at an address other than ``stale``."""

    peer: Caller
    req_id: int
    stale: str


@dataclass
class Actor:
    spec: m.ActorSpec
    owner: Caller | None  # its creator's connection: told when it is DEAD for good
    state: ActorState = ActorState.PENDING
    address: str = ""
    tcp_address: str = ""
    node_id: NodeID = NO_NODE
    restarts: int = 0
    error: str = ""
    pid: int = 0  # its worker process, once started (0: not known)
    no_restart: bool = False
    name_released: bool = False  # killed for good: its name is free before it is DEAD
    orphaned: bool = False  # restored after a head restart; its owner has not reconnected
    waiters: list[Waiter] = field(default_factory=list)

    def info(self, req_id: int) -> m.ActorInfo:
        return m.ActorInfo(req_id, self.spec.actor_id, self.state.value, self.address,
                           self.error, self.spec, self.tcp_address, self.node_id)

    @property
    def restarts_left(self) -> bool:
        limit = self.spec.max_restarts
        return limit < 0 or self.restarts < limit


@dataclass(frozen=True)
class StartActor:
    node_id: NodeID
    spec: m.ActorSpec
    restarts: int = 0


@dataclass(frozen=True)
class KillWorker:
    node_id: NodeID
    actor_id: ActorID


@dataclass(frozen=True)
class Answer:
    peer: Caller
    info: m.ActorInfo


@dataclass(frozen=True)
class Record:
    """Write the actor's state as it was at this transition (a later one may follow
    before the shell carries this out)."""

    spec: m.ActorSpec
    state: ActorState
    node_id: NodeID
    address: str
    restarts: int
    error: str
    tcp_address: str = ""
    pid: int = 0

    @classmethod
    def of(cls, actor: Actor) -> Record:
        return cls(actor.spec, actor.state, actor.node_id, actor.address, actor.restarts,
                   actor.error, actor.tcp_address, actor.pid)


@dataclass(frozen=True)
class ClaimName:
    namespace: str
    name: str
    actor_id: ActorID


@dataclass(frozen=True)
class ReleaseName:
    namespace: str
    name: str
    actor_id: ActorID


Command = StartActor | KillWorker | Answer | Record | ClaimName | ReleaseName

OWNER_DIED = ("its owner (the process that created it) died; create it with "
              "lifetime='detached' to outlive its creator")


class ActorDirectory:
    """Every actor the head knows, by id, and the ones waiting for a node to fit."""

    def __init__(self, pick_node: Callable[[m.ActorSpec], NodeID | None],
                 node_alive: Callable[[NodeID], bool]) -> None:
        self.actors: dict[ActorID, Actor] = {}
        self.pending: list[ActorID] = []
        self.recovering = False  # placement waits until the recorded nodes are back
        self._pick_node = pick_node
        self._node_alive = node_alive

    # -- events ------------------------------------------------------------------------------

    def create(self, peer: Caller, req_id: int, spec: m.ActorSpec,
               get_if_exists: bool) -> list[Command]:
        """A driver or worker asked for a new actor (``req_id`` 0: it does not wait)."""
        known = self.actors.get(spec.actor_id)
        if known is not None:  # sent again across a head restart: it is its creator's
            known.owner, known.orphaned = peer, False
            return [Answer(peer, known.info(req_id))] if req_id else []
        if spec.name:
            existing = self.named(spec.namespace, spec.name)
            if existing is not None:
                return [Answer(peer, self._name_taken(req_id, spec, existing, get_if_exists))]
        actor = self.actors[spec.actor_id] = Actor(spec, owner=peer)
        commands: list[Command] = []
        if spec.name:
            commands.append(ClaimName(spec.namespace, spec.name, spec.actor_id))
        placed = self._place(actor)  # recorded with its node: a head that takes over
        commands.append(Record.of(actor))  # asks that node whether it started it
        if req_id:
            commands.append(Answer(peer, actor.info(req_id)))
        return commands + placed

    def started(self, actor_id: ActorID, node_id: NodeID, address: str, tcp_address: str,
                error: str, pid: int = 0) -> list[Command]:
        """The actor's worker ran its constructor on ``node_id`` (``error`` if it raised)."""
        actor = self.actors.get(actor_id)
        if actor is None:
            return []
        if actor.state is ActorState.DEAD:  # it died meanwhile: this worker must not serve
            return [KillWorker(node_id, actor_id)]
        if error:
            actor.no_restart = True
            actor.error = f"the actor's constructor failed: {error}"
            return self._kill(actor, actor.error)
        if actor.no_restart:  # killed while it was (re)starting: its worker came up anyway
            return self._kill(actor, actor.error or "it was killed while starting")
        actor.state, actor.address, actor.tcp_address = ActorState.ALIVE, address, tcp_address
        actor.pid = pid
        return [Record.of(actor), *self._answer(actor)]

    def worker_died(self, actor_id: ActorID, reason: str) -> list[Command]:
        """The actor's process exited (or its node died)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state is ActorState.DEAD:
            return []
        if actor.no_restart or not actor.restarts_left:
            return self._mark_dead(actor, actor.error or (
                f"its process died ({reason}) and max_restarts={actor.spec.max_restarts} "
                f"is used up"))
        actor.restarts += 1
        actor.state, actor.address, actor.node_id = ActorState.RESTARTING, "", NO_NODE
        placed = self._place(actor)
        return [Record.of(actor), *placed]

    def kill(self, actor_id: ActorID, no_restart: bool, reason: str) -> list[Command]:
        """``rtml.kill``, or its last handle went out of scope."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state is ActorState.DEAD:
            return []
        actor.no_restart = no_restart
        commands = self._release_name(actor) if no_restart else []
        return commands + self._kill(actor, reason or "it was killed with rtml.kill()")

    def group_removed(self, pg_hex: str) -> list[Command]:
        """A placement group was removed: the actors placed on its bundles end for good."""
        commands: list[Command] = []
        suffix = f"_{pg_hex}"
        for actor in list(self.actors.values()):
            if actor.state is not ActorState.DEAD and any(
                    name.endswith(suffix) for name in actor.spec.shape):
                commands += self.kill(actor.spec.actor_id, True,
                                      f"its placement group {pg_hex} was removed")
        return commands

    def exiting(self, peer: Caller, req_id: int, actor_id: ActorID) -> list[Command]:
        """The actor called exit_actor(): it ends when its process exits (worker_died),
        not restarted, its name free at once; answered so that it may exit."""
        actor = self.actors.get(actor_id)
        if actor is None:
            return [Answer(peer, m.ActorInfo(req_id, actor_id, "MISSING"))]
        commands: list[Command] = []
        if actor.state is not ActorState.DEAD:
            actor.no_restart = True
            actor.error = actor.error or "it exited: its code called exit_actor()"
            commands = self._release_name(actor)
        return [*commands, Answer(peer, actor.info(req_id))]

    def node_died(self, node_id: NodeID, reason: str) -> list[Command]:
        commands: list[Command] = []
        for actor in list(self.actors.values()):
            if actor.node_id == node_id and actor.state is not ActorState.DEAD:
                commands += self.worker_died(actor.spec.actor_id,
                                             f"its node {node_id.hex()} died: {reason}")
        return commands

    def job_ended(self, job_id: JobID, reason: str) -> list[Command]:
        """The job's driver left: its actors end, unless detached."""
        commands: list[Command] = []
        for actor in list(self.actors.values()):
            if actor.spec.job_id == job_id and not actor.spec.detached \
                    and actor.state is not ActorState.DEAD:
                commands += self._kill(actor, reason)
        return commands

    def owner_gone(self, peer: Caller) -> list[Command]:
        """The connection of a creator closed (its process ended): the actors it created
        end with it, unless detached (Ray's fate sharing with the owner), pending ones
        included."""
        commands: list[Command] = []
        for actor in list(self.actors.values()):
            if actor.owner is peer and not actor.spec.detached \
                    and actor.state is not ActorState.DEAD:
                actor.owner = None  # nobody left to tell
                commands += self.kill(actor.spec.actor_id, True, OWNER_DIED)
        return commands

    # -- recovery after a head restart ----------------------------------------------------

    def restore(self, spec: m.ActorSpec, state: ActorState, node_id: NodeID, address: str,
                tcp_address: str, restarts: int, error: str) -> None:
        """An actor as the control plane last recorded it. One (re)starting (PENDING,
        RESTARTING) waits for its node to say whether it hosts it, or to be declared
        dead."""
        actor = Actor(spec, owner=None, state=state, node_id=node_id, restarts=restarts,
                      error=error)
        if state is ActorState.ALIVE:
            actor.address, actor.tcp_address = address, tcp_address
        actor.orphaned = state is not ActorState.DEAD and not spec.detached
        actor.name_released = state is ActorState.DEAD
        self.actors[spec.actor_id] = actor

    def node_back(self, node_id: NodeID, hosted: list[m.HostedActor]) -> list[Command]:
        """A node re-registered, running (or starting) exactly ``hosted``."""
        commands: list[Command] = []
        here = set()
        for entry in hosted:
            actor_id = entry.spec.actor_id
            here.add(actor_id)
            actor = self.actors.get(actor_id)
            if actor is None:  # its records never reached the control plane
                actor = self.actors[actor_id] = Actor(entry.spec, owner=None)
                actor.orphaned = not entry.spec.detached
            if actor.state is ActorState.DEAD:
                commands.append(KillWorker(node_id, actor_id))
                continue
            actor.node_id = node_id
            if entry.address:
                commands += self.started(actor_id, node_id, entry.address, entry.tcp_address,
                                         "")
        for actor in list(self.actors.values()):
            if actor.node_id != node_id or actor.spec.actor_id in here:
                continue
            if actor.state is ActorState.ALIVE:
                commands += self.worker_died(actor.spec.actor_id,
                                             "its worker was gone when its node rejoined")
            elif actor.state is not ActorState.DEAD:  # its StartActor never arrived
                actor.node_id = NO_NODE
                commands += self._place(actor)
        return commands

    def nodes_back(self) -> list[Command]:
        """Every node recorded alive is back or dead: place what no node hosts."""
        self.recovering = False
        for actor in self.actors.values():
            if actor.state in (ActorState.PENDING, ActorState.RESTARTING) \
                    and not self._node_alive(actor.node_id) \
                    and actor.spec.actor_id not in self.pending:
                actor.node_id = NO_NODE
                self.pending.append(actor.spec.actor_id)
        return self.place_pending()

    def owners_gone(self) -> list[Command]:
        """The owners that were to reconnect did not: their actors end (fate sharing)."""
        commands: list[Command] = []
        for actor in list(self.actors.values()):
            if actor.orphaned:
                actor.orphaned = False
                commands += self.kill(actor.spec.actor_id, True, OWNER_DIED)
        return commands

    def lookup(self, peer: Caller, msg: m.GetActorInfo) -> list[Command]:
        """A caller asks for an actor by id or name; with ``wait_ready`` the answer waits
        until the actor is ALIVE at an address other than ``msg.stale_address``, or DEAD."""
        actor = (self.named(msg.namespace, msg.name) if msg.name
                 else self.actors.get(msg.actor_id))
        if actor is None:
            return [Answer(peer, m.ActorInfo(msg.req_id, msg.actor_id, "MISSING",
                                             error="no such actor"))]
        waiter = Waiter(peer, msg.req_id, msg.stale_address)
        if not msg.wait_ready or self._settled(actor, waiter):
            return [Answer(peer, actor.info(msg.req_id))]
        actor.waiters.append(waiter)
        return []

    def place_pending(self) -> list[Command]:
        """Try again to place the actors no node fitted (a node joined or freed room)."""
        pending, self.pending = self.pending, []
        commands: list[Command] = []
        for actor_id in pending:
            actor = self.actors.get(actor_id)
            if actor is not None and actor.state in (ActorState.PENDING, ActorState.RESTARTING):
                commands += self._place(actor)
        return commands

    # -- queries -----------------------------------------------------------------------------

    def named(self, namespace: str, name: str) -> Actor | None:
        """The live actor holding ``name`` (one killed for good holds it no longer)."""
        for actor in self.actors.values():
            if actor.spec.name == name and actor.spec.namespace == namespace \
                    and actor.state is not ActorState.DEAD and not actor.name_released:
                return actor
        return None

    def names(self, namespace: str | None) -> list[tuple[str, str]]:
        """(namespace, name) of each live named actor, in ``namespace`` (None: all)."""
        return sorted({(a.spec.namespace, a.spec.name) for a in self.actors.values()
                       if a.spec.name and a.state is not ActorState.DEAD
                       and not a.name_released
                       and (namespace is None or a.spec.namespace == namespace)})

    # -- transitions -------------------------------------------------------------------------

    def _place(self, actor: Actor) -> list[Command]:
        node_id = None if self.recovering else self._pick_node(actor.spec)
        if node_id is None:
            if actor.spec.actor_id not in self.pending:
                self.pending.append(actor.spec.actor_id)
            return []
        actor.node_id = node_id
        return [StartActor(node_id, actor.spec, actor.restarts)]

    def _kill(self, actor: Actor, why: str) -> list[Command]:
        if not actor.error:
            actor.error = why
        alive = bool(actor.node_id) and self._node_alive(actor.node_id)
        if actor.state is ActorState.PENDING or not alive:
            actor.no_restart = True
        if alive:  # its node reports the worker's exit, which ends it (worker_died)
            return [KillWorker(actor.node_id, actor.spec.actor_id)]
        return self._mark_dead(actor, why)

    def _mark_dead(self, actor: Actor, why: str) -> list[Command]:
        actor.state, actor.address = ActorState.DEAD, ""
        actor.error = actor.error or why
        spec = actor.spec
        commands = self._release_name(actor)
        commands += [Record.of(actor), *self._answer(actor)]
        if actor.owner is not None:  # unasked (req_id 0): it lets go of the arguments
            commands.append(Answer(actor.owner, actor.info(0)))
            actor.owner = None
        self.pending = [a for a in self.pending if a != spec.actor_id]
        return commands

    @staticmethod
    def _release_name(actor: Actor) -> list[Command]:
        spec = actor.spec
        if not spec.name or actor.name_released:
            return []
        actor.name_released = True
        return [ReleaseName(spec.namespace, spec.name, spec.actor_id)]

    def _answer(self, actor: Actor) -> list[Command]:
        waiters, actor.waiters = actor.waiters, []
        commands: list[Command] = []
        for waiter in waiters:
            if self._settled(actor, waiter):
                commands.append(Answer(waiter.peer, actor.info(waiter.req_id)))
            else:
                actor.waiters.append(waiter)
        return commands

    @staticmethod
    def _settled(actor: Actor, waiter: Waiter) -> bool:
        return actor.state is ActorState.DEAD or (
            actor.state is ActorState.ALIVE and actor.address != waiter.stale)

    @staticmethod
    def _name_taken(req_id: int, spec: m.ActorSpec, existing: Actor,
                    get_if_exists: bool) -> m.ActorInfo:
        if get_if_exists:
            return existing.info(req_id)
        return m.ActorInfo(req_id, spec.actor_id, "DEAD", error=(
            f"an actor named {spec.name!r} already exists in namespace {spec.namespace!r}; "
            f"pick another name, or pass get_if_exists=True to reuse it"))
