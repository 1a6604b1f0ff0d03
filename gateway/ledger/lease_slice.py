"""One replica's slices of the shared counters: what it holds per counter, how big a slice is, how long it lives.

Owns the per-counter lease state ``gateway.ledger.lease`` keeps in memory, the slices' sizing and the
lease lifetime in Redis. Does not own admission, the script runs or the Redis layout
(``gateway.ledger.lease_script``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEASE_SHARE = 32
"""A slice is at most this fraction (1/32) of a limit, so one idle replica holds little of it."""
LEASE_REQUESTS = 32
"""A slice covers at most this many requests like the one that asked for it (bounds a crash's leak)."""
LEASE_TTL_S = 30.0
"""How long Redis keeps a replica's budget holdings without a renewal (renewed every third of it).

After a crash (SIGKILL, lost host) the crashed replica's unused slices and the reservations of its
requests in flight go back to the pool at most this long after its last renewal. Long next to what
a live replica may go without reaching Redis (a failover, a GC or event-loop stall of seconds), so
that a live one keeps its slices; short next to a month, so that a crash costs a tenant's budget at
most half a minute. One renewal per replica per 10 s is one small script run.
"""
LOST_AFTER = 0.9
"""A replica stops using a slice not renewed for this fraction of ``LEASE_TTL_S`` (Redis may reclaim it then)."""


@dataclass(slots=True)
class RateLease:
    """This replica's slice of one rate counter in one minute."""

    window: int
    free: int = 0
    """Charged in Redis, not used yet by a request here."""
    cur: int = 0
    """The minute's count in Redis at the last sync (every replica's use and slices)."""
    prev: int = 0
    target: int = 0
    """The slice's size: refilled when less than half of it is left."""
    taking: int = 0
    """Extra asked for by script runs in flight (so that concurrent takes do not each ask a slice)."""
    limit: int = 0
    """The rule's limit as last seen (what refills are checked against)."""


@dataclass(slots=True)
class BudgetLease:
    """This replica's slice of one budget scope in one month."""

    period: str
    free: int = 0
    """Reserved in Redis, not held by a request here."""
    spent: int = 0
    reserved: int = 0
    """Redis's counters at the last sync, kept up to date with the settlements made here since."""
    target: int = 0
    taking: int = 0
    hard: int | None = None
    """The scope's hard limit as last seen (``None``: none)."""
    renewed: float = 0.0
    """``time.monotonic()`` when the last script run that renewed this holding was sent."""


# A counter asked for ``need`` plus up to ``extra``: (counter or scope, its lease, need, extra).
RateTake = tuple[str, RateLease, int, int]
BudgetTake = tuple[str, BudgetLease, int, int]


def slice_size(limit: int | None, need: int) -> int:
    """A slice's size for a counter with ``limit`` (``None``: none) asked for ``need`` at a time."""
    most = LEASE_REQUESTS * need
    return max(need, min(most, math.ceil(limit / LEASE_SHARE))) if limit is not None else most


__all__ = [
    "LEASE_REQUESTS",
    "LEASE_SHARE",
    "LEASE_TTL_S",
    "LOST_AFTER",
    "BudgetLease",
    "BudgetTake",
    "RateLease",
    "RateTake",
    "slice_size",
]
