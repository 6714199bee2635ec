"""Every Redis key rtml uses, in one place. Nothing else in rtml spells a key.

Layout, for the default cluster namespace ``rtml``::

    rtml:node:<node_hex>        hash    one node (address, resources, heartbeat)
    rtml:nodes                  set     node ids (hex)
    rtml:job:<job_hex>          hash    one job
    rtml:jobs                   set     job ids (hex)
    rtml:submission:<id>        hash    one submitted job (``rtml job submit``): its
                                        entrypoint, status, times, exit code
    rtml:submissions            set     submission ids
    rtml:function:<fid_hex>     string  pickled function, written once (SET NX)
    rtml:package:<sha256_hex>   string  a runtime_env package (a zip of a working_dir or
                                        py_module, named by its files' hash), written once
    rtml:tasks                  hash    task records: <batch id> -> a batch of them
    rtml:task_batches           zset    <batch id><its record count, 4 bytes> by the time
                                        written: what trimming removes, oldest first
    rtml:object:<oid_hex>       hash    one object (owner, size, locations)
    rtml:objects                set     object ids (hex)
    rtml:actor:<actor_hex>      hash    one actor (spec, state, address, restarts)
    rtml:actors                 set     actor ids (hex)
    rtml:named_actor:<n>:<ns>:<name>   string  actor id (bytes); <n> = len(ns)
    rtml:placement_group:<pg_hex>   hash   one placement group (spec, state, its nodes)
    rtml:placement_groups       set     placement group ids (hex), of the live ones
    rtml:events                 stream  timeline events
    rtml:pending_demand         hash    node id (hex) -> resource shapes it cannot place
    rtml:dashboard              string  the dashboard's URL, written by the dashboard as
                                        it starts (what `rtml status` and joining
                                        drivers show)
    rtml:head_metrics           string  host:port of the head service's /metrics, written
                                        by the head as it starts ("": none; `rtml status`
                                        names it, a node's is in its node hash)

The length prefix in ``named_actor`` keeps ("a:b", "c") and ("a", "b:c") apart.
"""

from __future__ import annotations

DEFAULT_NAMESPACE = "rtml"


class Keys:
    """Key names for one cluster namespace (several clusters may share a Redis).

    Raises:
        ValueError: the namespace is empty or contains ``:`` or whitespace.
    """

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        if not namespace or ":" in namespace or any(c.isspace() for c in namespace):
            raise ValueError(f"cluster namespace {namespace!r} must be non-empty and "
                             f"contain no ':' or whitespace")
        self.namespace = namespace
        p = namespace + ":"
        self._prefix = p
        self.nodes = p + "nodes"
        self.jobs = p + "jobs"
        self.submissions = p + "submissions"
        self.tasks = p + "tasks"
        self.task_batches = p + "task_batches"
        self.objects = p + "objects"
        self.actors = p + "actors"
        self.placement_groups = p + "placement_groups"
        self.events = p + "events"
        self.pending_demand = p + "pending_demand"
        self.dashboard = p + "dashboard"
        self.head_metrics = p + "head_metrics"

    def __repr__(self) -> str:
        return f"Keys({self.namespace!r})"

    def node(self, node_id_hex: str) -> str:
        """Hash of one node."""
        return f"{self._prefix}node:{node_id_hex}"

    def job(self, job_hex: str) -> str:
        """Hash of one job."""
        return f"{self._prefix}job:{job_hex}"

    def submission(self, submission_id: str) -> str:
        """Hash of one submitted job (its id: letters, digits, '_', '.', '-')."""
        return f"{self._prefix}submission:{submission_id}"

    def function(self, fid_hex: str) -> str:
        """String holding one exported (pickled) function."""
        return f"{self._prefix}function:{fid_hex}"

    def package(self, digest_hex: str) -> str:
        """String holding one runtime_env package (``rtml.core.runtime_env``)."""
        return f"{self._prefix}package:{digest_hex}"

    def object(self, oid_hex: str) -> str:
        """Hash of one object's metadata."""
        return f"{self._prefix}object:{oid_hex}"

    def actor(self, actor_hex: str) -> str:
        """Hash of one actor."""
        return f"{self._prefix}actor:{actor_hex}"

    def placement_group(self, pg_hex: str) -> str:
        """Hash of one placement group."""
        return f"{self._prefix}placement_group:{pg_hex}"

    def named_actor(self, namespace: str, name: str) -> str:
        """String mapping (actor namespace, name) to an actor id."""
        return f"{self._prefix}named_actor:{len(namespace)}:{namespace}:{name}"
