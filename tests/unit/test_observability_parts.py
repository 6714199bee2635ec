"""The pure parts behind metrics, logs, the timeline and replay, without processes: the
trace builder, what a task record keeps of a call, the log files' confinement, the
node's lease and pull bookkeeping, and the metrics server's token rule."""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest

from rtml.control_plane import chrome_trace
from rtml.core.kept_calls import CALL_ARGS_KEPT, kept_call
from rtml.debug import KeptCall
from rtml.logs import MAX_CHUNK, bad_name, list_files, read
from rtml.metrics import MetricsServer, loopback
from rtml.node.metrics import NodeMetrics
from rtml.node.workers import WorkerProc
from rtml.rpc import messages as m

TASK = {"task_id": "aa" * 16, "name": "f", "job_id": "01", "owner_id": "bb" * 8,
        "status": "FINISHED", "attempt": 0, "node_id": "cc" * 16, "worker_pid": 42,
        "submit_ts": 9.0, "start_ts": 10.0, "args_ts": 10.5, "run_end_ts": 12.0,
        "end_ts": 12.25}


def test_a_task_becomes_a_slice_with_its_phases_on_its_workers_lane() -> None:
    trace = chrome_trace([TASK])
    slices = {e["name"]: e for e in trace if e["ph"] == "X"}
    assert slices["f"]["cat"] == "task" and slices["f"]["tid"] == 42
    assert (slices["f"]["ts"], slices["f"]["dur"]) == (10e6, 2.25e6)
    assert (slices["fetch arguments"]["ts"], slices["fetch arguments"]["dur"]) == (10e6, 0.5e6)
    assert (slices["run"]["ts"], slices["run"]["dur"]) == (10.5e6, 1.5e6)
    assert (slices["store result"]["ts"], slices["store result"]["dur"]) == (12e6, 0.25e6)
    queued = slices["queued: f"]
    assert (queued["ts"], queued["dur"], queued["pid"]) == (9e6, 1e6, "owners")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["ph"] == "M"
             and e["name"] == "thread_name"}
    assert names[("node " + "cc" * 6, 42)] == "worker 42"


def test_phases_not_reached_are_left_out_and_actor_calls_are_marked() -> None:
    raised = {**TASK, "args_ts": 0.0, "run_end_ts": 0.0, "actor_id": "dd" * 16}
    trace = [e for e in chrome_trace([raised, {**TASK, "start_ts": None}]) if e["ph"] == "X"]
    assert [(e["name"], e["cat"]) for e in trace] == [("f", "actor_call"),
                                                      ("queued: f", "queued")]


def test_leases_and_pulls_are_slices_too() -> None:
    events = [{"kind": "LeaseGranted", "node_id": "cc" * 16, "worker_pid": 42,
               "worker_id": "ee", "asked_ts": 1.0, "granted_ts": 1.5},
              {"kind": "ObjectPulled", "node_id": "cc" * 16, "from_node": "dd" * 16,
               "object_id": "ff" * 20, "size": 10, "start_ts": 2.0, "end_ts": 3.0},
              {"kind": "JobStarted", "ts": 0.0}]
    slices = [e for e in chrome_trace([], events) if e["ph"] == "X"]
    assert [(e["cat"], e["tid"], e["dur"]) for e in slices] == [("lease", 42, 0.5e6),
                                                                ("transfer", 0, 1e6)]
    assert slices[1]["args"]["bytes"] == 10


def _spec(*args: m.TaskArg) -> m.TaskSpec:
    return m.TaskSpec(b"t" * 16, b"j", "f", b"F" * 20, args, (), 1, b"o" * 16)


def test_a_call_keeps_small_inline_arguments_and_store_ones_by_id() -> None:
    small = m.TaskArg(value=m.Payload(b"x" * 100))
    stored = m.TaskArg(object_id=b"o" * 20, node_id=b"n" * 16)
    spec = msgspec.structs.replace(_spec(small, stored), kwarg_names=("k",),
                                   resources={"GPU": 1.0})
    read = msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(kept_call(spec))),
                           KeptCall)
    assert read == KeptCall([small, stored], ["k"], 1, {"GPU": 1.0})


def test_a_call_over_the_cap_keeps_its_options_and_the_size_dropped() -> None:
    big = m.TaskArg(value=m.Payload(b"x" * CALL_ARGS_KEPT, (b"y",)))
    read = msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(kept_call(_spec(big)))),
                           KeptCall)
    assert read == KeptCall(CALL_ARGS_KEPT + 1, [], 1, None)


