"""Generators: a task (or an actor method) that yields streams its items to the caller.

Modelled on Ray's "Ray Generators" page.
"""

import time

import rtml as ray


# A remote generator function: .remote() returns an ObjectRefGenerator at once, and
# each yielded value becomes an ObjectRef as soon as the task yields it.
@ray.remote
def countdown(n):
    while n > 0:
        yield n
        n -= 1


gen = countdown.remote(3)
print("generator type:", type(gen).__name__)
for ref in gen:
    print("got", ray.get(ref))


# Items are consumed while the task still runs: the generator waits, here, for a
# signal the driver only sends after taking the first item.
@ray.remote
class Signal:
    def __init__(self):
        self.is_set = False

    def send(self):
        self.is_set = True

    def ready(self):
        return self.is_set


@ray.remote
def two_phase(signal):
    yield "before the signal"
    while not ray.get(signal.ready.remote()):
        time.sleep(0.01)
    yield "after the signal"


signal = Signal.remote()
gen = two_phase.remote(signal)
print(ray.get(next(gen)))
ray.get(signal.send.remote())
print(ray.get(next(gen)))
try:
    next(gen)
except StopIteration:
    print("the generator is exhausted")


# An exception in the generator is raised by ray.get of the item where it happened;
# the items before it are delivered normally.
@ray.remote
def flaky(n):
    for i in range(n):
        if i == 2:
            raise ValueError(f"cannot produce item {i}")
        yield i


values = []
for ref in flaky.remote(5):
    try:
        values.append(ray.get(ref))
    except ValueError as error:
        assert "cannot produce item 2" in str(error)
        values.append("ValueError")
print("flaky:", values)


# An actor method that yields streams too, and the actor keeps its state.
@ray.remote
class Tokenizer:
    def __init__(self):
        self.seen = 0

    def tokens(self, sentence):
        for word in sentence.split():
            self.seen += 1
            yield word.upper()

    def count(self):
        return self.seen


tokenizer = Tokenizer.remote()
words = [ray.get(ref) for ref in tokenizer.tokens.remote("streams from an actor")]
print("tokens:", words)
print("words seen by the actor:", ray.get(tokenizer.count.remote()))



# ObjectRefs from one generator can be handed on to other tasks.
@ray.remote
def double(x):
    return 2 * x


doubled = ray.get([double.remote(ref) for ref in countdown.remote(4)])
assert doubled == [8, 6, 4, 2]
print("doubled:", doubled)
