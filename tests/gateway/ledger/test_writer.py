from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gateway.ledger.writer import LedgerWriter
from gateway.store.migrate import upgrade
from tests.gateway.ledger.helpers import count_rows, make_record, rows
from tests.gateway.store.conftest import open_database

if TYPE_CHECKING:
    from pathlib import Path

    from gateway.store.db import Database


async def _until(predicate, limit_s: float = 5.0) -> float:
    started = time.monotonic()
    while not await predicate():
        assert time.monotonic() - started < limit_s, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_writer_writes_submitted_records_within_the_flush_interval(db: Database) -> None:
    writer = LedgerWriter(db, batch_size=100, flush_interval_s=0.1)
    writer.start()
    try:
        for i in range(250):
            writer.submit(make_record(request_id=f"r{i}", output_tokens=i))
        waited = await _until(lambda: _count_is(db, 250))
        assert waited < 1.0  # the stated crash-loss bound
        written = await rows(db)
        assert sorted(r.output_tokens for r in written) == list(range(250))
        assert writer.pending == 0
        assert writer.written == 250
    finally:
        await writer.aclose()


async def _count_is(db: Database, n: int) -> bool:
    return await count_rows(db) == n


async def test_writer_round_trips_every_field(db: Database) -> None:
    record = make_record(cached_input_tokens=4, cache_write_tokens=2, ttft_ms=3.5, tpot_ms=1.25, slo_met=True,
                         streamed=True, price_id=7, saved_nanos=99, error=None, status=499)  # fmt: skip
    writer = LedgerWriter(db)
    writer.submit(record)
    await writer.flush()
    (row,) = await rows(db)
    for name in ("id", "ts", "request_id", "tenant", "key_id", "deployment", "cached_input_tokens",
                 "cache_write_tokens", "ttft_ms", "tpot_ms", "slo_met", "streamed", "price_id",
                 "saved_nanos", "status", "cost_nanos", "usage_source"):  # fmt: skip
        assert getattr(row, name) == getattr(record, name), name


async def test_writer_close_flushes_everything_pending(db: Database) -> None:
    writer = LedgerWriter(db, flush_interval_s=60)
    writer.start()
    for _ in range(40):
        writer.submit(make_record())
    await asyncio.sleep(0.05)
    assert await count_rows(db) == 0  # still buffered: the interval has not passed
    await writer.aclose()
    assert await count_rows(db) == 40


async def test_writer_skips_records_already_committed_when_a_batch_is_retried(db: Database) -> None:
    """A batch whose commit landed but whose answer was lost is written again without duplicates."""
    records = [make_record() for _ in range(10)]
    first = LedgerWriter(db)
    for r in records[:4]:
        first.submit(r)
    await first.flush()
    retry = LedgerWriter(db)
    for r in records:
        retry.submit(r)
    await retry.flush()
    assert await count_rows(db) == 10
    assert sorted(r.id for r in await rows(db)) == sorted(r.id for r in records)


async def test_writer_keeps_records_and_retries_while_database_fails(tmp_path: Path) -> None:
    async with open_database("sqlite", tmp_path) as db:  # not migrated yet: inserts fail
        writer = LedgerWriter(db, flush_interval_s=0.02)
        writer.start()
        try:
            for _ in range(5):
                writer.submit(make_record())
            await _until(lambda: _failed(writer))
            assert writer.pending == 5
            await upgrade(db)
            await _until(lambda: _count_is(db, 5))
        finally:
            await writer.aclose()


async def _failed(writer: LedgerWriter) -> bool:
    return writer.failures > 0


async def test_room_holds_new_requests_while_buffer_is_full_and_releases_after_a_write(tmp_path: Path) -> None:
    async with open_database("sqlite", tmp_path) as db:
        writer = LedgerWriter(db, max_pending=3, flush_interval_s=0.02)
        writer.start()
        try:
            for _ in range(3):
                writer.submit(make_record())
            waiting = asyncio.create_task(writer.room())
            await asyncio.sleep(0.2)
            assert not waiting.done()  # back-pressure: nothing was dropped, the newcomer waits
            writer.submit(make_record())  # a request already in flight may still record
            assert writer.pending == 4
            await upgrade(db)
            await asyncio.wait_for(waiting, 5)
            await _until(lambda: _count_is(db, 4))
        finally:
            await writer.aclose()
