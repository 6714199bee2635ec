"""A request no node can satisfy stays pending, and the driver warns once."""

from __future__ import annotations

import logging
import time

import pytest

import rtml


@rtml.remote(resources={"unobtainium": 1})
def needs_unobtainium() -> int:
    return 1


def test_infeasible_task_stays_pending_with_one_warning(
        cluster: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rtml.core.runtime")
    refs = [needs_unobtainium.remote() for _ in range(3)]
    ready, pending = rtml.wait(refs, num_returns=1, timeout=1.5)
    assert ready == [] and pending == refs
    deadline = time.monotonic() + 5
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.05)
    warnings = [r for r in caplog.records if "unobtainium" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "rtml status" in warnings[0].getMessage()
    for ref in refs:
        rtml.cancel(ref)
