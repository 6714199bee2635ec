"""Validation of ``.options(...)`` for tasks and actors, with messages that say the fix."""

from __future__ import annotations

import inspect
from typing import Any, Final

from rtml.core import runtime_env
from rtml.rpc.messages import STREAMING
from rtml.scheduler.bundles import group_shape
from rtml.scheduler.resources import Shape, bad_amount
from rtml.scheduler.strategy import DEFAULT, SPREAD, affinity

GROUP_OPTIONS = {"placement_group", "placement_group_bundle_index",
                 "placement_group_capture_child_tasks"}
"""Ray's older way to put a task or actor in a placement group."""
TASK_OPTIONS = {"num_cpus", "num_gpus", "memory", "resources", "num_returns", "max_retries",
                "retry_exceptions", "name", "scheduling_strategy", "runtime_env",
                "max_calls", *GROUP_OPTIONS}
ACTOR_OPTIONS = {"num_cpus", "num_gpus", "memory", "resources", "name", "namespace",
                 "lifetime", "get_if_exists", "max_restarts", "max_task_retries",
                 "max_concurrency", "scheduling_strategy", "runtime_env", "concurrency_groups",
                 *GROUP_OPTIONS}
METHOD_OPTIONS = {"num_returns", "name", "max_task_retries", "retry_exceptions",
                  "concurrency_group"}


class NodeAffinitySchedulingStrategy:
    """Run on ``node_id`` (hex); if ``soft``, anywhere when that node cannot."""

    def __init__(self, node_id: str, soft: bool = False) -> None:
        try:
            bytes.fromhex(node_id)
        except (TypeError, ValueError):
            raise ValueError(f"NodeAffinitySchedulingStrategy needs a node id in hex (from "
                             f"rtml.nodes() or get_runtime_context().get_node_id()), got "
                             f"{node_id!r}") from None
        self.node_id = node_id
        self.soft = soft

    def __repr__(self) -> str:
        return f"NodeAffinitySchedulingStrategy({self.node_id!r}, soft={self.soft})"


class PlacementGroupSchedulingStrategy:
    """Run in bundle ``placement_group_bundle_index`` (-1: any) of ``placement_group``
    (``rtml.util.placement_group``), on the resources the group reserved."""

    def __init__(self, placement_group: Any, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None) -> None:
        count = getattr(placement_group, "bundle_count", 0 if placement_group is None else None)
        if not isinstance(count, int) or not (placement_group is None
                                              or hasattr(placement_group, "id")):
            raise TypeError(f"PlacementGroupSchedulingStrategy needs a placement group (from "
                            f"rtml.util.placement_group(...)), got {placement_group!r}")
        index = placement_group_bundle_index  # (no group, None: not in one, as Ray's)
        if isinstance(index, bool) or not isinstance(index, int) or not -1 <= index < max(
                count, 0):
            raise ValueError(f"placement_group_bundle_index must be -1 (any bundle) or "
                             f"0..{count - 1}, got {index!r}")
        self.placement_group = placement_group
        self.placement_group_bundle_index = index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks

    def __repr__(self) -> str:
        return (f"PlacementGroupSchedulingStrategy({self.placement_group!r}, "
                f"{self.placement_group_bundle_index})")


def in_group(options: dict[str, Any], shape: Shape, captured: str = "") -> Shape:
    """``shape`` moved onto the placement group bundle the options name, if they name
    one (``scheduling_strategy`` or Ray's ``placement_group=`` options), else into
    ``captured``, the group of a parent that captures its children (any bundle)."""
    strategy = group_strategy(options)
    if strategy is None:
        return group_shape(shape, captured, -1) if captured and not _placed(options) \
            else shape
    if strategy.placement_group is None:
        return shape
    return group_shape(shape, strategy.placement_group.id.hex(),
                       strategy.placement_group_bundle_index)


def group_strategy(options: dict[str, Any]) -> PlacementGroupSchedulingStrategy | None:
    """The placement group the options put a task or actor in, if any."""
    strategy = options.get("scheduling_strategy")
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        return strategy
    group = options.get("placement_group")
    if group is None or group == "default":
        return None
    return PlacementGroupSchedulingStrategy(
        group, options.get("placement_group_bundle_index", -1),
        options.get("placement_group_capture_child_tasks"))


def capture_of(options: dict[str, Any]) -> str:
    """The group (hex) a task or actor of these options captures its children into."""
    strategy = group_strategy(options)
    if strategy is None or strategy.placement_group is None \
            or not strategy.placement_group_capture_child_tasks:
        return ""
    return str(strategy.placement_group.id.hex())


def _placed(options: dict[str, Any]) -> bool:
    """Whether the options say where to run (then a captured parent's group is not
    used: as Ray, an explicit strategy wins)."""
    return options.get("scheduling_strategy") is not None or "placement_group" in options


def strategy_of(options: dict[str, Any]) -> str:
    """The wire form of ``scheduling_strategy`` (``rtml.scheduler.strategy``)."""
    strategy = options.get("scheduling_strategy")
    if isinstance(strategy, NodeAffinitySchedulingStrategy):
        return affinity(strategy.node_id, strategy.soft)
    return SPREAD if strategy == SPREAD else DEFAULT


