"""rtml: a Ray-style distributed execution engine for real-time machine learning."""

from rtml import exceptions
from rtml.api import (
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_actor,
    get_runtime_context,
    init,
    is_initialized,
    kill,
    nodes,
    put,
    remote,
    shutdown,
    timeline,
    wait,
)
from rtml.core.actors import ActorHandle, method
from rtml.core.object_ref import ObjectRef
from rtml.core.options import NodeAffinitySchedulingStrategy

__version__ = "0.1.0"

__all__ = [
    "ActorHandle", "NodeAffinitySchedulingStrategy", "ObjectRef", "available_resources",
    "cancel", "cluster_resources", "exceptions", "get", "get_actor", "get_runtime_context",
    "init", "is_initialized", "kill", "method", "nodes", "put", "remote", "shutdown",
    "timeline", "wait",
]
