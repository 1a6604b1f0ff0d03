"""Budgets that hold under concurrency: reserve the worst case before the call, settle after.

Owns the per-scope, per-month counters (``spent`` and ``reserved`` in nano-dollars), starting them
and reading them, and, in process (``MemoryCounters``, the embedded default, one replica), the two
atomic operations on them: ``reserve`` (admit a request's worst-case cost against every hard limit
that applies, or refuse) and ``settle`` (release the reservation, add the actual cost). With Redis
(``RedisCounters``, one budget shared by the replicas) the lease script (``gateway.ledger.lease_script``)
reserves and settles in the hashes named here. Does not own where limits come from
(``gateway.ledger.limits``) or what a request costs (``gateway.ledger.record``).

Guarantee: a request is admitted only if ``spent + reserved + its reservation <= hard`` for each of
its scopes, atomically, and settling never raises ``spent`` by more than the actual cost. So spend
can pass the hard limit only by what admitted requests cost beyond their reservation (none when the
reservation is a true upper bound), and by nothing else, however many requests race.

Counters start from the period's spend in the database (``seed``), once per scope and period.
``reserved`` in Redis also holds replicas' leased slices (``gateway.ledger.lease_script`` owns their
holder fields); reading the state gives back those of replicas that stopped renewing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from gateway.ledger.lease_script import RECLAIM

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.asyncio import Redis

PERIOD_TTL_S = 40 * 24 * 3600
"""Redis keeps a month's counters a little longer than the month."""


def period_of(at: datetime) -> str:
    """The budget period (calendar month, UTC) containing ``at``: ``"2026-11"``."""
    return at.astimezone(UTC).strftime("%Y-%m")


def period_start(period: str) -> datetime:
    """The first instant of a period."""
    year, month = period.split("-")
    return datetime(int(year), int(month), 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a reservation was refused: the scope whose hard limit it would pass, and that scope's state."""

    scope: str
    spent: int
    reserved: int
    hard: int


class BudgetCounters(Protocol):
    """Spent and reserved nano-dollars per (scope, period). Implementations are atomic per call."""

    async def seeded(self, scope: str, period: str) -> bool:
        """Whether the counters of ``scope`` in ``period`` were started already."""
        ...

    async def seed(self, scope: str, period: str, spent: int) -> None:
        """Start the counters at ``spent`` unless another caller started them first."""
        ...

    async def state(self, scope: str, period: str) -> tuple[int, int]:
        """``(spent, reserved)``."""
        ...


class MemoryCounters:
    """In-process counters for one replica (the embedded default).

    No method awaits anything, so each is atomic on the event loop.
    """

    def __init__(self) -> None:
        self._c: dict[tuple[str, str], list[int]] = {}

    async def seeded(self, scope: str, period: str) -> bool:  # noqa: D102
        return (scope, period) in self._c

    async def seed(self, scope: str, period: str, spent: int) -> None:  # noqa: D102
        self._c.setdefault((scope, period), [spent, 0])

    async def reserve(self, scopes: Sequence[tuple[str, int | None]], period: str, amount: int) -> Refused | None:
        """Reserve ``amount`` in every scope if none would pass its hard limit (``None``: no limit).

        Returns:
            ``None`` when reserved in all scopes; else the first scope that refused (nothing reserved).
        """
        for scope, hard in scopes:
            spent, reserved = self._c.setdefault((scope, period), [0, 0])
            if hard is not None and spent + reserved + amount > hard:
                return Refused(scope, spent, reserved, hard)
        for scope, _ in scopes:
            self._c[(scope, period)][1] += amount
        return None

    async def settle(self, scopes: Sequence[str], period: str, reserved: int, actual: int) -> None:
        """Release ``reserved`` and add ``actual`` to spent, in every scope."""
        for scope in scopes:
            c = self._c.setdefault((scope, period), [0, 0])
            c[0] += actual
            c[1] -= reserved

    async def state(self, scope: str, period: str) -> tuple[int, int]:  # noqa: D102
        spent, reserved = self._c.get((scope, period), (0, 0))
        return spent, reserved


_SEED = """
if redis.call('HSETNX', KEYS[1], 'seeded', 1) == 1 then
  redis.call('HINCRBY', KEYS[1], 'spent', tonumber(ARGV[1]))
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 1
"""

_STATE = (
    RECLAIM
    + """
reclaim(KEYS[1], now)
return redis.call('HMGET', KEYS[1], 'spent', 'reserved')
"""
)


class RedisCounters:
    """Counters in Redis hashes ``<prefix>:<period>:<scope>``, shared by every replica.

    Starting and reading them is one script run each; reservations and settlements are the lease
    script's (atomic across a request's scopes and rate rules).
    """

    def __init__(self, redis: Redis, prefix: str = "crossway:budget") -> None:
        self._redis = redis
        self._prefix = prefix
        self._seed = redis.register_script(_SEED)
        self._state = redis.register_script(_STATE)

    def key(self, scope: str, period: str) -> str:
        """The Redis hash of ``scope``'s counters in ``period``."""
        return f"{self._prefix}:{period}:{scope}"

    @property
    def redis(self) -> Redis:
        """The client the counters live behind."""
        return self._redis

    async def seeded(self, scope: str, period: str) -> bool:  # noqa: D102
        return bool(await self._redis.hexists(self.key(scope, period), "seeded"))

    async def seed(self, scope: str, period: str, spent: int) -> None:  # noqa: D102
        await self._seed(keys=[self.key(scope, period)], args=[spent, PERIOD_TTL_S])

    async def state(self, scope: str, period: str) -> tuple[int, int]:
        """``(spent, reserved)``, after giving back what replicas that stopped renewing their leases held."""
        values = await self._state(keys=[self.key(scope, period)])
        return int(values[0] or 0), int(values[1] or 0)
