"""Ending actors: exit_actor() from inside a method, __ray_terminate__ from outside,
and what later calls see.

Modelled on Ray's "Terminating Actors" page:
an actor that ends itself is not restarted, and calls to it raise an actor error.
"""

import rtml as ray


@ray.remote(max_restarts=2)
class Job:
    def __init__(self):
        self.done = []

    def work(self, item):
        self.done.append(item)
        return len(self.done)

    def finish(self):
        # Ends this actor's process now: it is not restarted, even with max_restarts.
        ray.actor.exit_actor()


job = Job.remote()
print("work:", ray.get([job.work.remote(i) for i in range(3)]))

# The call that exits gets an actor error; so does every call after it.
try:
    ray.get(job.finish.remote())
except ray.exceptions.ActorDiedError:
    print("finish() ended the actor")
try:
    ray.get(job.work.remote(99))
except ray.exceptions.ActorDiedError:
    print("a later call raised ActorDiedError: the actor was not restarted")

# __ray_terminate__ asks an actor to end once the calls queued before it have run.
other = Job.remote()
pending = [other.work.remote(i) for i in range(2)]
other.__ray_terminate__.remote()
print("calls queued before __ray_terminate__ ran:", ray.get(pending))
try:
    ray.get(other.work.remote(1))
except ray.exceptions.ActorDiedError:
    print("after __ray_terminate__ the actor is gone")

# exit_actor() outside an actor is an error.
try:
    ray.actor.exit_actor()
except TypeError:
    print("exit_actor() in the driver raised TypeError")
