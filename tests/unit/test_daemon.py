"""What every daemon entry shares (rtml.daemon): its task group, its readiness pipe, dying
with its launcher."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from rtml.daemon import ReadyPipe, run_until_stopped


def test_the_group_runs_until_stopped_and_cancels_the_loops() -> None:
    ticks: list[int] = []
    cancelled = asyncio.Event()

    async def loop() -> None:
        try:
            while True:
                ticks.append(1)
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def scenario() -> None:
        stopped = asyncio.Event()
        asyncio.get_running_loop().call_later(0.1, stopped.set)
        await asyncio.wait_for(run_until_stopped(stopped, loop()), 5)
        assert cancelled.is_set() and len(ticks) >= 3

    asyncio.run(scenario())


def test_a_loop_that_fails_stops_the_group_with_its_error() -> None:
    others_cancelled = asyncio.Event()

    async def failing() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("a worker id nobody knows")

    async def other() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            others_cancelled.set()
            raise

    async def scenario() -> None:
        with pytest.raises(KeyError, match="nobody knows"):
            await asyncio.wait_for(run_until_stopped(asyncio.Event(), failing(), other()), 5)
        assert others_cancelled.is_set()

    asyncio.run(scenario())


def test_a_task_may_just_return() -> None:
    async def scenario() -> None:
        stopped = asyncio.Event()

        async def once() -> None:
            stopped.set()

        await asyncio.wait_for(run_until_stopped(stopped, once()), 5)

    asyncio.run(scenario())


def test_the_ready_pipe_carries_one_line_once() -> None:
    read_fd, write_fd = os.pipe()
    ready = ReadyPipe(write_fd)
    ready.report("ok 127.0.0.1:1")
    other_read, other_write = os.pipe()  # may reuse the closed fd's number
    try:
        ready.report("error see head.log")  # dropped: must not reach whatever fd is there now
        os.close(other_write)
        assert os.read(other_read, 100) == b""
        assert os.read(read_fd, 100) == b"ok 127.0.0.1:1\n"
        assert os.read(read_fd, 100) == b""  # closed after the one line
    finally:
        os.close(read_fd)
        os.close(other_read)


@pytest.mark.parametrize("parent", ["right", "gone"])
def test_die_with_parent_also_when_the_parent_is_already_gone(parent: str) -> None:
    # The child names its parent's pid; "gone" names another pid, as when the real
    # parent exited before the request took effect (the child was adopted).
    code = ("import os; from rtml.daemon import die_with_parent; "
            f"die_with_parent(os.getppid() {'+ 0' if parent == 'right' else '+ 1'}); "
            "print('alive')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    if parent == "right":
        assert (result.returncode, result.stdout) == (0, "alive\n")
    else:
        assert (result.returncode, result.stdout) == (-9, "")


def test_a_daemon_that_fails_says_why_on_its_ready_pipe_and_exits_1(capsys) -> None:
    from rtml.daemon import run_daemon
    from rtml.exceptions import RtmlSystemError

    async def unreachable() -> None:
        raise RtmlSystemError("cannot reach the head at 10.0.0.9:6380")

    async def broken() -> None:
        raise KeyError("bug")

    async def fine() -> None:
        pass

    for serve, line in ((unreachable, b"error cannot reach the head at 10.0.0.9:6380\n"),
                        (broken, b"error see node_manager.log\n")):
        read_fd, write_fd = os.pipe()
        assert run_daemon("node manager", "node_manager", ReadyPipe(write_fd), serve()) == 1
        assert os.read(read_fd, 200) == line
        os.close(read_fd)
    assert "rtml node manager: cannot reach the head" in capsys.readouterr().err
    assert run_daemon("head service", "head", ReadyPipe(-1), fine()) == 0