def check_options(options: dict[str, Any], allowed: set[str], what: str) -> dict[str, Any]:
    """Reject unknown or ill-typed options. Raises ValueError or TypeError."""
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for {what}; "
                         f"valid options are {sorted(allowed)}")
    for name in ("num_cpus", "num_gpus", "memory"):
        value = options.get(name)
        if value is not None and bad_amount({name: value}):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    num_returns = options.get("num_returns")
    if num_returns is not None and num_returns not in ("streaming", "dynamic") and (
            not isinstance(num_returns, int) or num_returns < 0):
        raise ValueError(f"num_returns must be an int >= 0, 'streaming' or 'dynamic', got "
                         f"{num_returns!r}")
    retries = options.get("max_retries")
    if retries is not None and (not isinstance(retries, int) or retries < -1):
        raise ValueError(f"max_retries must be an int >= -1 (-1: forever), got {retries!r}")
    for text in ("name", "concurrency_group"):
        given = options.get(text)
        if given is not None and not isinstance(given, str):
            raise TypeError(f"{text} must be a str, got {given!r}")
    _check_resources(options.get("resources"))
    for name, least in (("max_restarts", -1), ("max_task_retries", -1),
                        ("max_concurrency", 1), ("max_calls", 0)):
        value = options.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < least):
            raise ValueError(f"{name} must be an int >= {least}"
                             f"{' (-1: forever)' if least < 0 else ''}, got {value!r}")
    _check_retry_exceptions(options.get("retry_exceptions"))
    _check_concurrency_groups(options.get("concurrency_groups"))
    namespace = options.get("namespace")
    if namespace is not None:
        check_namespace(namespace)
    if options.get("get_if_exists") and not options.get("name"):
        raise ValueError("get_if_exists=True needs a name: get_if_exists finds an existing "
                         "actor by name, so pass name=... as well")
    strategy = options.get("scheduling_strategy")
    if strategy is not None and strategy not in ("DEFAULT", "SPREAD") and not isinstance(
            strategy, NodeAffinitySchedulingStrategy | PlacementGroupSchedulingStrategy):
        raise ValueError(f"scheduling_strategy must be 'DEFAULT', 'SPREAD', a "
                         f"NodeAffinitySchedulingStrategy or a "
                         f"PlacementGroupSchedulingStrategy, got {strategy!r}")
    group = options.get("placement_group")
    if group is not None and group != "default":
        PlacementGroupSchedulingStrategy(group, options.get("placement_group_bundle_index",
                                                            -1))  # checks both
    lifetime = options.get("lifetime")
    if lifetime not in (None, "detached", "non_detached"):
        raise ValueError(f"lifetime must be 'detached' or None, got {lifetime!r}")
    runtime_env.check(options.get("runtime_env"))
    return options


def check_namespace(namespace: Any) -> str:
    """A namespace given to ``init`` or ``.options``: a non-empty str. Raises TypeError
    or ValueError."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {namespace!r}")
    if not namespace:
        raise ValueError("namespace must not be empty; leave it out (None) for the job's "
                         "own anonymous namespace")
    return namespace


def check_timeout(name: str, seconds: Any) -> float:
    """A timeout in seconds: a positive number. Raises TypeError or ValueError."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {seconds!r}")
    if not seconds > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {seconds!r}")
    return float(seconds)


def _check_resources(resources: Any) -> None:
    if resources is None:
        return
    if not isinstance(resources, dict):
        raise TypeError(f"resources must be a dict of name -> amount, got {resources!r}")
    for name in resources:
        if not isinstance(name, str):
            raise TypeError(f"resource names must be str, got {name!r}")
        if name in ("CPU", "GPU"):
            raise ValueError(f"use num_{name.lower()}=... for {name}, not resources="
                             f"{{{name!r}: ...}}")
    bad = bad_amount(resources)
    if bad:
        raise ValueError(bad)


def _check_concurrency_groups(groups: Any) -> None:
    if groups is None:
        return
    if not isinstance(groups, dict) or not all(
            isinstance(name, str) and name and isinstance(size, int)
            and not isinstance(size, bool) and size >= 1 for name, size in groups.items()):
        raise ValueError(f"concurrency_groups must be a dict of group name -> calls at once "
                         f"(an int >= 1), e.g. {{'io': 2, 'compute': 4}}; got {groups!r}")


def _check_retry_exceptions(retry: Any) -> None:
    if retry is None or isinstance(retry, bool):
        return
    if isinstance(retry, (list, tuple)) and all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in retry):
        return
    raise TypeError(f"retry_exceptions must be a bool or a list of exception classes, got "
                    f"{retry!r}")


DYNAMIC: Final = -2
"""``num_returns="dynamic"`` to the submitting side: a generator task (``STREAMING`` to
its worker) whose one ref's value is the refs of all its items, once it has ended."""


def returns_of(num_returns: int | str) -> int:
    """``num_returns`` as the submitting side counts it ("streaming": ``STREAMING``,
    "dynamic": ``DYNAMIC``)."""
    if num_returns == "streaming":
        return STREAMING
    return DYNAMIC if num_returns == "dynamic" else int(num_returns)


def default_returns(function: Any) -> int | str:
    """A function's ``num_returns`` when none is given: a generator's items stream, as
    in Ray; anything else has one return."""
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        return "streaming"
    return 1
