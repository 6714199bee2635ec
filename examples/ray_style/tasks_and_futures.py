"""Tasks and futures: remote functions, ObjectRefs passed from task to task, put and wait.

Modelled on Ray's "Tasks" and "Objects" pages.
"""

import rtml as ray


# A remote function runs as a task in a worker process.
@ray.remote
def square(x):
    return x * x


# .remote() returns an ObjectRef (a future) at once; ray.get waits for the value.
futures = [square.remote(i) for i in range(5)]
print("squares:", ray.get(futures))


@ray.remote
def add(a, b):
    return a + b


# A future given to another task as an argument: Ray resolves it to its value first,
# and the second task only runs once the first has finished.
first = square.remote(3)
second = add.remote(first, 1)
print("square(3) + 1 =", ray.get(second))

# Futures chained into a small tree of tasks: nothing waits in the driver meanwhile.
total = add.remote(add.remote(square.remote(1), square.remote(2)), square.remote(3))
assert ray.get(total) == 14
print("1 + 4 + 9 =", ray.get(total))

# ray.put stores a value in the object store once; every task reading it shares it.
numbers = ray.put(list(range(10)))


@ray.remote
def count_even(values):
    return sum(1 for v in values if v % 2 == 0)


@ray.remote
def count_odd(values):
    return sum(1 for v in values if v % 2 == 1)


print("even, odd:", ray.get([count_even.remote(numbers), count_odd.remote(numbers)]))


# A ref nested inside a list is passed as a ref: the task calls ray.get itself.
@ray.remote
def sum_nested(refs):
    return sum(ray.get(refs))


print("sum of nested refs:", ray.get(sum_nested.remote([square.remote(i) for i in range(4)])))

# ray.wait returns the refs that are ready, in the order they were given.
refs = [square.remote(i) for i in range(4)]
ready, not_ready = ray.wait(refs, num_returns=4)
assert not not_ready
print("waited for", len(ready), "results:", ray.get(ready))


# Options per call: several return values, each its own ObjectRef.
@ray.remote(num_returns=2)
def divmod_task(a, b):
    return a // b, a % b


quotient, remainder = divmod_task.remote(17, 5)
print("17 divmod 5:", ray.get(quotient), ray.get(remainder))


# An exception raised in a task is raised again by ray.get, as its own class.
@ray.remote
def fail():
    raise ValueError("bad input")


try:
    ray.get(fail.remote())
except ValueError as error:
    assert "bad input" in str(error)
    print("the task's ValueError reached the driver")
