"""The control plane against a real, throwaway redis-server on a free port."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtml.control_plane import BatchedWriter, ControlPlane, RedisProcess, start_redis
from rtml.control_plane.resp import AuthError, RespClient
from rtml.control_plane.tables import RAN, RAN_FAILED, SUBMITTED
from rtml.exceptions import RtmlSystemError


def _gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (exited, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    data_dir = tmp_path_factory.mktemp("redis")
    proc = start_redis(port=0, password=secrets.token_hex(16), data_dir=str(data_dir))
    try:
        yield proc
    finally:
        proc.stop()
        proc.stop()  # idempotent
        assert proc.proc.poll() is not None
        assert _gone(proc.proc.pid)


@pytest.fixture
def plane(plain_redis: RedisProcess) -> Iterator[ControlPlane]:
    # A fresh namespace per test keeps tests independent on one server: a plain one, as
    # rtml's own lets rtml's user touch rtml's namespace only.
    cp = ControlPlane(plain_redis.host, plain_redis.port, plain_redis.password,
                      namespace="t" + secrets.token_hex(4))
    yield cp
    cp.close()


def test_server_is_reachable_and_password_is_required(server: RedisProcess) -> None:
    assert server.port > 0
    plane = ControlPlane(server.host, server.port, server.password, user=server.user)
    assert plane.ping() is True
    plane.close()
    wrong = ControlPlane(server.host, server.port, "not-the-password")
    with pytest.raises(RtmlSystemError, match="password") as info:
        wrong.ping()
    assert isinstance(info.value.__cause__, AuthError)
    with pytest.raises(RtmlSystemError):
        wrong.list_nodes()
    wrong.close()
    no_password = RespClient(server.host, server.port, None)
    with pytest.raises(AuthError, match="NOAUTH"):
        no_password.execute("PING")
    no_password.close()


def test_unreachable_redis_pings_false() -> None:
    cp = ControlPlane("127.0.0.1", 1, "x")
    assert cp.ping() is False
    with pytest.raises(RtmlSystemError, match="cannot reach"):
        cp.list_jobs()
    cp.close()


def test_nodes_round_trip(plane: ControlPlane) -> None:
    a, b = b"\x01" * 16, b"\x02" * 16
    plane.put_node(a, {"NodeManagerAddress": "10.0.0.1:7000", "Resources": {"CPU": 2.0},
                       "hostname": "alpha"})
    plane.put_node(b, {"address": "10.0.0.2:7000", "resources": {"CPU": 4.0, "GPU": 1.0}})
    plane.heartbeat(a, {"CPU": 1.5}, [{"CPU": 8.0}])
    plane.mark_node_dead(b)
    na, nb = plane.list_nodes()
    assert na["NodeID"] == a.hex() and na["Alive"] is True
    assert na["NodeManagerAddress"] == "10.0.0.1:7000" and na["Resources"] == {"CPU": 2.0}
    assert na["Available"] == {"CPU": 1.5} and na["PendingShapes"] == [{"CPU": 8.0}]
    assert abs(na["LastHeartbeat"] - time.time()) < 60 and na["hostname"] == "alpha"
    assert nb["NodeID"] == b.hex() and nb["Alive"] is False
    assert nb["NodeManagerAddress"] == "10.0.0.2:7000"
    assert nb["Resources"] == {"CPU": 4.0, "GPU": 1.0}
    assert nb["LastHeartbeat"] is None and nb["Available"] == {}


def test_jobs_round_trip(plane: ControlPlane) -> None:
    j1, j2 = b"\x00\x00\x00\x01", b"\x00\x00\x00\x02"
    plane.put_job(j1, {"driver_pid": 123, "entrypoint": "a.py"})
    plane.put_job(j2, {"driver_pid": 456})
    plane.finish_job(j1)
    jobs = plane.list_jobs()
    assert [j["JobID"] for j in jobs] == [j1.hex(), j2.hex()]
    assert jobs[0]["IsDead"] is True and jobs[0]["driver_pid"] == 123 and "EndTime" in jobs[0]
    assert jobs[1]["IsDead"] is False and jobs[1]["driver_pid"] == 456


def test_functions_are_written_once(plane: ControlPlane) -> None:
    fid = b"\xab" * 20
    assert plane.fetch_function(fid) is None
    plane.export_function(fid, b"first")
    plane.export_function(fid, b"second")
    assert plane.fetch_function(fid) == b"first"


def test_task_records_merge_and_filter(plane: ControlPlane) -> None:
    job, other_job = b"\x00\x00\x00\x07", b"\x00\x00\x00\x08"
    t1, t2, t3 = b"\x10" * 16, b"\x11" * 16, b"\x12" * 16
    plane.write_task_records([
        {"task_id": t1, "name": "f", "job_id": job, "status": "PENDING", "submit_ts": 1.0},
        {"task_id": t2, "name": "g", "job_id": job, "status": "PENDING", "submit_ts": 2.0},
        {"task_id": t3, "name": "h", "job_id": other_job, "status": "PENDING",
         "submit_ts": 3.0},
    ])
    plane.write_task_records([{"task_id": t1, "status": "FINISHED", "attempt": 1,
                               "node_id": b"\x01" * 16, "end_ts": 5.0}])
    tasks = plane.list_tasks()
    assert [t["task_id"] for t in tasks] == [t1.hex(), t2.hex(), t3.hex()]
    first = tasks[0]
    assert first["name"] == "f" and first["status"] == "FINISHED" and first["attempt"] == 1
    assert first["job_id"] == job.hex() and first["node_id"] == (b"\x01" * 16).hex()
    assert first["submit_ts"] == 1.0 and first["end_ts"] == 5.0
    mine = plane.list_tasks({"job_id": job.hex()})
    assert [t["task_id"] for t in mine] == [t1.hex(), t2.hex()]
    done = plane.list_tasks({"job_id": job.hex(), "status": "FINISHED"})
    assert [t["task_id"] for t in done] == [t1.hex()]
    assert [t["task_id"] for t in plane.list_tasks(limit=2)] == [t2.hex(), t3.hex()]
    assert plane.list_tasks({"status": "NOPE"}) == []


def test_a_writers_batches_merge_in_the_order_written(plane: ControlPlane) -> None:
    task = b"\x13" * 16
    prefix = b"\x7f" * 8
    for seq, attempt in ((2, 2), (1, 1), (256, 3)):  # written out of order on purpose
        plane.write_task_records([{"task_id": task, "name": "f", "status": "FAILED",
                                   "attempt": attempt}], prefix + seq.to_bytes(8, "big"))
    [found] = [t for t in plane.list_tasks() if t["task_id"] == task.hex()]
    assert found["attempt"] == 3  # the batch numbered last wins, not the one written last


def test_a_final_status_is_not_undone_by_another_writers_pending(plane: ControlPlane) -> None:
    # The head marks a dead driver's PENDING tasks FAILED; its batch may sort before the
    # driver's own, which must not bring the task back to PENDING when read.
    task = b"\x14" * 16
    plane.write_task_records([{"task_id": task, "status": "FAILED", "error": "gone"}],
                             b"\x00" * 16)
    plane.write_task_records([{"task_id": task, "name": "f", "status": "PENDING",
                               "submit_ts": 1.0}], b"\xff" * 16)
    [found] = [t for t in plane.list_tasks() if t["task_id"] == task.hex()]
    assert (found["status"], found["name"], found["error"]) == ("FAILED", "f", "gone")


def test_a_record_without_a_task_id_does_not_break_the_listing(plane: ControlPlane) -> None:
    task = b"\x15" * 16
    plane.write_task_records([{"status": "FINISHED"},
                              {"task_id": task, "name": "f", "status": "PENDING"}])
    assert [t["status"] for t in plane.list_tasks() if t["task_id"] == task.hex()] == ["PENDING"]


def test_compact_task_records_expand_and_merge_with_dicts(plane: ControlPlane) -> None:
    # The two records an owner writes per task are tuples; the ran one may sort first.
    # Its phases are written as us from its start, and read as times (0.0: not reached).
    task, failed, owner, node = b"\x16" * 16, b"\x17" * 16, b"\x05" * 16, b"\x06" * 16
    job = b"\x00\x00\x00\x09"
    call = [(), (), 1, None]
    plane.write_task_records([(RAN, task, 0, 2.0, 4242, node, 1_000_000, 250_000, 750_000,
                               call),
                              (RAN_FAILED, failed, 0, 5.0, 4243, node, 500_000, -1, -1, call)],
                             b"\x00" * 16)
    plane.write_task_records([(SUBMITTED, task, "f", job, owner, b"\xaa" * 20, 1.0),
                              (SUBMITTED, failed, "g", job, owner, b"\xaa" * 20, 4.0),
                              [SUBMITTED, b"short"], (9, task),
                              (1, task, 0, "FAILED", 2.0, 3.0, 4242, node)],  # tag 1: retired
                             b"\x01" * 16)
    found = {t["task_id"]: t for t in plane.list_tasks({"job_id": job.hex()})}
    assert found[task.hex()] == {
        "task_id": task.hex(), "name": "f", "job_id": job.hex(), "owner_id": owner.hex(),
        "function_id": (b"\xaa" * 20).hex(), "submit_ts": 1.0, "status": "FINISHED",
        "attempt": 0, "start_ts": 2.0, "end_ts": 3.0, "args_ts": 2.25, "run_end_ts": 2.75,
        "worker_pid": 4242, "node_id": node.hex()}
    assert {k: found[failed.hex()][k] for k in ("status", "attempt", "start_ts", "end_ts",
                                                 "args_ts", "run_end_ts", "worker_pid")} == {
        "status": "FAILED", "attempt": 0, "start_ts": 5.0, "end_ts": 5.5, "args_ts": 0.0,
        "run_end_ts": 0.0, "worker_pid": 4243}
    assert len(found) == 2  # the malformed and retired ones skipped
    record, kept = plane.task_call(task)
    assert kept == [[], [], 1, None] and record["run_end_ts"] == 2.75


def test_objects_round_trip(plane: ControlPlane) -> None:
    o1, o2 = b"\x20" * 20, b"\x21" * 20
    plane.put_object(o1, {"size": 100, "owner": b"\x05" * 16, "locations": ["n1"]})
    plane.put_object(o2, {"size": 7})
    plane.put_object(o1, {"locations": ["n1", "n2"]})
    objects = {o["object_id"]: o for o in plane.list_objects()}
    assert objects[o1.hex()] == {"object_id": o1.hex(), "size": 100,
                                 "owner": (b"\x05" * 16).hex(), "locations": ["n1", "n2"]}
    assert len(plane.list_objects(limit=1)) == 1
    plane.remove_objects([o1])
    assert [o["object_id"] for o in plane.list_objects()] == [o2.hex()]


def test_actors_and_named_actors(plane: ControlPlane) -> None:
    a1, a2 = b"\x30" * 16, b"\x31" * 16
    assert plane.get_actor(a1) is None
    plane.put_actor(a1, {"state": "PENDING", "spec": b"\x80\x04pickle", "restarts": 0})
    plane.put_actor(a1, {"state": "ALIVE", "address": "127.0.0.1:9000"})
    got = plane.get_actor(a1)
    assert got is not None and got["spec"] == b"\x80\x04pickle"  # bytes kept by get_*
    assert got["state"] == "ALIVE" and got["restarts"] == 0 and got["address"]
    listed = plane.list_actors()
    assert listed[0]["actor_id"] == a1.hex() and listed[0]["spec"] == b"\x80\x04pickle".hex()

    assert plane.set_named_actor("ns", "counter", a1) is True
    assert plane.set_named_actor("ns", "counter", a2) is False
    assert plane.set_named_actor("other", "counter", a2) is True
    assert plane.get_named_actor("ns", "counter") == a1
    plane.delete_named_actor("ns", "counter", a2)  # not the holder: no effect
    assert plane.get_named_actor("ns", "counter") == a1
    plane.delete_named_actor("ns", "counter", a1)
    assert plane.get_named_actor("ns", "counter") is None
    assert plane.set_named_actor("ns", "counter", a2) is True


def test_events_keep_order_and_filter_by_job(plane: ControlPlane) -> None:
    j1, j2 = b"\x00\x00\x00\x01", b"\x00\x00\x00\x02"
    events = [{"job_id": j1 if i % 2 else j2, "seq": i, "kind": "TaskFinished"}
              for i in range(50)]
    plane.append_events(events[:20])
    plane.append_events(events[20:])
    everything = plane.read_events()
    assert [e["seq"] for e in everything] == list(range(50))
    assert everything[1]["job_id"] == j1.hex()
    assert [e["seq"] for e in plane.read_events(job_id=j1)] == list(range(1, 50, 2))
    assert len(plane.read_events(count=5)) == 5


def test_batched_writer_flush_makes_records_visible(plane: ControlPlane) -> None:
    writer = BatchedWriter(plane, interval=0.05, max_batch=700)
    ids = [i.to_bytes(16, "big") for i in range(5000)]
    for n, tid in enumerate(ids):
        writer.submit_task({"task_id": tid, "name": "noop", "status": "PENDING",
                            "submit_ts": float(n)})
    for tid in ids[:10]:
        writer.submit_task({"task_id": tid, "status": "FINISHED"})
    writer.submit_event({"kind": "done"})
    writer.flush()
    tasks = plane.list_tasks()
    assert len(tasks) == 5000
    assert sum(t["status"] == "FINISHED" for t in tasks) == 10
    assert all(t["name"] == "noop" for t in tasks)
    assert plane.read_events() == [{"kind": "done"}]
    writer.close()
    writer.close()


def test_batched_writer_survives_redis_errors(server: RedisProcess,
                                              caplog: pytest.LogCaptureFixture) -> None:
    broken = ControlPlane(server.host, server.port, "wrong-password")
    writer = BatchedWriter(broken, interval=0.01)
    writer.submit_task({"task_id": b"\x01" * 16, "status": "PENDING"})
    writer.submit_task({"no_task_id": True})
    writer.submit_event({"kind": "x"})
    writer.flush()  # logged and dropped, not raised
    assert "dropped" in caplog.text
    writer.submit_task({"task_id": b"\x02" * 16})
    time.sleep(0.05)
    assert writer._thread.is_alive()
    writer.close()
    broken.close()


def test_trimming_keeps_the_newest_task_records(plane: ControlPlane) -> None:
    for batch in range(10):
        plane.write_task_records([{"task_id": (batch * 100 + i).to_bytes(16, "big"),
                                   "name": "f", "status": "FINISHED"} for i in range(100)])
    assert plane.trim_task_records(1000) == 0
    assert plane.trim_task_records(350) == 600  # whole batches, the oldest first
    kept = {int(t["task_id"], 16) for t in plane.list_tasks()}
    assert kept == set(range(600, 1000))
    assert plane.trim_task_records(0) == 400
    assert plane.list_tasks() == []


def test_a_task_whose_submission_was_trimmed_is_not_listed(plane: ControlPlane) -> None:
    submitted, ran = b"\x01" * 16, b"\x02" * 16
    plane.write_task_records([{"task_id": submitted, "name": "f", "status": "PENDING"}])
    plane.write_task_records([{"task_id": ran, "name": "g", "status": "PENDING"}])
    plane.write_task_records([{"task_id": submitted, "status": "FINISHED"},
                              {"task_id": ran, "status": "FINISHED"}])
    assert plane.trim_task_records(3) == 1  # the first batch: the submission of one
    assert [t["name"] for t in plane.list_tasks()] == ["g"]


def test_a_writer_keeps_what_redis_did_not_take_until_it_is_back(
        tmp_path: Path) -> None:
    server = start_redis(port=0, password="pw", data_dir=str(tmp_path / "r"))
    plane = ControlPlane(server.host, server.port, "pw", user=server.user)
    writer = BatchedWriter(plane, interval=0.02)
    try:
        server.stop()  # Redis is away
        for i in range(300):
            writer.submit_task({"task_id": i.to_bytes(16, "big"), "name": "f",
                                "status": "FINISHED"})
        writer.submit_event({"kind": "while away"})
        writer.submit_function(b"f" * 8, b"pickled")
        time.sleep(0.3)  # flushes find it away: all kept
        server = start_redis(port=server.port, password="pw", data_dir=str(tmp_path / "r"))
        deadline = time.monotonic() + 10
        while len(plane.list_tasks()) < 300:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert plane.read_events() == [{"kind": "while away"}]
        assert plane.fetch_function(b"f" * 8) == b"pickled"
    finally:
        writer.close()
        plane.close()
        server.stop()


def test_appendonly_file_is_written(server: RedisProcess) -> None:
    plane = ControlPlane(server.host, server.port, server.password, user=server.user)
    plane.put_job(b"\x00\x00\x00\x09", {"driver_pid": 1})
    plane.close()
    data_dir = Path(server.log_path).parent
    aof = b"".join(p.read_bytes() for p in (data_dir / "appendonlydir").glob("*.aof"))
    assert b"driver_pid" in aof  # (Valkey's append-only file is a directory of parts)
    assert (data_dir / "redis.log").exists()
    assert oct((data_dir / "redis.conf").stat().st_mode & 0o777) == "0o600"
    assert server.password not in " ".join(_cmdline(server.proc.pid))


def test_port_zero_gives_distinct_servers_and_env_override(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RTML_REDIS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RtmlSystemError, match="RTML_REDIS_SERVER"):
        start_redis(port=0, password="pw", data_dir=str(tmp_path / "a"))
    monkeypatch.delenv("RTML_REDIS_SERVER")
    first = start_redis(port=0, password="pw", data_dir=str(tmp_path / "a"))
    try:
        with pytest.raises(RtmlSystemError, match="could not bind|exited"):
            start_redis(port=first.port, password="pw", data_dir=str(tmp_path / "b"))
    finally:
        first.stop()
    assert _gone(first.proc.pid)


def test_server_dies_with_its_parent(tmp_path: Path) -> None:
    script = ("import os, sys\n"
              "from rtml.control_plane import start_redis\n"
              f"r = start_redis(port=0, password='pw', data_dir={str(tmp_path)!r})\n"
              "print(r.proc.pid, flush=True)\n"
              "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30, check=True)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 5.0
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)  # waiting on a process we do not own: no handle to block on
    if not _gone(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("redis-server outlived the process that started it")


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")
