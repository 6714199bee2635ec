"""Ray's ``ray.actor``: the actor classes and handles, and ``exit_actor``.

    exit_actor() in a method --ActorExit--> the worker's executor --ActorExiting--> head
        (not to be restarted) --> atexit handlers --> the process exits
"""

from __future__ import annotations

from typing import NoReturn

from rtml.core import context
from rtml.core.actors import ActorClass, ActorHandle, ActorMethod
from rtml.exceptions import ActorExit

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "exit_actor"]


def exit_actor() -> NoReturn:
    """End the actor this code runs in, as Ray's: it is not restarted, its atexit
    handlers run, and its calls not answered yet (this one included) raise
    ActorDiedError. Raises TypeError outside an actor."""
    if context.current_actor() is None:
        raise TypeError("exit_actor() can only be called inside an actor's method; to end "
                        "an actor from outside, use rtml.kill(handle) or "
                        "handle.__ray_terminate__.remote()")
    raise ActorExit()
