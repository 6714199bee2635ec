"""The tree's layout rules (docs/DESIGN.md, "Layers"), read from the source's imports.

- Each part of rtml (a package, or a top-level module) imports only parts on lower
  layers: no upward import, and so no cycle between parts.
- Another part imports a package only through its face: the names and modules its
  ``__init__.py`` lists in ``__all__``.
- No import cycle between modules, type-only imports included.

Every import counts, also one inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "rtml"

LAYERS: list[set[str]] = [
    {"ids"},
    {"_native", "config", "exceptions"},
    {"daemon", "metrics"},
    {"rpc", "control_plane"},
    {"scheduler", "objectstore", "session", "state", "logs"},
    {"cluster"},
    {"core"},
    {"driver"},
    {"api"},
    {"util", "dag", "actor", "experimental", "job_config", "job_submission", "debug"},
    {"__init__"},
    {"head", "node", "worker", "cli", "launchpad", "testing", "dashboard"},
]
LAYER_OF = {part: n for n, parts in enumerate(LAYERS) for part in parts}
PACKAGES = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}

def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """``rtml.core.runtime`` -> ``core``; ``rtml.api`` -> ``api``; ``rtml`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def sources() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        if "protos" not in path.parts:  # generated
            yield module_name(path), path


def imports(path: Path) -> Iterator[str]:
    """Every rtml module or name ``path`` imports, as a dotted name."""
    return imports_of(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_of(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every rtml module or name ``source`` (module ``module``) imports, relative imports
    resolved."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "rtml")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[:len(package) - node.level + 1]
                base = ".".join(up + [base] if base else up)
            if base.split(".")[0] == "rtml":
                yield from (f"{base}.{a.name}" for a in node.names)


def face(package: str) -> set[str]:
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_every_part_has_a_layer() -> None:
    parts = {part_of(module) for module, _ in sources()}
    assert parts == set(LAYER_OF), "place each new package or module in LAYERS"


def violations(module: str, targets: Iterator[str] | list[str]) -> list[str]:
    """What ``module`` breaks by importing ``targets``: an upward import, a private one."""
    mine = part_of(module)
    wrong = []
    for target in targets:
        theirs = part_of(target)
        if theirs == mine or target == "rtml._native":
            continue
        if LAYER_OF[theirs] >= LAYER_OF[mine]:
            wrong.append(f"{target} (layer {LAYER_OF[theirs]}) from layer {LAYER_OF[mine]}")
        parts = target.split(".")
        if theirs in PACKAGES and len(parts) > 2 and parts[2] not in face(theirs):
            wrong.append(f"{target}: rtml.{theirs}.{parts[2]} is not in rtml.{theirs}.__all__")
    return wrong


@pytest.mark.parametrize("module,path", list(sources()), ids=lambda v: str(v))
def test_imports_go_down_the_layers_through_faces(module: str, path: Path) -> None:
    wrong = violations(module, imports(path))
    assert not wrong, f"{module} imports " + "; ".join(wrong)


def module_graph() -> dict[str, set[str]]:
    known = {module for module, _ in sources()}
    graph: dict[str, set[str]] = {}
    for module, path in sources():
        edges = graph.setdefault(module, set())
        for target in imports(path):
            while target not in known and "." in target:  # a name: its module
                target = target.rpartition(".")[0]
            if target != module and target in known:
                edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_modules() -> None:
    # Type-only imports count: the client runtime's parts are given what they use (links,
    # store, TaskEvents), so none of them names the runtime, which imports them all.
    assert cycles(module_graph()) == []


def test_the_rules_catch_what_they_are_for() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert set(imports_of("from .. import api\nfrom . import local\nfrom .resources import fits\n",
                          "rtml.scheduler.probe", False)) == {
        "rtml.api", "rtml.scheduler.local", "rtml.scheduler.resources.fits"}
    assert set(imports_of("from . import store\n", "rtml.objectstore", True)) == {
        "rtml.objectstore.store"}
    (upward,) = violations("rtml.scheduler.placement", ["rtml.api.get"])
    assert "from layer 4" in upward
    (private,) = violations("rtml.node.objects", ["rtml.objectstore.transfer_stream.Server"])
    assert "transfer_stream is not in rtml.objectstore.__all__" in private
    assert violations("rtml.node.objects", ["rtml.objectstore.store.StoreCore",
                                            "rtml.scheduler.local.Grant"]) == []
    assert LAYER_OF["rpc"] < LAYER_OF["core"] < LAYER_OF["api"] < LAYER_OF["worker"]
