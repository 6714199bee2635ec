"""What a distributed program is: nodes in labelled groups, joined by handles.

How it runs is the launcher's business (``rtml.launchpad.launch``); the same
program runs unchanged as threads, processes or rtml actors.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from rtml.launchpad.nodes import Handle, Node


class Program:
    """A Launchpad program: ``add_node`` returns the handle other nodes use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._groups: dict[str, list[Node]] = {}
        self._current_group: str | None = None

    def add_node(self, node: Node, label: str | None = None) -> Handle:
        """Add ``node`` (to the current group, or to group ``label``); return its handle.

        Raises ValueError if the node is already in a program, if ``label`` is
        missing outside a group or differs from the current group's.
        """
        if node.program is not None:
            raise ValueError(f"{node.description} is already in program "
                             f"{node.program.name!r}; a node belongs to one program: "
                             f"make a new node for {self.name!r}")
        if self._current_group is not None:
            if label and label != self._current_group:
                raise ValueError(f"add_node(label={label!r}) inside program.group("
                                 f"{self._current_group!r}): the labels must match")
            label = self._current_group
        elif not label:
            raise ValueError(f"add_node of {node.description} needs a label (or call it "
                             f"inside `with program.group(label):`)")
        group = self._groups.setdefault(label, [])
        node.program, node.label, node.index = self, label, len(group)
        for j, inner in enumerate(node.served_nodes()[1:]):
            inner.program, inner.label, inner.index = self, label, f"{node.index}.{j}"
        group.append(node)
        return node.create_handle()

    @contextlib.contextmanager
    def group(self, label: str) -> Iterator[None]:
        """Nodes added inside share ``label``. Groups do not nest (ValueError)."""
        if not label:
            raise ValueError("program.group() needs a non-empty label")
        if self._current_group is not None:
            raise ValueError(f"program.group({label!r}) inside program.group("
                             f"{self._current_group!r}): groups cannot be nested")
        self._current_group = label
        try:
            yield
        finally:
            self._current_group = None

    @property
    def groups(self) -> dict[str, list[Node]]:
        return self._groups

    def get_all_nodes(self) -> list[Node]:
        return list(itertools.chain.from_iterable(self._groups.values()))


def make_program(*nodes: Node, name: str = "launchpad") -> Program:
    """A program of ``nodes``, each in a group named after its position."""
    program = Program(name)
    for i, node in enumerate(nodes):
        program.add_node(node, label=f"node{i}")
    return program
