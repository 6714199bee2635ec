"""What a running cluster records in its control plane: objects, events, task records."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import rtml
from rtml.control_plane import ControlPlane
from rtml.core.current import require_runtime

FLUSH_WAIT_S = 1.5  # node managers flush object changes every 0.5 s heartbeat
DEADLINE_S = 5.0


def _plane() -> ControlPlane:
    return require_runtime().plane


def _eventually(probe: Callable[[], Any], what: str) -> Any:
    """``probe()``'s first truthy value within DEADLINE_S; fails naming ``what``."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            assert value, f"timed out waiting for {what}"
            return value
        time.sleep(0.1)


@rtml.remote
def traced_square(x: int) -> int:
    return x * x


@rtml.remote
class Tally:
    def __init__(self) -> None:
        self.n = 0

    def bump(self) -> int:
        self.n += 1
        return self.n


def test_large_object_is_listed_then_removed(cluster: None) -> None:
    array = np.arange(2 * 1024 * 1024 // 8, dtype=np.int64)  # 2 MiB
    ref = rtml.put(array)
    oid = ref.hex()
    time.sleep(FLUSH_WAIT_S)
    by_id = {o["object_id"]: o for o in _plane().list_objects()}
    assert oid in by_id, f"{oid} not in {sorted(by_id)}"
    record = by_id[oid]
    assert array.nbytes <= record["size"] < array.nbytes + 64 * 1024
    assert record["state"] == "SEALED"
    node_id = require_runtime().node_id.hex()
    assert record["node_id"] == node_id and record["locations"] == [node_id]
    assert record["owner"]

    del ref
    gc.collect()  # no further API call: the driver is idle and must still free it
    _eventually(lambda: oid not in {o["object_id"] for o in _plane().list_objects()},
                f"object {oid} to leave the objects table")


def test_small_objects_are_not_listed(cluster: None) -> None:
    ref = rtml.put(b"x" * 100)
    time.sleep(FLUSH_WAIT_S)
    oid = ref.hex()
    assert oid not in {o["object_id"] for o in _plane().list_objects()}


def test_events_record_node_registration_and_actor_alive(cluster: None) -> None:
    tally = Tally.remote()
    assert rtml.get(tally.bump.remote()) == 1
    actor_hex = tally._actor_id.hex()

    def actor_states() -> list[str]:
        return [e["state"] for e in _plane().read_events()
                if e.get("kind") == "ActorStateChanged" and e.get("actor_id") == actor_hex]

    states = _eventually(lambda: "ALIVE" in actor_states() and actor_states(),
                         "the actor's ALIVE event")
    assert states[:2] == ["PENDING", "ALIVE"]
    events = _plane().read_events()
    node_id = require_runtime().node_id.hex()
    assert any(e.get("kind") == "NodeRegistered" and e.get("node_id") == node_id
               for e in events)
    assert any(e.get("kind") == "JobStarted" and e.get("job_id") == require_runtime().job_id.hex()
               for e in events)
    assert all(isinstance(e.get("ts"), float) for e in events)

    rtml.kill(tally)
    _eventually(lambda: "DEAD" in actor_states(), "the actor's DEAD event")
    dead = [e for e in _plane().read_events() if e.get("actor_id") == actor_hex
            and e.get("state") == "DEAD"]
    assert "rtml.kill" in dead[-1]["reason"]


def test_finished_task_record_has_status_times_and_name(cluster: None) -> None:
    before = time.time()
    assert rtml.get(traced_square.remote(7)) == 49
    rt = require_runtime()
    rt.writer.flush()
    records = _eventually(
        lambda: [t for t in rt.plane.list_tasks({"job_id": rt.job_id.hex(),
                                                 "name": "traced_square"})
                 if t.get("status") == "FINISHED"],
        "a FINISHED record of traced_square")
    record = records[-1]
    assert record["name"] == "traced_square"
    assert before - 1.0 <= record["start_ts"] <= record["end_ts"] <= time.time()
    assert record["submit_ts"] <= record["start_ts"]


def test_spilled_object_is_listed_as_spilled(start_cluster: Callable[..., Any]) -> None:
    start_cluster(num_cpus=2, object_store_memory=5 * 1024 * 1024)
    refs = [rtml.put(np.full(2 * 1024 * 1024 // 8, i, dtype=np.int64)) for i in range(3)]
    first = refs[0].hex()

    def state_of_first() -> str | None:
        for record in _plane().list_objects():
            if record["object_id"] == first:
                return str(record["state"])
        return None

    _eventually(lambda: state_of_first() == "SPILLED", "the oldest object to be SPILLED")
    assert int(rtml.get(refs[0])[0]) == 0  # restored into shared memory on get
    _eventually(lambda: state_of_first() == "SEALED", "the restored object to be SEALED")
    assert {r.hex() for r in refs} <= {o["object_id"] for o in _plane().list_objects()}
