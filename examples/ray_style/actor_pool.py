"""ActorPool: a fixed set of actors fed work, in order (map) or as it finishes
(map_unordered, submit / get_next_unordered).

Modelled on Ray's "Utility Classes" page (its doc_code/actor-pool.py).
"""

import rtml as ray
from rtml.util import ActorPool


@ray.remote
class Multiplier:
    def __init__(self, factor):
        self.factor = factor
        self.calls = 0

    def multiply(self, value):
        self.calls += 1
        return value * self.factor

    def num_calls(self):
        return self.calls


# Two actors that do the same work: the pool gives each one value at a time.
workers = [Multiplier.remote(10), Multiplier.remote(10)]
pool = ActorPool(workers)

# map returns a generator whose results come in the order of the inputs.
results = pool.map(lambda actor, value: actor.multiply.remote(value), [1, 2, 3, 4, 5])
print("map:", list(results))

# map_unordered yields each result as soon as it is ready: sort to compare.
unordered = pool.map_unordered(lambda actor, value: actor.multiply.remote(value), range(6))
print("map_unordered, sorted:", sorted(unordered))

# The calls were shared between the two actors.
calls = ray.get([worker.num_calls.remote() for worker in workers])
assert sum(calls) == 11 and all(n > 0 for n in calls)
print("calls made:", sum(calls))

# submit / get_next: one task at a time, results in submission order.
pool.submit(lambda actor, value: actor.multiply.remote(value), 7)
pool.submit(lambda actor, value: actor.multiply.remote(value), 8)
print("has_next:", pool.has_next())
print("get_next:", pool.get_next(), pool.get_next())
print("has_next:", pool.has_next())

# More submits than actors: the extra ones wait for an actor to come back.
for value in range(4):
    pool.submit(lambda actor, value: actor.multiply.remote(value), value)
drained = []
while pool.has_next():
    drained.append(pool.get_next_unordered())
print("get_next_unordered, sorted:", sorted(drained))

# An actor can be taken out of the pool, and given back.
idle = pool.pop_idle()
print("popped an idle actor:", idle is not None, "- still free:", pool.has_free())
pool.push(idle)
print("pushed it back - free:", pool.has_free())
