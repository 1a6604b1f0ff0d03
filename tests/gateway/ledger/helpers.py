"""Builders for ledger tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from gateway.ledger.record import UsageRecord
from gateway.store.models import UsageRow

if TYPE_CHECKING:
    from gateway.store.db import Database


def make_record(**overrides: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "id": UsageRecord.new_id(),
        "ts": datetime.now(UTC),
        "request_id": "req",
        "endpoint": "chat.completions",
        "alias": "gpt-test",
        "status": 200,
        "tenant": "acme",
        "tenant_id": 1,
        "key_id": 11,
        "provider": "openai",
        "deployment": "openai/gpt-4o-mini",
        "input_tokens": 10,
        "output_tokens": 5,
        "usage_source": "provider",
        "cost_nanos": 1234,
        "latency_ms": 12.5,
    }
    values.update(overrides)
    return UsageRecord(**values)


async def count_rows(db: Database) -> int:
    async with db.session() as s:
        return int(await s.scalar(select(func.count()).select_from(UsageRow)) or 0)


async def rows(db: Database) -> list[UsageRow]:
    async with db.session() as s:
        return list((await s.scalars(select(UsageRow))).all())


def make_ledger(db: Database, budgets: Any = None, counts: Any = None, **kw: Any) -> Any:
    """A ledger over ``db`` with the given counters (in-process by default)."""
    from gateway.ledger import Ledger, LedgerWriter, LimitStore, PriceBook
    from gateway.ledger.budget import MemoryCounters
    from gateway.ledger.ratelimit import MemoryCounts, RateLimiter

    clock = kw.pop("rate_clock", None)
    rates = RateLimiter(counts or MemoryCounts(), clock) if clock else RateLimiter(counts or MemoryCounts())
    return Ledger(
        db,
        LedgerWriter(db, flush_interval_s=kw.pop("flush_interval_s", 0.05)),
        PriceBook(),
        LimitStore(db, ttl_s=kw.pop("limits_ttl_s", 60.0)),
        budgets or MemoryCounters(),
        rates,
        **kw,
    )
