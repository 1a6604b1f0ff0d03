"""Per-tenant and per-key rate limits and monthly budgets, as stored in ``tenant_limits``.

Owns reading the rows into an in-memory snapshot, read again in the background once it is ``ttl_s``
old (so an edit through the finance API reaches other replicas within about that time; the replica
that edits reloads at once; no request waits on the table after the first read), and writing them. Does not enforce anything (``gateway.ledger.ratelimit``,
``gateway.ledger.budget``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import delete, select

from gateway.store.models import LimitRow, utcnow

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.store.db import Database

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one scope: a tenant (``key_id`` 0) or one key of it. ``None`` means unlimited."""

    tenant: str
    key_id: int = 0
    rpm: int | None = None
    tpm: int | None = None
    budget_soft_usd: float | None = None
    budget_hard_usd: float | None = None

    @property
    def scope(self) -> str:
        """``t:<tenant>`` or ``k:<key id>``: how counters name this scope."""
        return f"k:{self.key_id}" if self.key_id else f"t:{self.tenant}"


class LimitStore:
    """The ``tenant_limits`` table, cached as a snapshot.

    Args:
        db: Where limits are stored.
        ttl_s: Longest time a snapshot is used before the table is read again.
        clock: Monotonic seconds; injectable for tests.
    """

    def __init__(self, db: Database, ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._clock = clock
        self._snapshot: dict[tuple[str, int], Limits] = {}
        self._loaded_at = -float("inf")
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None

    async def of(self, tenant: str, key_id: int) -> tuple[Limits | None, Limits | None]:
        """The tenant's limits and its key's limits (either ``None`` when not set).

        A stale snapshot is still answered from while one background task reads the table again, so
        no request waits on the database here once the first snapshot is loaded.
        """
        if self._clock() - self._loaded_at > self._ttl_s:
            if self._loaded_at == -float("inf"):
                await self.reload()
            elif self._refresh is None or self._refresh.done():
                self._refresh = asyncio.get_running_loop().create_task(self._reload_quietly())
        return self._snapshot.get((tenant, 0)), self._snapshot.get((tenant, key_id)) if key_id else None

    async def _reload_quietly(self) -> None:
        try:
            await self.reload()
        except Exception as exc:  # noqa: BLE001 - the old snapshot stays in force; the next request retries
            log.warning("limits_reload_failed", error=type(exc).__name__)

    def cached(self) -> list[Limits]:
        """Every scope's limits as last loaded."""
        return list(self._snapshot.values())

    async def reload(self) -> None:
        """Read the table now (concurrent callers share one read)."""
        stale_at = self._loaded_at
        async with self._lock:
            if self._loaded_at != stale_at:
                return
            async with self._db.session() as s:
                rows = (await s.scalars(select(LimitRow))).all()
            self._snapshot = {(r.tenant, r.key_id): _limits(r) for r in rows}
            self._loaded_at = self._clock()

    async def put(self, limits: Limits) -> Limits:
        """Create or replace one scope's limits."""
        async with self._db.session() as s, s.begin():
            row = await s.scalar(
                select(LimitRow).where(LimitRow.tenant == limits.tenant, LimitRow.key_id == limits.key_id)
            )
            if row is None:
                row = LimitRow(tenant=limits.tenant, key_id=limits.key_id)
                s.add(row)
            row.rpm, row.tpm = limits.rpm, limits.tpm
            row.budget_soft_usd, row.budget_hard_usd = limits.budget_soft_usd, limits.budget_hard_usd
            row.updated_at = utcnow()
        self._loaded_at = -float("inf")
        await self.reload()
        return limits

    async def remove(self, tenant: str, key_id: int = 0) -> bool:
        """Remove one scope's limits; whether there were any."""
        async with self._db.session() as s, s.begin():
            result = await s.execute(delete(LimitRow).where(LimitRow.tenant == tenant, LimitRow.key_id == key_id))
        self._loaded_at = -float("inf")
        await self.reload()
        return bool(result.rowcount)  # type: ignore[attr-defined]


def _limits(row: LimitRow) -> Limits:
    return Limits(row.tenant, row.key_id, row.rpm, row.tpm, row.budget_soft_usd, row.budget_hard_usd)
