"""The ``rtml`` command: start, stop and inspect the processes of a node.

::

    rtml start --head        -> cluster.start_head_node -> Redis, head service, node manager
    rtml start --address A   -> hello to A (token check) -> cluster.join_node -> node manager
                                 |
                                 v
                  <session_dir>/session.json  (addresses, pids, Redis host/port)
                                 |
    rtml stop  -----------------+  SIGTERM the recorded pids, SIGKILL after 5 s
    rtml status / list / get / summary / memory / timeline
                  -> ControlPlane(redis host, port, token) -> rtml.state.StateReader
    rtml job submit / status / logs / stop / list -> the head (authenticated; rtml.cli.job)
    rtml logs ... -> the control plane (where) -> the node manager holding it (rtml.cli.logs)
    rtml debug TASK_ID -> a driver here replays the task under pdb (rtml.cli.debug)

Every ``rtml start`` records what it started in its session directory
(``--session-dir``, else ``RTML_SESSION_DIR``, else ``/tmp/rtml-<uid>/session_latest``);
``rtml stop`` stops exactly those processes. Daemons are started in their own
session so they outlive this command. A user mistake prints one line naming the
fix and exits 1.

This module is the parser and the dispatch; the commands live in
:mod:`rtml.cli.start` (start, stop), :mod:`rtml.cli.state` (status, list, get,
summary, memory, timeline), :mod:`rtml.cli.job` (job submission), :mod:`rtml.cli.logs`
(logs) and :mod:`rtml.cli.debug` (replay).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rtml.cli.debug import add_debug_command
from rtml.cli.job import add_job_commands
from rtml.cli.logs import add_logs_command
from rtml.cli.options import CliError, add_session_dir
from rtml.cli.start import cmd_start, cmd_stop
from rtml.cli.state import cmd_get, cmd_list, cmd_memory, cmd_status, cmd_summary, cmd_timeline
from rtml.exceptions import RtmlError
from rtml.state import KINDS, SUMMARIES
from rtml.state.common import DEFAULT_LIMIT

# -- entry points ------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """Run one ``rtml`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse prints its own usage message
        return exc.code if isinstance(exc.code, int) else 2
    if not hasattr(args, "run"):
        parser.print_help()
        return 1
    try:
        return int(args.run(args))
    except (CliError, RtmlError) as exc:
        print(f"rtml: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main(sys.argv[1:]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtml", description="Run and inspect rtml clusters.")
    sub = parser.add_subparsers(title="commands")
    _add_start(sub)
    stop = _command(sub, "stop", cmd_stop, "stop the processes recorded in a session directory")
    add_session_dir(stop)
    status = _command(sub, "status", cmd_status, "nodes, resources, pending demand, actors")
    add_session_dir(status)
    _add_state(sub)
    add_job_commands(sub)
    add_logs_command(sub)
    add_debug_command(sub)
    timeline = _command(sub, "timeline", cmd_timeline, "write a Chrome trace of the tasks")
    timeline.add_argument("-o", "--output", default="timeline.json", help="file to write")
    add_session_dir(timeline)
    _command(sub, "microbenchmark", cmd_microbenchmark, "run benchmarks/micro.py")
    return parser


def _command(sub: Any, name: str, run: Callable[[argparse.Namespace], int],
             help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                     description=help_text)
    parser.set_defaults(run=run)
    return parser


def _add_start(sub: Any) -> None:
    start = _command(sub, "start", cmd_start, "start a head node or join a cluster")
    where = start.add_mutually_exclusive_group(required=True)
    where.add_argument("--head", action="store_true", help="start a new cluster here")
    where.add_argument("--address", help="HOST:PORT of the head to join")
    start.add_argument("--token", default=None,
                       help="cluster token (default: $RTML_TOKEN, or --token-file; a flag "
                            "is visible to every local user in `ps`)")
    start.add_argument("--token-file", default=None, metavar="PATH",
                       help="read the cluster token from this file (e.g. a copy of the "
                            "head's <session>/token)")
    start.add_argument("--port", type=int, default=6380, help="head service port (--head)")
    start.add_argument("--node-ip-address", default=None, metavar="IP",
                       help="address this node listens on and others reach it at "
                            "(default: this machine's address on its default route)")
    start.add_argument("--num-cpus", type=float, default=None)
    start.add_argument("--num-gpus", type=float, default=None)
    start.add_argument("--resources", default=None, help='JSON, e.g. \'{"accel": 2}\'')
    start.add_argument("--object-store-memory", type=int, default=None, metavar="BYTES")
    start.add_argument("--node-timeout-s", type=float, default=None, metavar="SECONDS",
                       help="seconds without a heartbeat before the head declares a node "
                            "dead (--head; default: $RTML_NODE_TIMEOUT_S, else 10)")
    start.add_argument("--redis-address", default=None, metavar="URL",
                       help="--head: use your own Redis, redis://[USER:PASSWORD@]HOST:PORT, "
                            "instead of starting one (rtml then never stops or restarts it)")
    start.add_argument("--tls", action="store_true",
                       help="TLS on this node's TCP listeners (with --head: the cluster's; "
                            "every node must then join with --tls). A self-signed "
                            "certificate is made in the session directory; the handshake "
                            "binds it to the cluster token, so no CA is needed")
    start.add_argument("--tls-cert", default=None, metavar="PEM",
                       help="with --tls: this certificate instead of a new one")
    start.add_argument("--tls-key", default=None, metavar="PEM",
                       help="with --tls-cert: its private key")
    start.add_argument("--dashboard-port", type=int, default=None, metavar="PORT",
                       help="--head: the web dashboard's port (default 8265, or a free one "
                            "if that is taken; 0: no dashboard)")
    start.add_argument("--dashboard-host", default="127.0.0.1", metavar="IP",
                       help="--head: the address the dashboard listens on (default "
                            "127.0.0.1: this machine only; 0.0.0.0: every address)")
    start.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics from this "
                            "node's manager (and, with --head, the head service's at PORT+1; "
                            "0: ports the kernel picks, printed and recorded). Default: off")
    start.add_argument("--metrics-host", default=None, metavar="IP",
                       help="where --metrics-port listens (default 127.0.0.1, for this "
                            "machine only); any other address requires the cluster token "
                            "as 'Authorization: Bearer <token>'")
    start.add_argument("--block", action="store_true",
                       help="stay in the foreground; stop everything on Ctrl-C / SIGTERM")
    add_session_dir(start)


def _add_state(sub: Any) -> None:
    lst = _command(sub, "list", cmd_list, "list cluster state from the control plane")
    lst.add_argument("kind", choices=list(KINDS))
    lst.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                     help="keep rows whose KEY equals VALUE, or with KEY!=VALUE differs "
                          "(repeatable: all must hold; e.g. --filter state=FAILED)")
    lst.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                     help=f"at most this many rows (default {DEFAULT_LIMIT})")
    lst.add_argument("--detail", action="store_true", help="every column")
    _add_format(lst)
    get = _command(sub, "get", cmd_get, "one task (its attempts, its error with traceback) "
                                        "or actor")
    get.add_argument("kind", choices=("task", "actor"))
    get.add_argument("id", help="its hex id, as `rtml list` shows it")
    _add_format(get)
    summary = _command(sub, "summary", cmd_summary, "tasks, actors or objects counted by "
                                                    "name and state")
    summary.add_argument("kind", choices=SUMMARIES)
    _add_format(summary)
    memory = _command(sub, "memory", cmd_memory, "objects in the object stores by owner: "
                                                 "sizes, where they are, spilled bytes")
    _add_format(memory)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("table", "json"), default="table")
    add_session_dir(parser)


# -- rtml microbenchmark -----------------------------------------------------------------------

def cmd_microbenchmark(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "micro.py"
    if not script.is_file():
        print("The microbenchmarks live in the rtml source checkout (benchmarks/micro.py); "
              "run `rtml microbenchmark` from an editable install of it.")
        return 1
    return subprocess.call([sys.executable, str(script)], cwd=script.parents[1])


if __name__ == "__main__":
    entry()
