"""Concurrency groups: an actor's methods split into groups, each with its own threads,
so that a busy group does not hold back the others; per-call group choice.

Modelled on Ray's "Limiting Concurrency Per-Method with Concurrency Groups" page,
with a threaded actor.
"""

import threading
import time

import rtml as ray


# "io" runs up to 2 calls at once, "compute" 1; methods with no group run in the
# default group (one call at a time for a threaded actor).
@ray.remote(concurrency_groups={"io": 2, "compute": 1})
class Service:
    def __init__(self):
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0

    @ray.method(concurrency_group="io")
    def fetch(self, i):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.gate.wait()  # blocks until open_gate() is called
        with self.lock:
            self.running -= 1
        return f"page-{i}"

    @ray.method(concurrency_group="compute")
    def compute(self, x):
        return x * x

    def in_flight(self):
        return self.running

    def open_gate(self):
        self.gate.set()

    def peak_io(self):
        return self.peak


service = Service.remote()

# Two fetches fill the io group: both run, and block until the gate opens.
pages = [service.fetch.remote(i) for i in range(2)]
while ray.get(service.in_flight.remote()) < 2:
    time.sleep(0.01)
print("fetches running:", ray.get(service.in_flight.remote()))

# The io group is full, yet the compute and default groups still serve calls.
print("compute while io is busy:", ray.get(service.compute.remote(7)))

# A call can be sent to another group: in the full "io" group it has to wait for a
# free io thread, that is, for the gate to open.
in_io = service.compute.options(concurrency_group="io").remote(3)
ready, not_ready = ray.wait([in_io], timeout=0.5)
print("compute sent to the full io group is waiting:", len(not_ready) == 1)

ray.get(service.open_gate.remote())
print("pages:", ray.get(pages))
print("compute in io after the gate opened:", ray.get(in_io))
print("most fetches at once:", ray.get(service.peak_io.remote()))
