"""Where a task burst's CPU goes: CPU time per task in each process of an embedded
cluster (and in each thread of the driver), read from /proc before and after.

    python benchmarks/cpu_split.py [--tree PATH] [--tasks 100000] [--actor] [--repeats 3]

A burst's throughput on this 2-core machine is bounded by the CPU all its processes use
together, so a change that slows bursts shows here as microseconds a task in some
process: the owner's main thread, its writer thread, the worker, the node manager, Redis.
Unlike a throughput A/B it names the process that pays, and it is steadier (CPU time
does not count the time a process waits for a core). ``--tree`` measures another
checkout (``git worktree add``, compiled as ``ab.py`` says): its ``rtml`` is imported, and
it is the working directory, so that the cluster's daemons and workers (started with
``python -m``, whose first path is the working directory) run its code too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(stat_path: Path) -> float:
    """utime + stime of a process or thread, in seconds."""
    fields = stat_path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _name(pid: int) -> str:
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    text = " ".join(part.decode(errors="replace") for part in cmd if part)
    for key, label in (("redis", "redis"), ("valkey", "redis"), ("rtml.head", "head"),
                       ("node.main", "node manager"), ("rtml.node", "node manager"),
                       ("worker", "worker"), ("dashboard", "dashboard"),
                       ("supervisor", "supervisor")):
        if key in text:
            return label
    return text[:40]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children[ppid].append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children[pid]:
            found.append(child)
            todo.append(child)
    return found


def _snapshot() -> dict[str, float]:
    """CPU seconds by label: each driver thread (by name), each other process (by kind)."""
    got: dict[str, float] = defaultdict(float)
    me = os.getpid()
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    for task in Path(f"/proc/{me}/task").iterdir():
        try:
            name = names.get(int(task.name), "other")
            got[f"driver: {name}"] += _cpu(task / "stat")
        except OSError:
            continue
    for pid in _descendants(me):
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                got[_name(pid)] += _cpu(task / "stat")
        except OSError:
            continue
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--actor", action="store_true", help="actor calls, not tasks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    tree = os.path.abspath(args.tree)
    os.chdir(tree)
    sys.path.insert(0, tree)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [tree, *filter(None, [os.environ.get("PYTHONPATH")])])

    import rtml

    rtml.init(num_cpus=2, include_dashboard=False)

    @rtml.remote
    def noop() -> None:
        return None

    @rtml.remote
    class Actor:
        def noop(self) -> None:
            return None

    call = Actor.remote().noop.remote if args.actor else noop.remote
    rtml.get([call() for _ in range(5000)])
    per_task: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.repeats):
        before = _snapshot()
        for _ in range(args.tasks // 1000):
            rtml.get([call() for _ in range(1000)])
        after = _snapshot()
        for label in after:
            per_task[label].append((after[label] - before.get(label, 0.0)) / args.tasks * 1e6)
    rtml.shutdown()
    print(f"{rtml.__file__}: us of CPU a {'actor call' if args.actor else 'task'} "
          f"(median of {args.repeats} bursts of {args.tasks})")
    total = 0.0
    for label, values in sorted(per_task.items(), key=lambda kv: -statistics.median(kv[1])):
        value = statistics.median(values)
        total += value
        if value >= 0.05:
            print(f"  {label:32s} {value:6.2f}")
    print(f"  {'all':32s} {total:6.2f}")


if __name__ == "__main__":
    main()
