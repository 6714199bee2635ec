"""The head's placement groups: a pure core (events in, commands out), as the actor
directory is.

    CreatePlacementGroup --> PENDING --place(bundles, strategy, nodes' room)-->
        PrepareBundles to each chosen node --BundlesPrepared(ok) from all--> CommitBundles
        to each: CREATED (its tasks and actors are placed on its bundles' resources)
        a node says no (its room was taken meanwhile): ReleaseBundles to the others,
        PENDING again, tried at the next heartbeat
    RemovePlacementGroup, or its job ends (not detached) --> ReleaseBundles: REMOVED (the
        node managers stop what runs on its bundles; its actors are killed for good)
    a node of a CREATED group dies --> the group is placed again (RESCHEDULING), whole
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from rtml.ids import JobID, NodeID, PlacementGroupID
from rtml.rpc import messages as m
from rtml.scheduler.bundles import place
from rtml.scheduler.resources import Shape


class GroupState(Enum):
    PENDING = "PENDING"
    CREATED = "CREATED"
    REMOVED = "REMOVED"
    RESCHEDULING = "RESCHEDULING"


@dataclass
class Group:
    spec: m.CreatePlacementGroup
    state: GroupState = GroupState.PENDING
    nodes: list[NodeID] = field(default_factory=list)  # a node per bundle, once chosen
    waiting: set[NodeID] = field(default_factory=set)  # nodes still to answer a prepare
    refused: bool = False  # a node answered no: released once all have answered
    round: int = 0  # placements tried: an answer to an earlier one is stale
    held_by: set[NodeID] = field(default_factory=set)  # nodes that said, on rejoining a
    # head that took over, they hold its bundles (where it was placed may not be known)

    def info(self, req_id: int) -> m.PlacementGroupInfo:
        spec = self.spec
        return m.PlacementGroupInfo(req_id, spec.pg_id, self.state.value, spec.bundles,
                                    spec.strategy, spec.name, list(self.nodes))


@dataclass(frozen=True)
class Send:
    """A message for the node manager of ``node_id``."""
    node_id: NodeID
    msg: m.Msg


@dataclass(frozen=True)
class KillGroupActors:
    """The group is gone: the actors placed on its bundles end for good."""
    pg_hex: str


@dataclass(frozen=True)
class Save:
    """Record the group as it is now (a head that takes over restores it), or forget it
    once removed."""
    group: Group


Command = Send | KillGroupActors | Save


@dataclass
class PlacementGroups:
    groups: dict[PlacementGroupID, Group] = field(default_factory=dict)
    forgotten: set[PlacementGroupID] = field(default_factory=set)  # held by nodes, never recorded

    def create(self, spec: m.CreatePlacementGroup, room: dict[NodeID, Shape]) -> list[Command]:
        """A new group; ``room``: each live node's available resources (the head's view,
        from which what is chosen is taken)."""
        if spec.pg_id in self.groups:
            return []
        group = self.groups[spec.pg_id] = Group(spec)
        return [Save(group), *self._place(group, room)]

    def place_pending(self, room: dict[NodeID, Shape]) -> list[Command]:
        """Nodes' room changed: try the groups still waiting."""
        commands: list[Command] = []
        for group in self.groups.values():
            if group.state in (GroupState.PENDING, GroupState.RESCHEDULING) \
                    and not group.waiting:
                commands += self._place(group, room)
        return commands

    def prepared(self, pg_id: PlacementGroupID, node_id: NodeID, ok: bool, round: int | None = None
                 ) -> list[Command]:
        """A node answered a prepare (of placement ``round``; None: the current one)."""
        group = self.groups.get(pg_id)
        if group is None or node_id not in group.waiting or (
                round is not None and round != group.round):
            return []
        group.waiting.discard(node_id)
        group.refused |= not ok
        if group.waiting:
            return []
        chosen = sorted(set(group.nodes))
        if group.state is GroupState.REMOVED or group.refused:
            if group.state is not GroupState.REMOVED:
                group.nodes, group.refused = [], False  # to be tried again
            return [Send(n, m.ReleaseBundles(pg_id)) for n in chosen]
        group.state = GroupState.CREATED
        commits: list[Command] = [Send(n, m.CommitBundles(pg_id)) for n in chosen]
        return [*commits, Save(group)]

    def remove(self, pg_id: PlacementGroupID) -> list[Command]:
        group = self.groups.get(pg_id)
        if group is None or group.state is GroupState.REMOVED:
            return []
        group.state = GroupState.REMOVED
        commands: list[Command] = [KillGroupActors(pg_id.hex()), Save(group)]
        holders = group.held_by if group.waiting else group.held_by | set(group.nodes)
        # (those still preparing are released once they answer)
        return commands + [Send(n, m.ReleaseBundles(pg_id)) for n in sorted(holders)]

    def job_ended(self, job_id: JobID) -> list[Command]:
        commands: list[Command] = []
        for pg_id, group in list(self.groups.items()):
            if group.spec.job_id == job_id and not group.spec.detached:
                commands += self.remove(pg_id)
        return commands

    def node_died(self, node_id: NodeID, room: dict[NodeID, Shape]) -> list[Command]:
        """Groups with a bundle there are placed again, whole (their other bundles are
        given back first)."""
        commands: list[Command] = []
        for pg_id, group in self.groups.items():
            if group.state is GroupState.REMOVED:  # a prepare it waited for never comes
                if node_id in group.waiting:
                    commands += self.prepared(pg_id, node_id, False)
                continue
            if node_id in group.nodes:
                group.waiting.discard(node_id)
                others = sorted(set(group.nodes) - {node_id})
                commands += [Send(n, m.ReleaseBundles(pg_id)) for n in others]
                group.state, group.nodes, group.waiting = GroupState.RESCHEDULING, [], set()
                commands.append(Save(group))
                commands += self._place(group, {n: r for n, r in room.items()
                                                if n != node_id})
        return commands

    def restore(self, spec: m.CreatePlacementGroup, state: GroupState,
                nodes: list[NodeID]) -> None:
        """A group a predecessor head recorded: a created one keeps its bundles (its nodes
        kept them), one still being placed is placed again."""
        created = state is GroupState.CREATED
        self.groups[spec.pg_id] = Group(spec, state if created else GroupState.PENDING,
                                        nodes if created else [])

    def node_back(self, node_id: NodeID, held: list[PlacementGroupID]) -> list[Command]:
        """A node that rejoined a head that took over holds bundles of ``held``: those of
        groups removed meanwhile (the release could not reach it) and of groups with no
        record here (not written before the last head died; taken as removed, so nothing
        waits on them) are released; the others' are noted, for their removal."""
        commands: list[Command] = []
        for pg_id in held:
            group = self.groups.get(pg_id)
            if group is None:
                self.forgotten.add(pg_id)
            if group is None or group.state is GroupState.REMOVED:
                commands.append(Send(node_id, m.ReleaseBundles(pg_id)))
            else:
                group.held_by.add(node_id)
        return commands

    def lookup(self, req_id: int, pg_id: PlacementGroupID, name: str, namespace: str
               ) -> m.PlacementGroupInfo:
        group = self.groups.get(pg_id) if pg_id else self._named(name, namespace)
        if group is None:
            return m.PlacementGroupInfo(req_id, pg_id, "MISSING")
        return group.info(req_id)

    def removed(self, pg_hex: str) -> bool:
        pg_id = PlacementGroupID(bytes.fromhex(pg_hex))
        group = self.groups.get(pg_id)
        return (group is not None and group.state is GroupState.REMOVED) \
            or pg_id in self.forgotten

    def _named(self, name: str, namespace: str) -> Group | None:
        for group in self.groups.values():
            if group.spec.name == name and group.spec.namespace == namespace \
                    and group.state is not GroupState.REMOVED:
                return group
        return None

    def _place(self, group: Group, room: dict[NodeID, Shape]) -> list[Command]:
        spec = group.spec
        nodes = place(spec.bundles, spec.strategy, room)
        if nodes is None:
            return []
        group.nodes = nodes
        group.waiting = set(nodes)
        group.round += 1
        for node_id, bundle in zip(nodes, spec.bundles, strict=True):
            _take(room, node_id, bundle)  # until the nodes' heartbeats tell the truth
        per_node: dict[NodeID, list[tuple[int, dict[str, float]]]] = {}
        for index, (node_id, bundle) in enumerate(zip(nodes, spec.bundles, strict=True)):
            per_node.setdefault(node_id, []).append((index, bundle))
        return [Send(n, m.PrepareBundles(spec.pg_id, bundles, group.round))
                for n, bundles in sorted(per_node.items())]


def _take(room: dict[NodeID, Shape], node_id: NodeID, bundle: Shape) -> None:
    available = room.get(node_id)
    if available is not None:
        for name, amount in bundle.items():
            available[name] = available.get(name, 0.0) - amount
