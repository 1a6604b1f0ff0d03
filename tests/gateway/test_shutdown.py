"""The app's shutdown steps: each close is bounded, so a hung one cannot keep the process from stopping."""

from __future__ import annotations

import asyncio
import time

import pytest
from structlog.testing import capture_logs

from gateway.api.app import closing


async def test_a_shutdown_step_that_hangs_is_logged_cancelled_and_left_behind() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await asyncio.shield(asyncio.Event().wait())  # ignores the cancellation, as a shielded close would

    t0 = time.monotonic()
    with capture_logs() as logs:
        await closing("watcher", stuck(), seconds=0.05)
    assert time.monotonic() - t0 < 1.0
    assert logs == [{"event": "shutdown_step_timed_out", "step": "watcher", "seconds": 0.05, "log_level": "error"}]
    await asyncio.sleep(0)
    assert started.is_set() and cancelled.is_set()


async def test_a_shutdown_step_that_finishes_logs_nothing_and_one_that_fails_raises() -> None:
    done: list[str] = []

    async def quick() -> None:
        done.append("closed")

    async def broken() -> None:
        raise ConnectionError("redis went away")

    with capture_logs() as logs:
        await closing("redis", quick())
        with pytest.raises(ConnectionError, match="redis went away"):
            await closing("redis", broken())
    assert done == ["closed"] and logs == []
