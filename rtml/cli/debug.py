"""``rtml debug TASK_ID``: a past task run again here, under pdb (``rtml.debug``).

::

    rtml debug TASK_ID [--no-pdb]  -> rtml.init(address="auto") in this session
                                   -> rtml.debug.replay: the call rebuilt from the control
                                      plane's lineage, run in this terminal under pdb
                                   -> "result: <repr>", or the task's traceback (exit 1)
"""

from __future__ import annotations

import argparse
import bdb
import os
import sys
import traceback
from typing import Any

from rtml.cli.options import add_session_dir, session_of


def add_debug_command(sub: Any) -> None:
    debug = sub.add_parser("debug", help="replay a past task here, under pdb",
                           description=__doc__.split("::")[0].strip())
    debug.set_defaults(run=cmd_debug)
    debug.add_argument("task_id", help="the task's id, as `rtml list tasks` shows it")
    debug.add_argument("--no-pdb", action="store_true",
                       help="run it without the debugger (print its result or traceback)")
    add_session_dir(debug)


def cmd_debug(args: argparse.Namespace) -> int:
    import rtml
    from rtml.debug import ReplayError, replay

    os.environ["RTML_SESSION_DIR"] = str(session_of(args).root)
    if os.getcwd() not in sys.path:  # the user's modules import, as in their driver
        sys.path.insert(0, os.getcwd())
    rtml.init(address="auto", log_to_driver=False)
    try:
        value = replay(args.task_id, debugger=not args.no_pdb)
    except bdb.BdbQuit:
        print("quit: the task was not run to its end")
        return 1
    except ReplayError:
        raise  # (printed as rtml: <why>)
    except Exception as exc:  # the task's own error: its traceback is the answer
        traceback.print_exception(exc)
        print(f"task raised {type(exc).__name__}: {exc}")
        return 1
    finally:
        rtml.shutdown()
    print(f"result: {value!r}")
    return 0
