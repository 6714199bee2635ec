"""A driver whose node manager died (issue 16, item 8): what needs the node manager
raises at once, saying so, and writes nothing into shared memory."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import rtml
from rtml import driver
from rtml.core import current
from rtml.exceptions import RtmlSystemError


@rtml.remote
def one() -> int:
    return 1


def test_a_put_after_the_node_manager_died_raises_and_leaks_no_segment() -> None:
    if rtml.is_initialized():
        rtml.shutdown()
    rtml.init(num_cpus=1)
    try:
        runtime = current.require_runtime()
        started = driver._embedded
        assert started is not None
        node_manager = started.procs[-1]
        os.kill(node_manager.pid, signal.SIGKILL)
        node_manager.wait()
        deadline = time.monotonic() + 10
        while not runtime.nm.closed:
            assert time.monotonic() < deadline, "the driver never saw its node manager go"
            time.sleep(0.02)
        segments = set(Path(runtime.store_dir).glob("*"))
        start = time.monotonic()
        with pytest.raises(RtmlSystemError, match="node manager"):
            rtml.put(np.zeros(1 << 18))  # 2 MiB: it would go into shared memory
        with pytest.raises(RtmlSystemError, match="node manager"):
            rtml.get(one.remote(), timeout=30)
        assert time.monotonic() - start < 5
        assert set(Path(runtime.store_dir).glob("*")) == segments
    finally:
        rtml.shutdown()
