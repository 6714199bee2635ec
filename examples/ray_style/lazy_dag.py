"""Lazy DAGs: record calls with .bind(), feed them with an InputNode, run them with
execute(); several outputs with MultiOutputNode; actors inside a graph.

Modelled on Ray's "Lazy Computation Graphs with the Ray DAG API" page.
"""

import rtml as ray
from rtml.dag import InputNode, MultiOutputNode


@ray.remote
def add(a, b=1):
    return a + b


@ray.remote
def multiply(a, b):
    return a * b


# bind() records a call without running it; execute() submits it and returns a ref.
node = add.bind(1, b=2)
print("add.bind(1, b=2):", ray.get(node.execute()))

# A node can be the argument of another: the graph runs add, then multiply.
graph = multiply.bind(add.bind(1, b=2), 10)
print("multiply(add(1, 2), 10):", ray.get(graph.execute()))

# InputNode stands for the value given to execute(); one graph, many inputs.
with InputNode() as x:
    squared_plus_one = add.bind(multiply.bind(x, x))
print("x * x + 1 for x in 1..4:", [ray.get(squared_plus_one.execute(x)) for x in range(1, 5)])

# With several arguments, inp[i] (positional) and inp.name (keyword) read them.
with InputNode() as inp:
    weighted = add.bind(multiply.bind(inp[0], inp.weight), inp[1])
print("3 * 4 + 5:", ray.get(weighted.execute(3, 5, weight=4)))

# A node used twice runs once; MultiOutputNode gives a list of refs.
with InputNode() as inp:
    shared = add.bind(inp, b=100)
    both = MultiOutputNode([multiply.bind(shared, 2), multiply.bind(shared, 3)])
print("two outputs of one shared node:", ray.get(both.execute(1)))


# Actors in a graph: Cls.bind() is an actor created when the graph executes, and
# actor.method.bind() a call of it, made in the order bound.
@ray.remote
class Accumulator:
    def __init__(self, start):
        self.total = start

    def add(self, value):
        self.total += value
        return self.total

    def get(self):
        return self.total


with InputNode() as inp:
    acc = Accumulator.bind(10)
    acc.add.bind(inp)
    acc.add.bind(inp)
    total = acc.get.bind()
print("actor in a graph, 10 + 5 + 5:", ray.get(total.execute(5)))

# Each execute() creates the graph's actors anew.
print("executed again, a new actor:", ray.get(total.execute(1)))

# An existing actor's methods can be bound too: its state carries over executions.
counter = Accumulator.remote(0)
with InputNode() as inp:
    step = counter.add.bind(inp)
print("calls to a live actor:", [ray.get(step.execute(i)) for i in (1, 2, 3)])