def test_log_names_are_file_names_of_the_logs_directory(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text("0123456789")
    (tmp_path / "secret").write_text("token")
    os.symlink(tmp_path / "secret", logs / "link.log")
    (logs / "sub").mkdir()
    assert [f.name for f in list_files(str(logs))] == ["a.log"]
    for name in ("../secret", "sub/../../secret", ".hidden", "", "a\0b", str(logs / "a.log")):
        assert bad_name(name) and read(str(logs), 1, name, 0, 10).error
    assert "not a log file name" in read(str(logs), 1, "../secret", 0, 10).error
    planted = read(str(logs), 1, "link.log", 0, 10)  # a symlink: not followed
    assert planted.error and planted.data == b""
    assert read(str(logs), 1, "sub", 0, 10).error
    assert read(str(logs), 1, "gone.log", 0, 10).error.startswith("no log file")


def test_log_reads_are_bounded_and_take_offsets_from_either_end(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_bytes(b"0123456789")
    assert read(str(tmp_path), 7, "a.log", 4, 3) == m.LogChunk(7, b"456", 4, 10)
    assert read(str(tmp_path), 7, "a.log", -3, 100).data == b"789"
    assert read(str(tmp_path), 7, "a.log", -30, 100).offset == 0
    assert read(str(tmp_path), 7, "a.log", 30, 100) == m.LogChunk(7, b"", 10, 10)
    (tmp_path / "b.log").write_bytes(b"z" * (MAX_CHUNK + 5))
    assert len(read(str(tmp_path), 1, "b.log", 0, 10 * MAX_CHUNK).data) == MAX_CHUNK


def test_a_lease_granted_is_timed_and_recorded_once() -> None:
    metrics = NodeMetrics(enabled=False)
    client, other = object(), object()
    metrics.lease_asked(client, 1)
    metrics.lease_asked(client, 2)
    metrics.lease_asked(other, 1)
    metrics.lease_granted(client, 1, WorkerProc(b"w" * 16, pid=7), b"n")
    metrics.lease_elsewhere(client, 2)
    metrics.client_gone(other)
    assert metrics.asked == {} and metrics.leases_granted == 1
    (event,) = metrics.drain_events()
    assert event["kind"] == "LeaseGranted" and event["worker_pid"] == 7
    assert event["granted_ts"] >= event["asked_ts"] and metrics.drain_events() == []


def test_task_counts_of_exited_workers_are_kept() -> None:
    metrics = NodeMetrics(enabled=True)
    metrics.task_counts(b"a", m.TaskCounts(5, 4, 1))
    metrics.task_counts(b"b", m.TaskCounts(2, 1, 0))
    metrics.worker_gone(b"a")
    metrics.task_counts(b"b", m.TaskCounts(3, 3, 0))
    assert metrics.tasks() == {"submitted": 8, "finished": 7, "failed": 1}


def test_loopback_is_served_without_the_token_and_other_addresses_with_it() -> None:
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("192.0.2.2")

    async def scrape(host: str, header: str) -> int:
        from prometheus_client import CollectorRegistry, Counter

        registry = CollectorRegistry()
        Counter("rtml_probe", "a probe", registry=registry).inc()
        server = MetricsServer(registry, host, 0, "the-token")
        address = await server.start()
        request = urllib.request.Request(f"http://{address.replace('0.0.0.0', '127.0.0.1')}"
                                         f"/metrics", headers={"Authorization": header})
        try:
            with await asyncio.to_thread(urllib.request.urlopen, request, timeout=5) as reply:
                assert b"rtml_probe_total 1.0" in reply.read()
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        finally:
            await server.close()

    assert asyncio.run(scrape("127.0.0.1", "")) == 200
    assert asyncio.run(scrape("0.0.0.0", "")) == 401
    assert asyncio.run(scrape("0.0.0.0", "Bearer wrong")) == 401
    assert asyncio.run(scrape("0.0.0.0", "Bearer the-token")) == 200


def test_a_metrics_port_in_use_is_a_clear_error() -> None:
    from prometheus_client import CollectorRegistry

    from rtml.exceptions import RtmlSystemError

    async def twice() -> None:
        first = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, "t")
        port = int((await first.start()).rpartition(":")[2])
        try:
            with pytest.raises(RtmlSystemError, match="--metrics-port"):
                await MetricsServer(CollectorRegistry(), "127.0.0.1", port, "t").start()
        finally:
            await first.close()

    asyncio.run(twice())
