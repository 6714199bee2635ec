"""rtml.launchpad: Launchpad's programming model on rtml (``import rtml.launchpad as lp``).

A distributed program is a graph of service nodes joined by handles
(``Program``, ``CourierNode``, ``PyNode``...), defined apart from how it is
launched: ``lp.launch(program, launch_type="local_mt" | "local_mp" | "test_mt" |
"test_mp" | "rtml")``, or with no launch type as ``--lp_launch_type`` says.

    import rtml.launchpad --> Launchpad's absl flags defined (when absl is installed)
    lp.launch(program)    --> the nodes run; the interpreter waits for them at exit
                              (a test launch: the test, or its test_case, ends them)
"""

from rtml.launchpad import flags as _flags
from rtml.launchpad.batching import batched_handler
from rtml.launchpad.context import register_stop_handler, stop, stop_event, wait_for_stop
from rtml.launchpad.controller import NodeNotUp
from rtml.launchpad.courier import CourierClient
from rtml.launchpad.launch import LaunchType, launch
from rtml.launchpad.launch.program_handle import ProgramHandle
from rtml.launchpad.nodes import (
    CourierHandle,
    CourierNode,
    Handle,
    MultiThreadingColocation,
    PyClassNode,
    PyNode,
)
from rtml.launchpad.program import Program, make_program

_flags.define()  # before app.run(main) parses the command line

__all__ = [
    "CourierClient", "CourierHandle", "CourierNode", "Handle", "LaunchType",
    "MultiThreadingColocation", "NodeNotUp", "Program", "ProgramHandle", "PyClassNode",
    "PyNode", "batched_handler", "launch", "make_program", "register_stop_handler", "stop",
    "stop_event", "wait_for_stop",
]
