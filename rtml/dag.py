"""Lazy task graphs, as Ray's ``ray.dag``: ``f.bind(...)``, ``Cls.bind(...)`` and
``node.method.bind(...)`` record calls; ``dag.execute(...)`` submits the whole graph.

    with InputNode() as inp:
        dag = add.bind(double.bind(inp[0]), inp.y)
    rtml.get(dag.execute(3, y=4))  # 10
"""

from rtml.core.dag import (
    ClassMethodNode,
    ClassNode,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)

__all__ = ["ClassMethodNode", "ClassNode", "DAGNode", "FunctionNode", "InputAttributeNode",
           "InputNode", "MultiOutputNode"]
