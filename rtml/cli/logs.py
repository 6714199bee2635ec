"""``rtml logs``: any node's log files, read through its node manager (``rtml.logs``).

::

    rtml logs                         every alive node's log files (name, size, pid)
    rtml logs head | node-manager | FILE [--node ID]
    rtml logs --task ID | --actor ID | --worker ID | --pid PID
        [--tail N] [--follow] [--err]
                                      -> LogReader.locate -> the node manager of the node
                                         that holds it --ReadLog--> the text, on stdout

A worker writes what its code prints to ``worker-<id>-out.log`` (what ``--task`` and
``--actor`` show) and rtml's own records to ``worker-<id>.log`` (``--err`` shows those).
Without ``--node``, a daemon's file is read on this session's node (the node manager's;
the head's wherever it runs).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rtml.cli.options import CliError, add_session_dir, session_of
from rtml.cli.state import control_plane
from rtml.logs import MAX_CHUNK, LogReader, LogSource


def add_logs_command(sub: Any) -> None:
    logs = sub.add_parser("logs", help="read the log of a task, actor, worker or daemon on "
                          "any node", description=__doc__.split("::")[0].strip())
    logs.set_defaults(run=cmd_logs)
    logs.add_argument("name", nargs="?", default="",
                      help="a daemon (head, node-manager) or a log file name; none: list "
                           "the files")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--task", default="", metavar="ID", help="the worker log of a task")
    which.add_argument("--actor", default="", metavar="ID", help="an actor's worker log")
    which.add_argument("--worker", default="", metavar="ID", help="a worker's log (id or "
                       "its first 12 hex digits)")
    which.add_argument("--pid", type=int, default=0, help="the log of the worker of that pid")
    logs.add_argument("--node", default="", metavar="ID", help="the node (id or prefix)")
    logs.add_argument("--err", action="store_true",
                      help="a worker's own records (worker-<id>.log) rather than what its "
                           "code printed (worker-<id>-out.log)")
    logs.add_argument("--tail", type=int, default=-1, metavar="N",
                      help="only the last N lines")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing what is written (Ctrl-C stops)")
    add_session_dir(logs)


def cmd_logs(args: argparse.Namespace) -> int:
    plane, record = control_plane(args)
    token = session_of(args).read_token() or os.environ.get("RTML_TOKEN", "")
    try:
        reader = LogReader(plane, token)
        by_worker = args.task or args.actor or args.worker or args.pid
        if not by_worker and not args.name:
            return _list(reader, args.node)
        node = args.node
        if not node and args.name in ("node-manager", "node_manager"):
            node = str(record.get("node_id", ""))
        source = _pick(reader.locate(task=args.task, actor=args.actor, worker=args.worker,
                                     pid=args.pid, name=args.name, node=node),
                       by_worker, args.err)
        _print(reader, source, args.tail, args.follow)
    finally:
        plane.close()
    return 0


def _list(reader: LogReader, node: str) -> int:
    for record in reader.nodes(node):
        print(f"node {record['NodeID']} ({record['NodeManagerAddress']}):")
        for file in reader.files(record):
            pid = f"  pid {file.pid}" if file.pid else ""
            print(f"  {file.name:<40} {file.size:>10} B{pid}")
    return 0


def _pick(found: list[LogSource], by_worker: object, err: bool) -> LogSource:
    """The one file to show: a worker's output (or its records, ``err``), else the one
    file found (a daemon's on several nodes: ask for ``--node``)."""
    if by_worker:
        wanted = [s for s in found if s.name.endswith("-out.log") != err]
        if wanted:
            return wanted[0]
    names = {(s.node_id, s.name) for s in found}
    if len(names) > 1:
        where = ", ".join(f"{s.name} on node {s.node_id[:12]}" for s in found)
        raise CliError(f"several files match ({where}); pass --node ID, or the file name")
    return found[0]


def _print(reader: LogReader, source: LogSource, tail: int, follow: bool) -> None:
    out = sys.stdout.buffer
    print(f"==> {source.name} on node {source.node_id[:12]} <==", flush=True)
    if tail >= 0:
        data, offset = reader.tail(source, tail)
        out.write(data)
    else:
        offset = 0
        while True:
            chunk = reader.read(source, offset, MAX_CHUNK)
            out.write(chunk.data)
            offset = chunk.offset + len(chunk.data)
            if offset >= chunk.size or not chunk.data:
                break
    out.flush()
    if follow:
        for data in reader.follow(source, offset):
            out.write(data)
            out.flush()

