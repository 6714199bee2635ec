"""Placement groups, the client's side (Ray's ``ray.util.placement_group``): a group of
resource bundles the head reserves on nodes, for tasks and actors to run on.

    placement_group(bundles, strategy) --CreatePlacementGroup--> head (placed when the
        nodes have room: rtml.head.placement_groups) --> PlacementGroup at once
    pg.ready(): a zero-CPU task on bundle 0's resources: it runs (and its ref is ready)
        only once the group is reserved; pg.wait(timeout) waits on it
    .options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)): the task asks
        for bundle i's resources (rtml.scheduler.bundles.group_shape)
    remove_placement_group(pg) --RemovePlacementGroup--> head: resources freed, what runs
        on them stopped
"""

from __future__ import annotations

from typing import Any

from rtml.core import context
from rtml.core.current import require_runtime
from rtml.core.object_ref import ObjectRef
from rtml.core.options import PlacementGroupSchedulingStrategy
from rtml.core.remote_function import RemoteFunction
from rtml.core.runtime import ClientRuntime
from rtml.ids import NO_GROUP, PlacementGroupID, new_placement_group_id
from rtml.rpc import messages as m
from rtml.scheduler.bundles import STRATEGIES, check_bundles, group_of


class PlacementGroup:
    """A handle to a placement group: picklable, usable in any process of the job."""

    def __init__(self, pg_id: PlacementGroupID, bundles: list[dict[str, float]] | None) -> None:
        self.id = pg_id
        self._bundles = bundles  # None: not known here yet (asked of the head when read)

    @property
    def bundle_specs(self) -> list[dict[str, float]]:
        if self._bundles is None:
            self._bundles = info(require_runtime(), self.id).bundles
        return self._bundles

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self) -> ObjectRef:
        """A ref that is ready once the group's bundles are reserved."""
        return _READY.options(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
            self, 0)).remote()

    def wait(self, timeout_seconds: float | None = 30) -> bool:
        """Whether the group is reserved within ``timeout_seconds`` (None: wait on)."""
        ref = self.ready()
        return bool(require_runtime().wait([ref], {ref.id}, 1, timeout_seconds, True))

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlacementGroup, (self.id, self._bundles))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id.hex()})"


def _reserved() -> bool:
    return True


_READY = RemoteFunction(_reserved, {"max_retries": -1})


def create(rt: ClientRuntime, bundles: Any, strategy: str, name: str, lifetime: str | None
           ) -> PlacementGroup:
    """Ask the head for a group; raises ValueError for bad bundles, strategy or
    lifetime."""
    bad = check_bundles(bundles)
    if bad:
        raise ValueError(f"placement_group(): {bad}")
    if strategy not in STRATEGIES:
        raise ValueError(f"placement_group() strategy must be one of {list(STRATEGIES)}, "
                         f"got {strategy!r}")
    if lifetime not in (None, "detached"):
        raise ValueError(f"placement_group() lifetime must be None or 'detached', got "
                         f"{lifetime!r}")
    if not isinstance(name, str):
        raise TypeError(f"placement_group() name must be a str, got {name!r}")
    shapes = [{k: float(v) for k, v in bundle.items()} for bundle in bundles]
    pg_id = new_placement_group_id()
    rt.head.send(m.CreatePlacementGroup(pg_id, shapes, strategy, name, rt.config.namespace,
                                        rt.job_id or context.current_job(), lifetime == "detached"))
    return PlacementGroup(pg_id, shapes)


def info(rt: ClientRuntime, pg_id: PlacementGroupID = NO_GROUP, name: str = ""
         ) -> m.PlacementGroupInfo:
    reply: m.PlacementGroupInfo = rt.links.request(rt.head, lambda req_id: m.GetPlacementGroup(
        req_id, pg_id, name, rt.config.namespace, rt.job_id or context.current_job()),
        rt.head.timeout)
    return reply


def remove(rt: ClientRuntime, group: PlacementGroup) -> None:
    if not isinstance(group, PlacementGroup):
        raise TypeError(f"remove_placement_group() takes a PlacementGroup, got {group!r}")
    rt.head.send(m.RemovePlacementGroup(group.id))


def current() -> PlacementGroup | None:
    """The group the running task, or this actor, runs in, if any."""
    spec, actor = context.current_spec(), context.current_actor()
    resources = spec.resources if spec is not None and spec.resources else (
        actor.spec.shape if actor is not None else None)
    pg_hex = group_of(resources) if resources else ""
    return PlacementGroup(PlacementGroupID(bytes.fromhex(pg_hex)), None) if pg_hex else None
