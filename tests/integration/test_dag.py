"""Lazy DAGs (``rtml.dag``, as Ray's ``ray.dag``) on an embedded 2-CPU node: ``.bind``,
InputNode, MultiOutputNode, actors in a graph, options, nesting, and the errors."""

from __future__ import annotations

import types
import uuid

import pytest

import rtml
from rtml.dag import (
    ClassMethodNode,
    ClassNode,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)
from rtml.exceptions import TaskError

pytestmark = pytest.mark.usefixtures("cluster")


@rtml.remote
def add(a: int, b: int = 0) -> int:
    return a + b


@rtml.remote
def double(x: int) -> int:
    return 2 * x


@rtml.remote
def pair(x: int) -> tuple[int, int]:
    return x, -x


@rtml.remote
def record(tally: rtml.ActorHandle, x: int) -> int:
    """``x``, once it has counted its run in ``tally``."""
    rtml.get(tally.incr.remote())
    return x


@rtml.remote
def look_inside(items: list, table: dict) -> tuple[list[bool], list[int], int]:
    return ([isinstance(i, rtml.ObjectRef) for i in items], rtml.get(list(items)),
            rtml.get(table["k"]))


@rtml.remote
def read_actor(counter: rtml.ActorHandle, after: object = None) -> int:
    """The counter's value, read by a call of its own (``after`` the driver's calls: calls
    from two callers are not ordered with each other)."""
    return rtml.get(counter.get.remote())


@rtml.remote
def fails(x: int) -> int:
    raise ValueError(f"bad input {x}")


@rtml.remote
class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    def get(self) -> int:
        return self.value

    def pair(self) -> tuple[int, int]:
        return self.value, -self.value


def test_a_chain_runs_in_order_and_a_long_one_does_not_recurse() -> None:
    dag = add.bind(double.bind(add.bind(1, 2)), 10)
    assert isinstance(dag, FunctionNode) and isinstance(dag, DAGNode)
    assert rtml.get(dag.execute()) == 16
    node = add.bind(0, 1)
    for _ in range(1500):  # deeper than the recursion limit
        node = add.bind(node, 1)
    assert rtml.get(node.execute()) == 1501


def test_a_node_used_twice_runs_once_per_execute() -> None:
    tally = Counter.remote()
    with InputNode() as inp:
        shared = record.bind(tally, inp)
        dag = add.bind(double.bind(shared), add.bind(shared, 10))  # a diamond
    assert rtml.get(dag.execute(3)) == 6 + 13
    assert rtml.get(tally.get.remote()) == 1
    assert rtml.get(dag.execute(5)) == 10 + 15
    assert rtml.get(tally.get.remote()) == 2
    hit = tally.incr.bind()  # a call of an existing actor, used twice
    assert isinstance(hit, ClassMethodNode)
    first, second = rtml.get(MultiOutputNode([hit, add.bind(hit, 0)]).execute())
    assert first == second == 3
    assert rtml.get(tally.get.remote()) == 3


def test_input_node_gives_the_one_value_or_its_parts() -> None:
    with InputNode() as inp:
        dag = double.bind(inp)
    assert rtml.get(dag.execute(21)) == 42
    with InputNode() as inp:
        by_key = add.bind(inp["a"], inp["b"])
        by_attribute = add.bind(inp.x, inp.y)
    assert isinstance(inp["a"], InputAttributeNode) and inp["a"] is inp["a"]
    assert rtml.get(by_key.execute({"a": 1, "b": 2})) == 3
    assert rtml.get(by_attribute.execute(types.SimpleNamespace(x=4, y=5))) == 9


def test_input_node_with_several_arguments_and_keywords() -> None:
    with InputNode() as inp:
        dag = MultiOutputNode([add.bind(inp[0], inp[1]), double.bind(inp.y),
                               add.bind(inp["y"], inp[-1])])
    assert rtml.get(dag.execute(1, 2, y=30)) == [3, 60, 32]
    assert rtml.get(dag.execute(5, 6, y=1)) == [11, 2, 7]


def test_multi_output_node_gives_a_list_of_refs() -> None:
    with InputNode() as inp:
        a = double.bind(inp)
        dag = MultiOutputNode((a, add.bind(a, 1), add.bind(2, 3)))
    refs = dag.execute(4)
    assert isinstance(refs, list) and all(isinstance(r, rtml.ObjectRef) for r in refs)
    assert rtml.get(refs) == [8, 9, 5]


def test_executes_with_different_inputs_give_their_own_values() -> None:
    with InputNode() as inp:
        dag = add.bind(double.bind(inp), inp)
    refs = [dag.execute(i) for i in range(6)]
    assert rtml.get(refs) == [3 * i for i in range(6)]


def test_an_actor_keeps_its_state_within_an_execute_and_starts_anew_at_each() -> None:
    with InputNode() as inp:
        counter = Counter.bind(10)
        assert isinstance(counter, ClassNode)
        counter.incr.bind(2)  # not used by the output, but bound before it: runs first
        counter.incr.bind(inp)
        seen = counter.get.bind()
        dag = MultiOutputNode([seen, read_actor.bind(counter, seen)])  # the handle, passed
    assert rtml.get(dag.execute(5)) == [17, 17]
    assert rtml.get(dag.execute(1)) == [13, 13]  # a new actor, not 13 + 17
    handle = counter.execute()  # a ClassNode executes to a handle
    assert isinstance(handle, rtml.ActorHandle)
    assert rtml.get(handle.get.remote()) == 10


