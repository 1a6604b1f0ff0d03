"""The usage ledger: a record per request, write-behind; versioned prices; budgets and rate limits.

``build_ledger`` wires the parts for a process: Redis-backed counters when a Redis client is given
(shared by replicas), in-process ones otherwise (the embedded default).

Cost on the request path: a tenant without limits touches no counter (its limits are a cached
lookup). With limits, admission is one atomic step over every rate rule and budget scope (``gate``).
With Redis, each replica holds slices of the shared counters (``lease``) and admits from them
without a round trip, refilling them in the background; a request they do not cover takes what it
needs in one ``EVALSHA`` on its path. A record is handed to the writer (a deque append) and never
waited on.

Crash bound: after a crash (the process killed, no shutdown) at most the records of requests that
ended in the last second can be missing. The writer (``gateway.ledger.writer``) commits what is
buffered every ``flush_interval_s`` (0.25 s) or as soon as ``batch_size`` records wait, each batch
in one transaction; so a record is on disk within 0.25 s plus one insert of its request's end while
the database keeps up (a failing database is retried with backoff; the metric
``crossway_ledger_pending_records`` shows what waits). Every record has its own id and inserts skip
ids already present, so a batch retried after a lost commit answer is never written twice. A
graceful shutdown flushes everything. ``tests/gateway/e2e/test_ledger_crash.py`` SIGKILLs a gateway
under load and checks the bound.
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

    from gateway.policy import ProviderConfig, Target
    from gateway.store.db import Database

__all__ = ["Admission", "Ledger", "LedgerWriter", "LimitStore", "Limits", "PriceBook", "UsageRecord", "build_ledger"]


def build_ledger(
    db: Database,
    redis: Redis | None,
    *,
    engines: Callable[[Target], ProviderConfig | None] | None = None,
    limits_ttl_s: float = 10.0,
    flush_interval_s: float = 0.25,
) -> Ledger:
    """A ledger over ``db``, with counters in ``redis`` when given, else in this process.

    ``engines`` gives a target's provider configuration, so that self-hosted engines (those with a
    ``gpu_dollars_per_hour``) are priced from their GPU cost and measured throughput.
    """
    budgets = RedisCounters(redis) if redis is not None else MemoryCounters()
    rates = RateLimiter(RedisCounts(redis) if redis is not None else MemoryCounts())
    return Ledger(
        db,
        LedgerWriter(db, flush_interval_s=flush_interval_s),
        PriceBook(engines),
        LimitStore(db, ttl_s=limits_ttl_s),
        budgets,
        rates,
    )
