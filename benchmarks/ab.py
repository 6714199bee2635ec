"""Paired A/B of two rtml source trees, resistant to this machine's drifting speed.

    python benchmarks/ab.py OLD_TREE NEW_TREE [--rounds 16] [--sessions 4]
                            [--rows "actor sync 400,..."]

Each tree runs in its own driver process with its own embedded cluster; the parent asks
them in turn (A B, B A, ...) for one short measurement of a row, so each pair of answers
is taken seconds apart. The rounds are split over ``--sessions`` pairs of fresh clusters:
one pair's processes land on the cores as they happen to, and that luck lasts for the
pair's life (one pair once read 1/14 rounds won, the next 9/12, for the same two trees).
It prints, per row, the median of each side and the median of the per-round ratios
new/old, with how many rounds the new tree won. Two identical trees read 0.95-1.07 on
the sync rows even over 32 rounds in 8 sessions: smaller effects need more rounds.

A tree is a checkout of the repository (``git worktree add``), whose ``rtml`` package is
put first on ``PYTHONPATH`` and which is the working directory of its driver, so its
cluster's daemons and workers run its code too (compile it first:
``python -m compileall``).

Rows: ``task|actor sync N`` (median us of N calls, one at a time),
``task|actor burst N`` (calls per second, N submitted 1,000 at a time) and ``put sync
N`` (median us of N ``get(put(...))`` of 1 MiB, which lives in shared memory).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROWS = "task sync 400,actor sync 400,task burst 5000,actor burst 3000"


def serve() -> None:
    """The child: answer one measurement per line read from stdin."""
    import rtml

    rtml.init(num_cpus=2)

    @rtml.remote
    def noop() -> None:
        return None

    @rtml.remote
    class Actor:
        def noop(self) -> None:
            return None

    actor = Actor.remote()
    rtml.get([noop.remote() for _ in range(2000)])
    rtml.get([actor.noop.remote() for _ in range(2000)])
    mebibyte = bytes(1 << 20)  # a put of it goes into shared memory
    submit = {"task": noop.remote, "actor": actor.noop.remote,
              "put": lambda: rtml.put(mebibyte)}
    print("ready", flush=True)
    for line in sys.stdin:
        kind, mode, count = line.split()
        sub, n = submit[kind], int(count)
        if mode == "sync":
            times = []
            for _ in range(n):
                start = time.perf_counter_ns()
                rtml.get(sub())
                times.append(time.perf_counter_ns() - start)
            print(statistics.median(times) / 1e3, flush=True)
        else:
            start = time.perf_counter()
            for _ in range(n // 1000):
                rtml.get([sub() for _ in range(1000)])
            print(n / (time.perf_counter() - start), flush=True)
    rtml.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="source tree A (the baseline)")
    parser.add_argument("new", help="source tree B")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=4,
                        help="pairs of fresh clusters the rounds are split over")
    parser.add_argument("--rows", default=ROWS, help=f"comma-separated (default: {ROWS})")
    args = parser.parse_args()
    rows = args.rows.split(",")
    sessions = max(1, min(args.sessions, args.rounds))
    print(f"A/B {args.old} -> {args.new}, {args.rounds} rounds in {sessions} sessions, "
          f"load {os.getloadavg()[0]:.2f}")
    got: dict[str, dict[str, list[float]]] = {row: {"old": [], "new": []} for row in rows}
    for session in range(sessions):
        rounds = args.rounds // sessions + (session < args.rounds % sessions)
        sides = ("old", "new") if session % 2 == 0 else ("new", "old")
        children: dict[str, subprocess.Popen[str]] = {}
        try:
            for side in sides:
                children[side] = _start(getattr(args, side), side)
            for row in rows:
                for r in range(rounds):
                    for side in sides if r % 2 == 0 else sides[::-1]:
                        got[row][side].append(_ask(children[side], row))
        finally:  # a driver that failed, or an interrupt, must not leave the other's cluster
            for child in children.values():
                assert child.stdin is not None
                child.stdin.close()  # the driver shuts its cluster down at end of input
                child.wait()
    for row in rows:
        old, new = got[row]["old"], got[row]["new"]
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        latency = " sync " in f" {row} "
        wins = sum((x < 1) if latency else (x > 1) for x in ratios)
        unit = "us" if latency else "/s"
        print(f"{row:18s} old {statistics.median(old):9.1f} {unit}  "
              f"new {statistics.median(new):9.1f} {unit}  "
              f"new/old {statistics.median(ratios):.3f}  (new better in {wins}/{args.rounds})",
              flush=True)
    return 0


def _start(tree: str, side: str) -> subprocess.Popen[str]:
    """A driver serving measurements of ``tree``, its cluster up and warm."""
    tree = os.path.abspath(tree)
    # Run in the tree too: the cluster's daemons and workers start with ``python -m``,
    # which puts the working directory first on sys.path, ahead of PYTHONPATH.
    env = dict(os.environ, PYTHONPATH=tree)
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env, cwd=tree)
    assert child.stdin is not None and child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        child.wait()
        raise SystemExit(f"the {side} tree's driver did not start")
    return child


def _ask(child: subprocess.Popen[str], row: str) -> float:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(row + "\n")
    child.stdin.flush()
    return float(child.stdout.readline())


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
        sys.exit(0)
    sys.exit(main())