def test_two_actors_in_one_graph() -> None:
    a, b = Counter.bind(10), Counter.bind(100)
    a.incr.bind(2)
    a.incr.bind(4)
    b.incr.bind(6)
    dag = add.bind(a.get.bind(), b.get.bind())
    assert rtml.get(dag.execute()) == 16 + 106


def test_options_are_kept() -> None:
    with InputNode() as inp:
        split = pair.options(num_returns=2).bind(inp)
    plus, minus = split.execute(3)
    assert rtml.get([plus, minus]) == [3, -3]
    name = f"dag-{uuid.uuid4().hex[:8]}"
    handle = Counter.options(name=name).bind(7).execute()
    assert rtml.get(rtml.get_actor(name).incr.remote()) == 8
    assert rtml.get(handle.get.remote()) == 8
    rtml.kill(handle)
    high, low = Counter.bind(7).pair.options(num_returns=2).bind().execute()
    assert rtml.get([high, low]) == [7, -7]
    existing = Counter.remote(4)
    one, other = existing.pair.options(num_returns=2).bind().execute()
    assert rtml.get([one, other]) == [4, -4]


def test_nodes_nested_in_list_and_dict_arguments_are_their_refs() -> None:
    with InputNode() as inp:
        a = double.bind(inp)
        dag = look_inside.bind([a, add.bind(a, 1)], {"k": add.bind(inp, 100)})
    assert rtml.get(dag.execute(3)) == ([True, True], [6, 7], 103)


def test_a_failing_task_fails_the_graph_with_its_error() -> None:
    with InputNode() as inp:
        dag = add.bind(fails.bind(inp), 1)
    with pytest.raises(ValueError, match="bad input 9") as info:
        rtml.get(dag.execute(9))
    assert isinstance(info.value, TaskError)


def test_a_bad_execute_submits_nothing() -> None:
    tally = Counter.remote()
    with InputNode() as inp:
        dag = add.bind(record.bind(tally, 1), inp)
        parts = add.bind(record.bind(tally, 1), inp[2])
    with pytest.raises(TypeError, match="given no arguments"):
        dag.execute()
    with pytest.raises(IndexError, match=r"inp\[2\].*2 positional"):
        parts.execute(1, 2)
    with pytest.raises(KeyError, match="'b'"):
        add.bind(inp["b"]).execute(a=1, c=2)
    with pytest.raises(TypeError, match="inp\\[2\\].*one int"):
        parts.execute(5)  # one value: inp[2] indexes into it, as in Ray
    assert rtml.get(tally.get.remote()) == 0
    assert rtml.get(dag.execute(1)) == 2
    assert rtml.get(tally.get.remote()) == 1


def test_input_nodes_used_wrongly() -> None:
    outside = InputNode()
    with pytest.raises(ValueError, match="with InputNode"):
        double.bind(outside).execute(1)
    with InputNode() as one, InputNode() as two:
        dag = add.bind(one, two)
    with pytest.raises(ValueError, match="has 2"):
        dag.execute(1)
    with InputNode() as inp, pytest.raises(ValueError, match="InputNode cannot be an argument"):
        Counter.bind(inp)
    with pytest.raises(ValueError, match="list of DAG nodes"):
        MultiOutputNode(double.bind(1))


def test_wrong_binds_fail_at_bind_time() -> None:
    with pytest.raises(TypeError, match="remote function add"):
        add.bind(1, 2, 3)
    with pytest.raises(TypeError, match="remote function add"):
        add.options(num_cpus=1).bind(b=2)
    with pytest.raises(TypeError, match="actor class Counter"):
        Counter.bind(1, 2)
    with pytest.raises(TypeError, match="actor class Counter"):
        Counter.options(max_concurrency=2).bind(1, 2)
    node = Counter.bind()
    with pytest.raises(TypeError, match="actor method Counter.incr"):
        node.incr.bind(1, 2)
    with pytest.raises(AttributeError, match="has no method 'nope'"):
        node.nope.bind()
    with pytest.raises(ValueError, match="unknown option"):
        node.incr.options(bogus=1)
    with pytest.raises(TypeError, match="actor method Counter.incr"):
        Counter.remote().incr.bind(1, 2)


def test_nodes_are_not_remote_calls() -> None:
    node = add.bind(1, 2)
    with pytest.raises(AttributeError, match="execute"):
        node.remote()
    with pytest.raises(AttributeError, match="cannot be used again"):
        node.bind()
    with pytest.raises(AttributeError, match="cannot be used again"):
        Counter.bind().bind()
    with pytest.raises(AttributeError, match=r"\.remote\(\) cannot be used on a method"):
        Counter.bind().incr.remote()
    with pytest.raises(TypeError, match="cannot be pickled or passed to .remote"):
        double.remote(node)
    assert repr(node) == "FunctionNode(remote function add)"
    assert node.get_args() == (1, 2) and node.get_kwargs() == {}
