"""The head protocol: node managers and clients (drivers, workers, the CLI) and the head
service.

    node manager --RegisterNode / NodeTransferReady / NodeHeartbeat--> head
                 <--NodeTable / NodeDied / Shutdown--
                 --RegisterNode(rejoin, the actors it hosts)--> a head that restarted
    node manager --SpillLease / CancelLeaseRequest--> <--LeasePlaced (the global scheduler)
    node manager <--StartActor / KillActorWorker-- --ActorStarted / ActorWorkerDied-->
    client --RegisterJob / CreateActor / GetActorInfo / KillActor / GetClusterInfo-->
           <--ActorInfo / ClusterInfo / NodeDied / WorkerOutput (its job's prints)
    driver --FlushOutput--> head --FlushOutput--> every node manager
           <--OutputFlushed-- (once each node manager's OutputFlushed came back: every
                              print its workers sent before is delivered ahead of it)
    cli    --SubmitJob / StopJob / DeleteJob--> <--JobAnswer   (job submission: the head
           --ListJobs--> <--JobList                             runs the entrypoint)
           --GetJobLogs(follow)--> <--JobLogs ... JobLogs(end)
"""

from __future__ import annotations

import msgspec

from rtml.ids import (
    NO_GROUP,
    NO_NODE,
    UNKNOWN_JOB,
    ActorID,
    JobID,
    NodeID,
    ObjectID,
    PlacementGroupID,
    WorkerID,
)
from rtml.rpc.protocols.base import ActorSpec, Msg


class HostedActor(msgspec.Struct, array_like=True, gc=False):
    """An actor a node manager runs or is starting, as it tells a restarted head."""

    spec: ActorSpec
    address: str = ""  # "": its constructor has not finished yet
    tcp_address: str = ""


class RegisterNode(Msg, tag=50):
    node_id: NodeID
    address: str  # host:port of the node manager (TCP)
    unix_path: str
    resources: dict[str, float]
    session_dir: str
    transfer_address: str = ""  # gRPC object transfer; sent later by NodeTransferReady
    tls_cert: bytes = b""  # its TLS certificate (PEM), which pulls from it trust; b"": none
    rejoin: bool = False  # the head it registered with went away; this one took over
    actors: list[HostedActor] = []  # on rejoin: every actor it runs or is starting
    groups: list[PlacementGroupID] = []  # on rejoin: the placement groups it holds bundles of
    metrics_address: str = ""  # host:port of its /metrics ("": not served)


class NodeTransferReady(Msg, tag=64):
    node_id: NodeID
    transfer_address: str


class NodeEntry(msgspec.Struct, array_like=True, gc=False):
    node_id: NodeID
    address: str
    transfer_address: str
    alive: bool
    tls_cert: bytes = b""  # the certificate its transfer server shows (PEM); b"": no TLS


class NodeTable(Msg, tag=65):
    """The head's node list, sent to every node manager when it changes."""
    nodes: list[NodeEntry]


class NodeDied(Msg, tag=66):
    """Sent to node managers and drivers: tasks, objects and actors there are gone.

    ``kept``: set by a node manager telling its clients, the objects whose primary was there
    and whose copy here is the primary now (nothing to rebuild for them)."""
    node_id: NodeID
    reason: str
    kept: list[ObjectID] = []


class SpillLease(Msg, tag=67):
    """A node manager asks the global scheduler where a lease request should go."""
    req_id: int
    shape: dict[str, float]
    strategy: str
    preferred_node: NodeID
    must_move: bool  # the origin cannot ever run it (infeasible there, or pinned elsewhere)


class LeasePlaced(Msg, tag=68):
    """The global scheduler's answer: a node (possibly the origin itself), or an error."""
    req_id: int
    node_id: NodeID
    address: str
    error: str = ""
    infeasible: bool = False  # no node fits yet: an answer follows when one joins


class NodeHeartbeat(Msg, tag=51):
    node_id: NodeID
    available: dict[str, float]
    pending_shapes: list[dict[str, float]] = []
    total: dict[str, float] | None = None  # when it changed (placement group bundles)
    tasks: dict[str, int] | None = None  # its workers' task counters (while it serves metrics)


