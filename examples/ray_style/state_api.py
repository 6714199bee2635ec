"""The state API: list tasks and actors with filters, summarize them.

Modelled on Ray's "Ray State API" pages (the Python SDK examples of
ray.util.state: list_tasks, list_actors, summarize_tasks, get_task).
"""

import rtml as ray
from rtml.util.state import get_task, list_actors, list_tasks, summarize_actors, summarize_tasks


@ray.remote
def square(x):
    return x * x


@ray.remote
def fail():
    raise RuntimeError("this task fails on purpose")


@ray.remote
class Greeter:
    def greet(self, name):
        return f"hello, {name}"


ray.get([square.remote(i) for i in range(4)])
try:
    ray.get(fail.remote())
except RuntimeError:
    pass
greeter = Greeter.options(name="greeter").remote()
print(ray.get(greeter.greet.remote("state api")))

# list_tasks with a filter: (column, "=" or "!=", value).
squares = list_tasks(filters=[("name", "=", "square")])
print("square tasks:", len(squares), "states:", sorted({t.state for t in squares}))

failed = list_tasks(filters=[("state", "=", "FAILED")], detail=True)
print("failed tasks:", [(t.name, t.error_type) for t in failed])

# The job's tasks and actor calls, counted by function and state.
summary = summarize_tasks()["cluster"]
for name in ["square", "fail", "Greeter.greet"]:
    entry = summary["summary"][name]
    print(f"summary: {name} ({entry['type']}): {entry['state_counts']}")
print("normal tasks:", summary["total_tasks"], "actor tasks:", summary["total_actor_tasks"])

# get_task by the ObjectRef a task returned.
ref = square.remote(12)
ray.get(ref)
print("get_task:", get_task(ref).name, get_task(ref).state)

# Actors: listed with their class and state, and summarized by class.
alive = list_actors(filters=[("state", "=", "ALIVE")])
print("alive actors:", [(a.class_name, a.name) for a in alive])
actor_summary = summarize_actors()["cluster"]["summary"]
print("actor summary:", {name: s["state_counts"] for name, s in actor_summary.items()})
