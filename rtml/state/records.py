"""Control-plane records (``ControlPlane.list_*``'s JSON-friendly dicts) as the state
API's objects, in Ray's names and states. Pure functions: no Redis, no runtime.

::

    task record   {task_id, name, status, attempt, submit_ts, start_ts, end_ts,
                   worker_pid, node_id, function_id, error?,
                   failure? {attempt, error_class, traceback, ...}}     -> TaskState
    its history   [each record as written]                             -> attempts
    actor record  {actor_id, class_name, state, name, namespace, node_id, restarts,
                   error, detached, pid, spec (hex msgpack ActorSpec)} -> ActorState
    object record {object_id, size, node_id, owner, state, locations,
                   location_states}                                    -> ObjectState
    node record   {NodeID, Alive, NodeManagerAddress, Resources, start_ts, DeathTime?}
                                                                       -> NodeState
    job record    {JobID, IsDead, pid, StartTime, EndTime?}            -> JobState
    submission    {submission_id, entrypoint, status, message, start_time, end_time,
                   pid} (``rtml job submit``)                          -> JobState

A task whose code raised has the traceback its worker wrote (``failure``, one per
attempt that raised); the other failures have the error its owner wrote (``error``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import msgspec

from rtml.rpc.messages import ActorSpec
from rtml.state.common import (
    ActorState,
    DriverInfo,
    JobState,
    NodeState,
    ObjectState,
    TaskState,
)

TASK_STATES = {"PENDING": "PENDING_NODE_ASSIGNMENT", "FINISHED": "FINISHED",
               "FAILED": "FAILED"}
"""rtml's task status -> Ray's TaskStatus. rtml writes a task's record as it is
submitted (PENDING) and again once it has ended; it writes nothing as it starts."""
ACTOR_STATES = {"PENDING": "PENDING_CREATION", "ALIVE": "ALIVE",
                "RESTARTING": "RESTARTING", "DEAD": "DEAD"}
"""rtml's actor state -> Ray's ActorState."""
ERROR_TYPES = {
    "TaskCancelledError": "TASK_CANCELLED",
    "WorkerCrashedError": "WORKER_DIED",
    "NodeDiedError": "NODE_DIED",
    "ActorDiedError": "ACTOR_DIED",
    "ActorError": "ACTOR_DIED",
    "OwnerDiedError": "OWNER_DIED",
    "ObjectLostError": "OBJECT_LOST",
    "OutOfDiskError": "OUT_OF_DISK_ERROR",
}
"""The class of the error a task failed with, outside its code -> Ray's ErrorType."""
EXECUTION_ERROR = "TASK_EXECUTION_EXCEPTION"
"""Ray's ErrorType of a task whose own code raised."""
_DEPENDENCY_FAILED = "dependency failed"  # the owner's text: an argument's task failed
_DRIVER_EXITED = "the driver exited"  # the head's text (head.service.DRIVER_EXITED)
_UNSCHEDULABLE = "could not be scheduled"  # the owner's text for a lease that failed
_REPR = re.compile(r"^(\w+)\((.*)\)$", re.DOTALL)


def task_state(record: dict[str, Any]) -> TaskState:
    """A task's merged record as a TaskState (all columns)."""
    status = str(record.get("status", ""))
    state = TASK_STATES.get(status, status)
    error_type, error_message = _task_error(record) if state == "FAILED" else (None, None)
    name = str(record.get("name", ""))
    return TaskState(
        task_id=record["task_id"], attempt_number=int(record.get("attempt") or 0),
        name=name, state=state, job_id=str(record.get("job_id", "")),
        type="NORMAL_TASK" if record.get("function_id") else "ACTOR_TASK",
        func_or_class_name=name, node_id=record.get("node_id") or None,
        worker_pid=record.get("worker_pid") or None, error_type=error_type,
        language="PYTHON", creation_time_ms=_ms(record.get("submit_ts")),
        start_time_ms=_ms(record.get("start_ts")), end_time_ms=_ms(record.get("end_ts")),
        error_message=error_message)