class RegisterJob(Msg, tag=52):
    job_id: JobID
    pid: int
    namespace: str
    cwd: str
    default_lifetime: str = ""  # JobConfig's default_actor_lifetime ("" non_detached)
    metadata: dict[str, str] = {}


class GetJobConfig(Msg, tag=98):
    """What a worker creating an actor for a job asks of it, once per job."""

    req_id: int
    job_id: JobID


class JobConfigInfo(Msg, tag=99):
    req_id: int
    default_lifetime: str = ""


class CreateActor(Msg, tag=53):
    req_id: int  # 0: no reply wanted
    spec: ActorSpec
    get_if_exists: bool = False


class GetActorInfo(Msg, tag=54):
    req_id: int
    actor_id: ActorID
    name: str = ""
    namespace: str = ""
    wait_ready: bool = True
    stale_address: str = ""  # wait for an address other than this one (a restart)
    job_id: JobID = UNKNOWN_JOB  # a name without a namespace is looked up in this job's


class ActorInfo(Msg, tag=55):
    req_id: int
    actor_id: ActorID
    state: str  # PENDING | ALIVE | RESTARTING | DEAD | MISSING
    address: str = ""
    error: str = ""
    spec: ActorSpec | None = None
    tcp_address: str = ""
    node_id: NodeID = NO_NODE


class KillActor(Msg, tag=56):
    actor_id: ActorID
    no_restart: bool = True
    reason: str = ""  # why, for its callers' ActorDiedError (default: rtml.kill())


OUT_OF_SCOPE = "all its handles went out of scope"
"""The reason an actor ends when its life object is freed (see rtml.core.actors)."""


class StartActor(Msg, tag=57):
    spec: ActorSpec
    restarts: int = 0  # times it was started before (its runtime context tells it)


class ActorStarted(Msg, tag=58):
    actor_id: ActorID
    worker_id: WorkerID
    address: str
    error: str = ""
    tcp_address: str = ""
    node_id: NodeID = NO_NODE
    pid: int = 0  # the actor's worker process (for the state API and the dashboard)


class ActorWorkerDied(Msg, tag=59):
    actor_id: ActorID
    reason: str


class KillActorWorker(Msg, tag=60):
    actor_id: ActorID


class GetClusterInfo(Msg, tag=61):
    req_id: int


class NodeInfo(msgspec.Struct, array_like=True, gc=False):
    """One node as the head knows it."""

    node_id: NodeID
    alive: bool
    address: str  # its node manager's host:port
    resources: dict[str, float]
    available: dict[str, float]
    session_dir: str

    def as_ray(self) -> dict[str, object]:
        """In ``rtml.nodes()``'s (Ray's) field names."""
        return {"NodeID": self.node_id.hex(), "Alive": self.alive,
                "NodeManagerAddress": self.address, "Resources": dict(self.resources),
                "Available": dict(self.available), "SessionDir": self.session_dir}


class ClusterInfo(Msg, tag=62):
    req_id: int
    nodes: list[NodeInfo]


class Shutdown(Msg, tag=63):
    pass


class FlushOutput(Msg, tag=76):
    req_id: int


class OutputFlushed(Msg, tag=77):
    req_id: int
    node_id: NodeID = NO_NODE  # the node manager answering the head


class ActorExiting(Msg, tag=80):
    """An actor called exit_actor(): not to be restarted; answered with ActorInfo."""

    req_id: int
    actor_id: ActorID


class CreatePlacementGroup(Msg, tag=81):
    pg_id: PlacementGroupID
    bundles: list[dict[str, float]]
    strategy: str
    name: str = ""
    namespace: str = ""
    job_id: JobID = UNKNOWN_JOB
    detached: bool = False


class RemovePlacementGroup(Msg, tag=82):
    pg_id: PlacementGroupID


class GetPlacementGroup(Msg, tag=83):
    req_id: int
    pg_id: PlacementGroupID = NO_GROUP  # b"": by name, in namespace (or job_id's)
    name: str = ""
    namespace: str = ""
    job_id: JobID = UNKNOWN_JOB


