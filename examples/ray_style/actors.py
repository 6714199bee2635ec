"""Actors: state kept between calls, handles passed to tasks, named actors.

Modelled on Ray's "Actors" and "Named Actors" pages.
"""

import rtml as ray


# A remote class: each instance is an actor, a worker process that keeps its state.
@ray.remote
class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, by=1):
        self.value += by
        return self.value

    def get_value(self):
        return self.value


counter = Counter.remote()
# Calls from one caller run in the order they were made.
print("increments:", ray.get([counter.increment.remote() for _ in range(3)]))
print("value:", ray.get(counter.get_value.remote()))

# Each actor has its own state.
counters = [Counter.remote(start=10 * i) for i in range(3)]
for c in counters:
    c.increment.remote(5)
print("three counters:", ray.get([c.get_value.remote() for c in counters]))


# A handle can be passed to tasks, which then call the same actor.
@ray.remote
def bump(counter, times):
    for _ in range(times):
        counter.increment.remote()
    return ray.get(counter.get_value.remote())


ray.get([bump.remote(counter, 2) for _ in range(2)])
assert ray.get(counter.get_value.remote()) == 7
print("after two tasks bumped it twice each:", ray.get(counter.get_value.remote()))

# A named actor can be looked up by name from anywhere in the job.
registry = Counter.options(name="global_counter").remote(100)
same = ray.get_actor("global_counter")
ray.get(same.increment.remote(1))
print("named actor, through its name:", ray.get(registry.get_value.remote()))
print("named actors:", ray.util.list_named_actors())


# A task can reach it by its name too.
@ray.remote
def use_by_name():
    return ray.get(ray.get_actor("global_counter").increment.remote(10))


print("from a task, by name:", ray.get(use_by_name.remote()))

# get_if_exists returns the live actor of that name instead of creating a second one.
again = Counter.options(name="global_counter", get_if_exists=True).remote(0)
print("get_if_exists keeps the state:", ray.get(again.get_value.remote()))

# A name that is not there raises ValueError.
try:
    ray.get_actor("no_such_actor")
except ValueError:
    print("get_actor of an unknown name raised ValueError")

# ray.kill ends an actor; later calls raise an actor error.
ray.kill(registry)
try:
    ray.get(same.get_value.remote())
except ray.exceptions.ActorDiedError:
    print("calls to a killed actor raise ActorDiedError")
