"""Queue: a producer task and a consumer actor passing items through ray.util.queue.Queue.

Modelled on Ray's "Message passing using Ray Queue" (its doc_code/actor-queue.py).
"""

import rtml as ray
from rtml.util.queue import Empty, Queue

# The queue lives in an actor of its own; the Queue object can be passed anywhere.
queue = Queue(maxsize=4)

DONE = None  # what the producer puts last


@ray.remote
def producer(queue, n):
    # With maxsize=4, put blocks while the queue is full, until the consumer takes.
    for i in range(n):
        queue.put(f"item-{i}")
    queue.put(DONE)
    return n


@ray.remote
class Consumer:
    def __init__(self, queue):
        self.queue = queue
        self.received = []

    def run(self):
        while True:
            item = self.queue.get(block=True, timeout=30)
            if item is DONE:
                return len(self.received)
            self.received.append(item)

    def items(self):
        return self.received


consumer = Consumer.remote(queue)
produced = producer.remote(queue, 10)
consumed = consumer.run.remote()
print("produced:", ray.get(produced), "consumed:", ray.get(consumed))
# One producer, one consumer: the order is kept.
print("received:", ray.get(consumer.items.remote()))
print("queue empty:", queue.empty(), "size:", queue.size())

# The driver can use it too, like Python's queue.Queue.
for word in ["alpha", "beta", "gamma"]:
    queue.put(word)
print("qsize:", queue.qsize())
print("get:", queue.get())
print("get_nowait_batch:", queue.get_nowait_batch(2))

# An empty queue raises Empty, at once without blocking or after a timeout.
try:
    queue.get_nowait()
except Empty:
    print("get_nowait on an empty queue raised Empty")
try:
    queue.get(timeout=0.2)
except Empty:
    print("get with a timeout raised Empty")

# put_nowait_batch adds all or nothing.
queue.put_nowait_batch([1, 2, 3])
print("after put_nowait_batch:", queue.size(), "full:", queue.full())