class PlacementGroupInfo(Msg, tag=84):
    req_id: int
    pg_id: PlacementGroupID
    state: str  # PENDING | CREATED | REMOVED | MISSING
    bundles: list[dict[str, float]] = []
    strategy: str = ""
    name: str = ""
    nodes: list[NodeID] = []  # of each bundle, once created


class PrepareBundles(Msg, tag=85):
    """Head to node manager: take these bundles from the pool (if they fit now)."""

    pg_id: PlacementGroupID
    bundles: list[tuple[int, dict[str, float]]]
    round: int = 0  # which placement of the group (an answer to an older one is stale)


class BundlesPrepared(Msg, tag=86):
    pg_id: PlacementGroupID
    node_id: NodeID
    ok: bool
    round: int = 0


class CommitBundles(Msg, tag=87):
    pg_id: PlacementGroupID


class ReleaseBundles(Msg, tag=88):
    pg_id: PlacementGroupID


class ListNamedActors(Msg, tag=78):
    req_id: int
    namespace: str = ""  # "": job_id's (asked from a task or an actor)
    all_namespaces: bool = False
    job_id: JobID = UNKNOWN_JOB


class NamedActors(Msg, tag=79):
    req_id: int
    names: list[tuple[str, str]]  # (namespace, name) of each live named actor


class JobRecord(msgspec.Struct, array_like=True, gc=False):
    """One submitted job (``rtml job``, ``JobSubmissionClient``) as the head records it."""

    submission_id: str
    entrypoint: str
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED (rtml.job_submission)
    message: str
    start_time: int  # ms since the epoch, as Ray's
    end_time: int = 0  # 0: not ended
    metadata: dict[str, str] = {}
    runtime_env_json: str = ""
    entrypoint_num_cpus: float = 0.0
    exit_code: int | None = None
    pid: int = 0  # of its entrypoint, while it runs


class SubmitJob(Msg, tag=90):
    """Run ``entrypoint`` (a shell command) on the head's node; answered with JobAnswer."""

    req_id: int
    submission_id: str  # "": the head names it
    entrypoint: str
    working_dir: bytes = b""  # a zip of the directory it runs in (rtml.job_submission)
    runtime_env_json: str = ""
    metadata: dict[str, str] = {}
    entrypoint_num_cpus: float = 0.0


class StopJob(Msg, tag=91):
    """SIGTERM the job's process group, SIGKILL after a grace period; JobAnswer(ok: it
    was running)."""

    req_id: int
    submission_id: str


class DeleteJob(Msg, tag=92):
    """Forget an ended job, its record, log and working dir; JobAnswer."""

    req_id: int
    submission_id: str


class JobAnswer(Msg, tag=93):
    req_id: int
    ok: bool
    submission_id: str = ""
    error: str = ""  # the request was refused (no such job, a bad submission...)


class ListJobs(Msg, tag=94):
    req_id: int
    submission_id: str = ""  # "": every job


class JobList(Msg, tag=95):
    req_id: int
    jobs: list[JobRecord]
    error: str = ""


class GetJobLogs(Msg, tag=96):
    """A job's log, in JobLogs chunks; with ``follow``, then what it prints until it ends."""

    req_id: int
    submission_id: str
    follow: bool = False


class JobLogs(Msg, tag=97):
    req_id: int
    data: bytes
    end: bool = False  # the last chunk: the log is complete (the job ended, or no follow)
    error: str = ""


Message = (
    RegisterNode | NodeTransferReady | NodeTable | NodeDied | SpillLease | LeasePlaced |
    NodeHeartbeat | RegisterJob | CreateActor | GetActorInfo | ActorInfo | KillActor |
    StartActor | ActorStarted | ActorWorkerDied | KillActorWorker | GetClusterInfo |
    ClusterInfo | Shutdown | FlushOutput | OutputFlushed | ListNamedActors | NamedActors |
    ActorExiting | CreatePlacementGroup | RemovePlacementGroup | GetPlacementGroup |
    PlacementGroupInfo | PrepareBundles | BundlesPrepared | CommitBundles | ReleaseBundles |
    GetJobConfig | JobConfigInfo |
    SubmitJob | StopJob | DeleteJob | JobAnswer | ListJobs | JobList | GetJobLogs | JobLogs
)
"""Every message of this protocol."""
