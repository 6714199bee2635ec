"""The state API's records (Ray's ``ray.util.state.common`` names) and how a listing is
cut: filters, ``detail``, ``limit``.

::

    rows (state objects with every column rtml has)
        -> filters: ("column", "=" | "!=", value), all must hold      (check_filters first)
        -> sorted by id, the first ``limit``
        -> detail=False: the detail columns set to None              -> list[...State]

Each state object is a dataclass read by attribute (``task.state``) or, as Ray's, by key
(``task["state"]``, ``task.get("state")``); ``asdict()`` gives a plain dict. A column is
*filterable* or not, and *detail* (filled only with ``detail=True`` and by ``get_*``) or
not, as the same column is in Ray. Columns Ray has and rtml does not record are left
out (see the package's docstring), so a filter on one fails saying which columns exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

DEFAULT_LIMIT = 100
"""Entries a ``list_*`` call returns unless told otherwise (Ray's ``DEFAULT_LIMIT``)."""
DEFAULT_RPC_TIMEOUT = 30
"""Ray's default ``timeout`` (seconds); rtml's reads have their own (see ``api``)."""
PREDICATES = ("=", "!=")
"""The filter predicates Ray's state API has."""

Filter = tuple[str, str, Any]
"""``(column, predicate, value)``; several filters must all hold."""


def _column(*, filterable: bool, detail: bool = False) -> Any:
    """A dataclass field with Ray's column metadata; a detail column defaults to None."""
    metadata = {"filterable": filterable, "detail": detail}
    if detail:
        return field(default=None, metadata=metadata)
    return field(metadata=metadata)


class StateSchema:
    """What every state object has: key access and Ray's column lists."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # each subclass is a dataclass

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def asdict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def list_columns(cls, detail: bool = True) -> list[str]:
        """The columns, in order; without ``detail``, only those listed by default."""
        return [f.name for f in dataclasses.fields(cls)
                if detail or not f.metadata.get("detail", False)]

    @classmethod
    def filterable_columns(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)
                if f.metadata.get("filterable", False)}

    @classmethod
    def detail_columns(cls) -> set[str]:
        """The columns filled only with ``detail=True`` (and by ``get_*``)."""
        return set(cls.list_columns()) - set(cls.list_columns(detail=False))


@dataclass
class TaskState(StateSchema):
    """One task or actor call: its latest attempt."""

    task_id: str = _column(filterable=True)
    attempt_number: int = _column(filterable=True)
    name: str = _column(filterable=True)
    state: str = _column(filterable=True)
    """PENDING_NODE_ASSIGNMENT, FINISHED or FAILED (see the package's docstring)."""
    job_id: str = _column(filterable=True)
    type: str = _column(filterable=True)
    """NORMAL_TASK or ACTOR_TASK."""
    func_or_class_name: str = _column(filterable=True)
    node_id: str | None = _column(filterable=True)
    """The node it ran on; None until its outcome is recorded."""
    worker_pid: int | None = _column(filterable=True)
    error_type: str | None = _column(filterable=True)
    language: str | None = _column(filterable=True, detail=True)
    creation_time_ms: int | None = _column(filterable=False, detail=True)
    start_time_ms: int | None = _column(filterable=False, detail=True)
    end_time_ms: int | None = _column(filterable=False, detail=True)
    error_message: str | None = _column(filterable=False, detail=True)


@dataclass
class ActorState(StateSchema):
    """One actor."""

    actor_id: str = _column(filterable=True)
    class_name: str = _column(filterable=True)
    state: str = _column(filterable=True)
    """PENDING_CREATION, ALIVE, RESTARTING or DEAD."""
    job_id: str = _column(filterable=True)
    name: str = _column(filterable=True)
    """"" for an actor made without a name."""
    node_id: str | None = _column(filterable=True)
    ray_namespace: str | None = _column(filterable=True)
    pid: int | None = _column(filterable=True)
    """Its worker process; None until it has started."""
    required_resources: dict[str, float] | None = _column(filterable=False, detail=True)
    death_cause: dict[str, Any] | None = _column(filterable=False, detail=True)
    is_detached: bool | None = _column(filterable=False, detail=True)
    num_restarts: int | None = _column(filterable=False, detail=True)


@dataclass
class ObjectState(StateSchema):
    """One object held in a node's shared-memory store (or spilled from it)."""

    object_id: str = _column(filterable=True)
    object_size: int = _column(filterable=True)
    """In bytes (Ray's column, despite its documentation's "mb", is bytes too)."""
    task_status: str = _column(filterable=True)
    reference_type: str = _column(filterable=True)
    call_site: str = _column(filterable=True)
    ip: str | None = _column(filterable=True)
    owner_id: str | None = _column(filterable=True, detail=True)
    """rtml's: the process (worker or driver id, hex) that owns it."""
    node_id: str | None = _column(filterable=True, detail=True)
    """rtml's: the node of its primary copy."""
    locations: dict[str, str] | None = _column(filterable=False, detail=True)
    """rtml's: node id -> its copy there, SEALED (in shared memory) or SPILLED (on disk)."""
    spilled: bool | None = _column(filterable=True, detail=True)
    """rtml's: whether its primary copy is on disk."""


@dataclass
class NodeState(StateSchema):
    """One node (its node manager), alive or dead."""

    node_id: str = _column(filterable=True)
    node_ip: str = _column(filterable=True)
    state: str = _column(filterable=True)
    """ALIVE or DEAD."""
    state_message: str | None = _column(filterable=False)
    node_name: str = _column(filterable=True)
    resources_total: dict[str, float] = _column(filterable=False)
    metrics_address: str = _column(filterable=False)
    """host:port of its node manager's /metrics ("": not served; rtml's, not Ray's)."""
    start_time_ms: int | None = _column(filterable=False, detail=True)
    end_time_ms: int | None = _column(filterable=False, detail=True)
    """0 while the node is alive (as Ray)."""


@dataclass
class DriverInfo(StateSchema):
    """The process that ran a job."""

    pid: str | None = _column(filterable=False)
    """As a string, as Ray's."""


@dataclass
class JobState(StateSchema):
    """One job: a driver's connection to the cluster."""

    job_id: str = _column(filterable=True)
    submission_id: str | None = _column(filterable=True)
    """None for a driver's own job, as Ray's (``rtml job submit``'s are listed apart)."""
    entrypoint: str = _column(filterable=False)
    type: str = _column(filterable=True)
    """DRIVER."""
    status: str = _column(filterable=True)
    """RUNNING, or SUCCEEDED once its driver has gone."""
    message: str | None = _column(filterable=False)
    error_type: str | None = _column(filterable=False)
    driver_info: DriverInfo | None = _column(filterable=False)
    start_time: int | None = _column(filterable=False, detail=True)
    """In ms since the epoch."""
    end_time: int | None = _column(filterable=False, detail=True)


S = TypeVar("S", bound=StateSchema)


def parse_filter(text: str) -> Filter:
    """``"state=FAILED"`` or ``"name!=probe"`` (the command line's and the dashboard's
    form) as a filter. Raises ValueError showing the form."""
    key, sep, value = text.partition("!=")
    predicate = "!="
    if not sep:
        key, sep, value = text.partition("=")
        predicate = "="
    if not sep or not key.strip():
        raise ValueError(f"a filter is KEY=VALUE or KEY!=VALUE (e.g. state=FAILED), "
                         f"got {text!r}")
    return key.strip(), predicate, value.strip()


def check_filters(filters: Sequence[Filter] | None, schema: type[StateSchema]) -> list[Filter]:
    """``filters`` as a list, each a valid ``(column, predicate, value)`` (column
    lowercased, as Ray's). Raises ValueError naming what is allowed."""
    checked = []
    for item in filters or []:
        if not isinstance(item, tuple | list) or len(item) != 3:
            raise ValueError(f"the filter {item!r} is not a (key, predicate, value) tuple; "
                             f"write e.g. (\"state\", \"=\", \"FAILED\")")
        key, predicate, value = item
        if predicate not in PREDICATES:
            raise ValueError(f"unsupported filter predicate {predicate!r} in {item!r}; the "
                             f"predicates are {', '.join(PREDICATES)}")
        column = str(key).lower()
        if column not in schema.filterable_columns():
            raise ValueError(f"the filter column {key!r} is not supported for "
                             f"{schema.__name__}; filter on one of "
                             f"{', '.join(sorted(schema.filterable_columns()))}")
        checked.append((column, predicate, value))
    return checked


def select(rows: Iterable[S], filters: list[Filter], key: str, limit: int,
           detail: bool) -> list[S]:
    """The rows every filter holds for, sorted by ``key``, the first ``limit``, their
    detail columns cleared unless ``detail`` (filters may read detail columns)."""
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    found = [row for row in rows if all(_holds(row, f) for f in filters)]
    found.sort(key=lambda row: str(getattr(row, key)))
    found = found[:limit]
    if detail or not found:
        return found
    cleared = dict.fromkeys(type(found[0]).detail_columns())
    return [dataclasses.replace(row, **cleared) for row in found]


def _holds(row: StateSchema, item: Filter) -> bool:
    column, predicate, wanted = item
    equal = _equal(getattr(row, column), wanted)
    return equal if predicate == "=" else not equal


def _equal(actual: Any, wanted: Any) -> bool:
    """Ray's comparison: strings case-insensitively; a string given for a number or a
    bool column read as one (``("worker_pid", "=", "1234")``)."""
    if actual is None or wanted is None:
        return actual is wanted
    if isinstance(actual, bool):
        if isinstance(wanted, str):
            return actual == (wanted.strip().lower() in ("true", "1"))
        return actual == bool(wanted)
    if isinstance(actual, int | float):
        try:
            return actual == float(wanted)
        except (TypeError, ValueError):
            return False
    return str(actual).lower() == str(wanted).lower()
