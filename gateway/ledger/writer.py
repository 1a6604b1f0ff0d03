"""Write-behind of usage records: a bounded in-memory buffer drained to the database in batches.

Owns buffering, batching, retrying failed writes, back-pressure and the flush on shutdown. Does not
own what a record holds (``gateway.ledger.record``) or the table (``gateway.store.models.UsageRow``).

The request path only calls ``submit`` (a deque append, no I/O) and, before dispatching a new
request, ``room`` (returns at once unless the buffer is full). Records are never dropped:

* Back-pressure: when ``max_pending`` records wait to be written (the database is slow or down),
  ``room`` makes *new* requests wait until a batch has been written. Requests already in flight may
  still submit, so the buffer holds at most ``max_pending`` plus the requests in flight.
* A failed batch stays at the head of the buffer and is retried with capped exponential backoff.
  Each row carries its own id and inserts skip ids already present, so a batch whose commit
  succeeded but whose answer was lost is not written twice.
* ``aclose`` (graceful shutdown) writes everything pending before returning, retrying until
  ``shutdown_timeout_s``.

Crash-loss bound: a record is submitted when its request ends and is written within
``flush_interval_s`` (default 0.25 s), or sooner once ``batch_size`` records wait, plus the time of
one batch insert. A process killed without shutdown therefore loses at most the records of requests
that ended in the last ``flush_interval_s`` plus one write (well under 1 s while the database keeps
up); what was committed is never duplicated. While the database is down, the buffer holds what it
cannot write, and a crash then loses that too; the metric ``crossway_ledger_pending_records`` shows
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import fields
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

import structlog
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from gateway.ledger.record import UsageRecord
from gateway.store.models import UsageRow

if TYPE_CHECKING:
    from sqlalchemy import Table

    from gateway.store.db import Database

log = structlog.get_logger(__name__)

_FIELDS = tuple(f.name for f in fields(UsageRecord))


def _row(record: UsageRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in _FIELDS}


class LedgerWriter:
    """Buffers records and writes them in batches from one background task.

    Use from one event loop: ``start()`` once, ``submit`` per request, ``aclose()`` at shutdown.

    Args:
        db: Where records go.
        max_pending: Buffer size past which new requests wait in ``room``.
        batch_size: Most rows in one insert; a full batch is written without waiting for the interval.
        flush_interval_s: Longest time a record waits before its batch is written.
        shutdown_timeout_s: How long ``aclose`` keeps retrying a failing database before giving up.
    """

    def __init__(
        self,
        db: Database,
        *,
        max_pending: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.25,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        if max_pending < 1 or batch_size < 1 or flush_interval_s <= 0:
            raise ValueError("max_pending and batch_size must be >= 1 and flush_interval_s > 0")
        self._db = db
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._pending: deque[UsageRecord] = deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._write_lock = asyncio.Lock()
        self.written = 0
        """Records committed since start."""
        self.failures = 0
        """Batch writes that failed (and were retried)."""

    @property
    def pending(self) -> int:
        """Records submitted and not yet committed."""
        return len(self._pending)

    def pending_records(self) -> list[UsageRecord]:
        """A copy of the records not yet committed (budget counters count them when they start)."""
        return list(self._pending)

    def start(self) -> None:
        """Start the background writer."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="ledger-writer")

    def submit(self, record: UsageRecord) -> None:
        """Queue a record for writing. Never blocks, never drops (see the module docstring)."""
        self._pending.append(record)
        if len(self._pending) >= self.batch_size:
            self._wake.set()

    async def room(self) -> None:
        """Wait while the buffer is full: the back-pressure a new request feels when writes fall behind."""
        while len(self._pending) >= self.max_pending:
            self._wake.set()
            self._drained.clear()
            await self._drained.wait()

    async def flush(self) -> None:
        """Write everything submitted so far (for shutdown and tests).

        Raises:
            SQLAlchemyError: The database refused a batch (it stays pending).
        """
        while self._pending:
            await self._write_batch()

    async def aclose(self) -> None:
        """Stop the background task, then write what is pending, retrying until ``shutdown_timeout_s``."""
        self._closing = True
        if self._task is not None:
            self._wake.set()
            await self._task
            self._task = None
        deadline = time.monotonic() + self.shutdown_timeout_s
        delay = 0.05
        while self._pending:
            try:
                await self.flush()
            except (SQLAlchemyError, OSError) as exc:
                if time.monotonic() + delay > deadline:
                    log.error("ledger_records_lost", records=len(self._pending), error=type(exc).__name__)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _run(self) -> None:
        delay = 0.05
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            try:
                # NOTE: one batch per interval unless full ones wait: draining whatever trickled in during
                # the last insert would commit a tiny transaction every few milliseconds under load, and
                # a transaction costs far more CPU than a row. The crash bound is unchanged.
                await self._write_batch()
                while len(self._pending) >= self.batch_size:
                    await self._write_batch()
                delay = 0.05
            except (SQLAlchemyError, OSError) as exc:
                self.failures += 1
                log.warning("ledger_write_failed", pending=len(self._pending), error=type(exc).__name__, retry_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _write_batch(self) -> None:
        async with self._write_lock:  # flush() from a test or shutdown never races the task on one batch
            batch = list(islice(self._pending, self.batch_size))
            if not batch:
                return
            table = cast("Table", UsageRow.__table__)
            insert = postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert
            stmt = insert(table).on_conflict_do_nothing(index_elements=["id"])
            async with self._db.engine.begin() as conn:
                await conn.execute(stmt, [_row(r) for r in batch])
            for _ in batch:  # only the writer removes from the left; submit appends on the right
                self._pending.popleft()
            self.written += len(batch)
            self._drained.set()