def _task_error(record: dict[str, Any]) -> tuple[str, str | None]:
    """(Ray's error type, the message) of a failed task. A task whose code raised has
    no ``error`` in its record but the traceback of its last attempt (``failure``;
    None if that was not recorded)."""
    text = record.get("error")
    if not text:
        failure = record.get("failure")
        if isinstance(failure, dict) and failure.get("attempt") == record.get("attempt"):
            return EXECUTION_ERROR, str(failure.get("traceback") or "") or None
        return EXECUTION_ERROR, None
    text = str(text)
    if text == _DEPENDENCY_FAILED:
        return "DEPENDENCY_RESOLUTION_FAILED", "an argument of this task failed to be made"
    if text == _DRIVER_EXITED:
        return "OWNER_DIED", "its driver (the task's owner) exited before it ran"
    class_name, message = _parse_repr(text)
    if class_name == "RtmlSystemError":
        kind = "TASK_UNSCHEDULABLE_ERROR" if _UNSCHEDULABLE in message else "LOCAL_RAYLET_DIED"
        return kind, message
    return ERROR_TYPES.get(class_name, EXECUTION_ERROR), message


def attempts(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A task's attempts, oldest first, from its records as written
    (``ControlPlane.task_history``): each ``{attempt, status, start_ts, end_ts,
    worker_pid, node_id, error_type, error}`` as far as recorded. An attempt lost with
    its worker or node, and retried, leaves no record of its own."""
    found: dict[int, dict[str, Any]] = {}
    for record in history:
        failure = record.get("failure")
        if isinstance(failure, dict):
            attempt = found.setdefault(int(failure.get("attempt") or 0), {})
            attempt.update(status="FAILED", error_type=EXECUTION_ERROR,
                           error=failure.get("traceback"), end_ts=failure.get("end_ts"),
                           worker_pid=failure.get("worker_pid"), node_id=failure.get("node_id"))
        if "status" not in record or record.get("status") == "PENDING":
            continue  # a submission: no attempt ran yet
        attempt = found.setdefault(int(record.get("attempt") or 0), {})
        fields = {k: record[k] for k in ("status", "start_ts", "end_ts", "worker_pid",
                                         "node_id") if record.get(k) is not None}
        if record.get("error"):
            fields["error_type"], fields["error"] = _task_error(record)
        attempt.update(fields)
    return [{"attempt": n, "status": "PENDING", "start_ts": None, "end_ts": None,
             "worker_pid": None, "node_id": None, "error_type": None, "error": None,
             **found[n]} for n in sorted(found)]


def _parse_repr(text: str) -> tuple[str, str]:
    """``("WorkerCrashedError", "WorkerCrashedError: the worker ...")`` from the repr of
    an exception; ``("", text)`` if it is not one."""
    match = _REPR.match(text)
    if match is None:
        return "", text
    class_name, args = match.groups()
    try:
        value = ast.literal_eval(args) if args else ""
    except (ValueError, SyntaxError):
        return class_name, text
    return class_name, f"{class_name}: {value}" if isinstance(value, str) else text


def actor_state(record: dict[str, Any]) -> ActorState:
    """An actor's record as an ActorState (all columns)."""
    state = str(record.get("state", ""))
    state = ACTOR_STATES.get(state, state)
    death = None
    if state == "DEAD":
        death = {"actor_died_error_context": {
            "error_message": str(record.get("error") or "the actor died")}}
    spec = actor_spec(record)
    return ActorState(
        actor_id=record["actor_id"], class_name=str(record.get("class_name", "")),
        state=state, job_id=str(record.get("job_id", "")), name=str(record.get("name", "")),
        node_id=record.get("node_id") or None, ray_namespace=record.get("namespace"),
        required_resources=None if spec is None else dict(spec.shape), death_cause=death,
        pid=int(record.get("pid") or 0) or None, is_detached=bool(record.get("detached", False)),
        num_restarts=int(record.get("restarts") or 0))


def actor_spec(record: dict[str, Any]) -> ActorSpec | None:
    """The spec an actor's record keeps (hex msgpack); None if it has none readable."""
    spec_hex = record.get("spec")
    if not isinstance(spec_hex, str) or not spec_hex:
        return None
    try:
        return msgspec.msgpack.decode(bytes.fromhex(spec_hex), type=ActorSpec)
    except (ValueError, msgspec.DecodeError):  # another version's spec: leave it out
        return None


def actor_handles(actors: list[dict[str, Any]]) -> set[str]:
    """The ids (hex) of the objects that keep these actors alive: every handle holds
    its actor's one (what Ray lists as an ACTOR_HANDLE reference)."""
    specs = [actor_spec(record) for record in actors]
    return {spec.life_id.hex() for spec in specs if spec is not None and spec.life_id}


def object_state(record: dict[str, Any], node_ips: dict[str, str],
                 handles: set[str]) -> ObjectState:
    """An object's record as an ObjectState; ``node_ips``: node id -> its ip;
    ``handles``: the objects that are actors' handles (``actor_handles``)."""
    object_id = record["object_id"]
    return ObjectState(
        object_id=object_id, object_size=int(record.get("size", -1)),
        task_status="FINISHED",  # a record is made as the object is sealed in a store
        # A record lives while a reference does; rtml does not record which kind.
        reference_type="ACTOR_HANDLE" if object_id in handles else "LOCAL_REFERENCE",
        call_site="disabled",  # Ray's text when call sites are not recorded
        ip=node_ips.get(str(record.get("node_id", ""))),
        owner_id=str(record.get("owner") or "") or None,
        node_id=str(record.get("node_id") or "") or None,
        locations=dict(record.get("location_states") or {}),
        spilled=record.get("state") == "SPILLED")


def node_state(record: dict[str, Any]) -> NodeState:
    """A node's record as a NodeState (all columns)."""
    ip = node_ip(record)
    alive = bool(record.get("Alive"))
    return NodeState(
        node_id=record["NodeID"], node_ip=ip, state="ALIVE" if alive else "DEAD",
        state_message=None, node_name=ip,  # Ray's default name: the node's ip
        resources_total=dict(record.get("Resources") or {}),
        metrics_address=str(record.get("metrics_address") or ""),
        start_time_ms=_ms(record.get("start_ts") or record.get("RegisteredAt")),
        end_time_ms=0 if alive else (_ms(record.get("DeathTime")) or 0))


def node_ip(record: dict[str, Any]) -> str:
    """The host part of a node record's ``NodeManagerAddress``."""
    address = str(record.get("NodeManagerAddress") or "")
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def job_state(record: dict[str, Any]) -> JobState:
    """A job's record as a JobState (all columns)."""
    pid = record.get("pid")
    return JobState(
        job_id=record["JobID"], submission_id=None, entrypoint="", type="DRIVER",
        status="SUCCEEDED" if record.get("IsDead") else "RUNNING", message=None,
        error_type=None, driver_info=DriverInfo(pid=None if pid is None else str(pid)),
        start_time=_ms(record.get("StartTime")), end_time=_ms(record.get("EndTime")))


def submission_state(record: dict[str, Any]) -> JobState:
    """A submitted job's record (``rtml job submit``) as a JobState (all columns)."""
    pid = record.get("pid")
    return JobState(
        job_id=str(record["submission_id"]), submission_id=str(record["submission_id"]),
        entrypoint=str(record.get("entrypoint", "")), type="SUBMISSION",
        status=str(record.get("status", "")), message=str(record.get("message") or "") or None,
        error_type=None, driver_info=DriverInfo(pid=str(pid) if pid else None),
        start_time=int(record.get("start_time") or 0) or None,
        end_time=int(record.get("end_time") or 0) or None)


def _ms(seconds: Any) -> int | None:
    """A time in seconds since the epoch as whole ms; None if there is none."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds:
        return int(seconds * 1000)
    return None
