"""rtml in one page: tasks, futures passed between tasks, objects and an actor.

Run it with ``python examples/quickstart.py``; it starts an embedded cluster
(Redis, the head service, a node manager and its workers) and stops it at exit.
"""

import numpy as np

import rtml


@rtml.remote
def square(x: int) -> int:
    return x * x


@rtml.remote
def total(*values: int) -> int:
    return sum(values)


@rtml.remote
def column_means(matrix: np.ndarray) -> np.ndarray:
    return matrix.mean(axis=0)


@rtml.remote
class Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    def add(self, amount: int) -> int:
        self.value += amount
        return self.value


def main() -> None:
    rtml.init()
    squares = [square.remote(i) for i in range(10)]
    print("squares:", rtml.get(squares))
    print("sum of squares (futures passed to a task):", rtml.get(total.remote(*squares)))

    matrix = rtml.put(np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000))
    print("column means[:3] (100 KB+ array read zero-copy):", rtml.get(column_means.remote(matrix))[:3])

    counter = Counter.remote(100)
    print("actor calls, in order:", rtml.get([counter.add.remote(i) for i in range(1, 4)]))

    ready, pending = rtml.wait([square.remote(12), square.remote(13)], num_returns=2)
    print("wait:", len(ready), "ready,", len(pending), "pending ->", rtml.get(ready))
    rtml.shutdown()


if __name__ == "__main__":
    main()
