"""``rtml status / list / get / summary / memory / timeline``: cluster state read from
Redis through the state reader the dashboard and ``rtml.util.state`` use too.

::

    <session_dir>/session.json (Redis host/port) + token
        -> ControlPlane -> rtml.state.StateReader -> cluster, rows, one task or actor,
           summaries, objects by owner, trace events
        -> text (rtml.cli.render) or JSON

These commands only read. The session's record (written by ``rtml start`` on
the head or on a joined node) says where the control plane listens.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rtml.cli import render
from rtml.cli.options import CliError, session_of
from rtml.control_plane import ControlPlane, RedisAddress, unreachable
from rtml.exceptions import RtmlSystemError
from rtml.state import StateReader
from rtml.state.common import parse_filter

# -- reading the control plane -----------------------------------------------------------------


def control_plane(args: argparse.Namespace) -> tuple[ControlPlane, dict[str, Any]]:
    """The control plane of the cluster this session's node belongs to, and the
    session's record. Raises CliError naming the fix when there is none to reach."""
    session = session_of(args)
    record = session.read_record()
    if record is None:
        raise CliError(f"no rtml node is recorded in {session.root}; start one with "
                       f"`rtml start --head`, or pass --session-dir / set RTML_SESSION_DIR")
    token = session.read_token() or os.environ.get("RTML_TOKEN")
    if not token:
        raise CliError(f"no token file in {session.root}; set RTML_TOKEN")
    if not record.get("redis_host") or not record.get("redis_port"):
        raise CliError(f"the record in {session.root} does not say where the control plane "
                       f"is; run this command with the head node's --session-dir")
    plane = ControlPlane.at(RedisAddress.from_info(record), token)
    try:
        plane.check()
    except RtmlSystemError as exc:
        if not unreachable(exc):
            raise
        plane.close()
        raise CliError(f"the control plane: {exc}") from None
    return plane, record


@contextmanager
def _reader(args: argparse.Namespace) -> Iterator[tuple[StateReader, dict[str, Any]]]:
    """A state reader of the session's cluster; a bad filter or id becomes a CliError."""
    plane, record = control_plane(args)
    try:
        yield StateReader(plane), record
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        plane.close()


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


# -- rtml status ------------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    with _reader(args) as (reader, record):
        cluster = reader.cluster()
        url = reader.plane.dashboard_url()
        head_metrics = reader.plane.head_metrics_address()
    print(render.status(cluster, record["head_address"], url, head_metrics))
    return 0


# -- rtml list / get / summary / memory ------------------------------------------------------

def cmd_list(args: argparse.Namespace) -> int:
    filters = _filters(args.filter)
    if args.limit < 0:
        raise CliError(f"--limit must be 0 or more, got {args.limit}")
    with _reader(args) as (reader, _):
        rows = reader.listing(args.kind, filters, args.limit, args.detail)
    if args.format == "json":
        _print_json([row.asdict() for row in rows])
    elif rows:
        print(render.table([row.asdict() for row in rows],
                           type(rows[0]).list_columns(args.detail)))
    else:
        print(f"No {args.kind}.")
    return 0


def _filters(items: list[str]) -> list[tuple[str, str, Any]]:
    try:
        return [parse_filter(item) for item in items]
    except ValueError as exc:
        raise CliError(f"--filter: {exc}") from None


def cmd_get(args: argparse.Namespace) -> int:
    read: Callable[[StateReader, str], dict[str, Any] | None]
    read = StateReader.task if args.kind == "task" else StateReader.actor
    with _reader(args) as (reader, _):
        found = read(reader, args.id)
    if found is None:
        raise CliError(f"no {args.kind} {args.id} is recorded in the control plane; "
                       f"`rtml list {args.kind}s` shows those that are")
    if args.format == "json":
        _print_json(found)
    else:
        print(render.task(found) if args.kind == "task" else render.record(found))
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    with _reader(args) as (reader, _):
        summary = reader.summarize(args.kind)
    if args.format == "json":
        _print_json(summary)
    else:
        print(render.summary(args.kind, summary["cluster"]))
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    with _reader(args) as (reader, _):
        memory = reader.memory()
    if args.format == "json":
        _print_json(memory)
    else:
        print(render.memory(memory))
    return 0


# -- rtml timeline -----------------------------------------------------------------------------

def cmd_timeline(args: argparse.Namespace) -> int:
    with _reader(args) as (reader, _):
        events = reader.timeline()
    with open(args.output, "w") as f:
        json.dump(events, f)
    tasks = sum(1 for e in events if e.get("cat") in ("task", "actor_call"))
    print(f"Wrote {len(events)} trace event(s) ({tasks} task(s) and actor call(s), their "
          f"phases, leases and transfers) to {args.output}; open it in chrome://tracing or "
          f"https://ui.perfetto.dev")
    return 0
