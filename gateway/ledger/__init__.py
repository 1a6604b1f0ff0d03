"""The usage ledger: a record per request, write-behind; versioned prices; budgets and rate limits.

``build_ledger`` wires the parts for a process: Redis-backed counters when a Redis client is given
(shared by replicas), in-process ones otherwise (the embedded default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.ledger.budget import MemoryCounters, RedisCounters
from gateway.ledger.ledger import Admission, Ledger
from gateway.ledger.limits import Limits, LimitStore
from gateway.ledger.prices import PriceBook
from gateway.ledger.ratelimit import MemoryCounts, RateLimiter, RedisCounts
from gateway.ledger.record import UsageRecord
from gateway.ledger.writer import LedgerWriter

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio import Redis

    from gateway.policy import Price, Target
    from gateway.store.db import Database

__all__ = ["Admission", "Ledger", "LedgerWriter", "LimitStore", "Limits", "PriceBook", "UsageRecord", "build_ledger"]


def build_ledger(
    db: Database,
    redis: Redis | None,
    *,
    engine_price: Callable[[Target], Price | None] | None = None,
    limits_ttl_s: float = 10.0,
    flush_interval_s: float = 0.25,
) -> Ledger:
    """A ledger over ``db``, with counters in ``redis`` when given, else in this process."""
    budgets = RedisCounters(redis) if redis is not None else MemoryCounters()
    rates = RateLimiter(RedisCounts(redis) if redis is not None else MemoryCounts())
    return Ledger(
        db,
        LedgerWriter(db, flush_interval_s=flush_interval_s),
        PriceBook(engine_price),
        LimitStore(db, ttl_s=limits_ttl_s),
        budgets,
        rates,
    )
