"""Admission and settlement as single operations over the rate-limit counts and the budget counters.

Owns the one atomic step a request with limits goes through before dispatch (charge every rate rule
and reserve the worst-case cost in every budget scope, or do neither) and the step after it (release
the reservation, add the actual cost, correct the token charge), which takes the settlements of many
requests at once. With Redis both are one script, registered once and run with ``EVALSHA``: an
admission is one round trip whatever the number of rules and scopes, and it carries the settlements
that ended since the previous one (so under load a request costs one round trip in all; when no
admission comes, settlements go on their own after ``settle_delay_s``). In process, both steps run
without awaiting and so are atomic on the event loop. ``gateway.ledger.lease`` builds the Redis
gate that admits from per-replica slices (the default with Redis). Does not own the counters' layout (``gateway.ledger.ratelimit``,
``gateway.ledger.budget``), what the limits are (``gateway.ledger.limits``) or turning a refusal
into an error (``gateway.ledger.ledger``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.ledger.budget import PERIOD_TTL_S, RedisCounters, Refused
from gateway.ledger.ratelimit import WINDOW_S, RedisCounts

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger.budget import BudgetCounters
    from gateway.ledger.ratelimit import Ask, Charged, Counts


@dataclass(frozen=True, slots=True)
class Reservation:
    """A budget reservation asked for: ``amount`` nano-dollars in each scope (with its hard limit) of ``period``."""

    scopes: tuple[tuple[str, int | None], ...]
    period: str
    amount: int


@dataclass(frozen=True, slots=True)
class Settlement:
    """How one admitted request ended: its charge corrected to ``tokens``, its reservation to ``actual``."""

    charged: Charged | None
    tokens: int
    reservation: Reservation | None
    actual: int


@dataclass(slots=True)
class Outcome:
    """What ``Gate.admit`` did. Either everything asked was charged and reserved, or nothing was."""

    rates_ok: bool = True
    """``False``: a rate rule refused (nothing charged or reserved)."""
    before: list[tuple[int, int]] = field(default_factory=list)
    """Each rate rule's ``(this window, previous window)`` counts before charging."""
    refused: Refused | None = None
    """A budget scope that refused (nothing charged or reserved)."""
    states: list[tuple[int, int]] = field(default_factory=list)
    """Each budget scope's ``(spent, reserved)`` after reserving (for the soft limits)."""


class Gate(Protocol):
    """The admission and settlement steps. Each call is atomic over all its counters."""

    settle_delay_s: float
    """How long a settlement may wait to travel with the next admission (0: settle at once)."""

    def admit_now(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> tuple[Outcome | None, Sequence[Settlement]]:
        """``admit`` when it can be decided without I/O (``None`` otherwise), and the settlements left to apply."""
        ...

    async def admit(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> Outcome:
        """Apply ``settlements``, then admit: charge ``ask`` and reserve ``reservation``, or neither.

        The admission happens only if every rule and scope admits it. Rate rules are checked first:
        when both would refuse, the outcome is the rate refusal. Settlements apply either way.
        """
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        """For each: correct the token charge, release the reservation and add the actual cost to spent."""
        ...

    async def aclose(self) -> None:
        """Give back what this process holds and send what waits (graceful shutdown)."""
        ...


class _Remote:
    """What the gates that decide every admission in their counters share: nothing is decided here."""

    def admit_now(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> tuple[Outcome | None, Sequence[Settlement]]:
        """Never decided here: the counters decide (``admit``)."""
        return None, settlements

    async def aclose(self) -> None:
        """Nothing is held here."""


class SplitGate(_Remote):
    """The steps over any ``Counts`` and ``BudgetCounters``, one after the other.

    Atomic when both are in-process (the embedded default: nothing here awaits I/O). Over Redis,
    ``RedisGate`` does the same in one script; this class then only serves mixed set-ups (tests).
    """

    settle_delay_s = 0.0

    def __init__(self, counts: Counts, budgets: BudgetCounters) -> None:
        self._counts = counts
        self._budgets = budgets

    async def admit(  # noqa: D102
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> Outcome:
        if settlements:
            await self.settle(settlements)
        out = Outcome()
        if ask is not None:
            out.rates_ok, out.before = await self._counts.charge(ask.keys, ask.window, ask.weight, ask.checks())
            if not out.rates_ok:
                return out
        if reservation is not None:
            out.refused = await self._budgets.reserve(reservation.scopes, reservation.period, reservation.amount)
            if out.refused is not None:
                if ask is not None:  # undo the charge: a refused request uses none of its rate limits
                    for key, cost in zip(ask.keys, ask.costs, strict=True):
                        await self._counts.adjust(key, ask.window, -cost)
                return out
            out.states = [await self._budgets.state(s, reservation.period) for s, _ in reservation.scopes]
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> None:  # noqa: D102
        for s in settlements:
            if s.reservation is not None:
                scopes = [scope for scope, _ in s.reservation.scopes]
                await self._budgets.settle(scopes, s.reservation.period, s.reservation.amount, s.actual)
            if s.charged is not None and (delta := s.tokens - s.charged.tokens):
                for key in s.charged.token_keys:
                    await self._counts.adjust(key, s.charged.window, delta)


# One script does both steps. KEYS: the settlements' keys (per settlement: its budget hashes, then
# its window's token counts), then the admission's (two per rate rule: this window's count and last
# window's; then one hash per budget scope). ARGV: settlement keys sk, settlement args sa, the
# settlement args (budget TTL, rate TTL, then per settlement: budget scopes m, token keys t,
# reserved, actual, token delta; none when sa is 0), then, to admit, the admission args (weight *
# 1e6, rate TTL, rules n, n x (limit, cost), amount, budget TTL, one hard limit per scope, -1: none).
# Settlements are applied first, whatever the admission's outcome. Returns {0, counts..., states...}
# when admitted (or nothing to admit), {1, counts...} when a rule refused, and {2, counts..., scope
# index, spent, reserved} when a budget refused.
_GATE = """
local sk, sa = tonumber(ARGV[1]), tonumber(ARGV[2])
local k = 1
for a = 5, 2 + sa, 5 do
  local m, t = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local reserved, actual, delta = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  for j = 1, m do
    redis.call('HINCRBY', KEYS[k], 'reserved', -reserved)
    redis.call('HINCRBY', KEYS[k], 'spent', actual)
    redis.call('EXPIRE', KEYS[k], ARGV[3])
    k = k + 1
  end
  for j = 1, t do
    if delta ~= 0 then
      redis.call('INCRBY', KEYS[k], delta)
      redis.call('EXPIRE', KEYS[k], ARGV[4])
    end
    k = k + 1
  end
end
local A = 2 + sa
if #ARGV == A then
  return {0}
end
local w = tonumber(ARGV[A + 1]) / 1000000
local n = tonumber(ARGV[A + 3])
local out = {0}
local ok = true
for i = 1, n do
  local cur = tonumber(redis.call('GET', KEYS[sk + 2 * i - 1]) or '0')
  local prev = tonumber(redis.call('GET', KEYS[sk + 2 * i]) or '0')
  if prev * w + cur + tonumber(ARGV[A + 2 * i + 3]) > tonumber(ARGV[A + 2 * i + 2]) then ok = false end
  out[#out + 1] = cur
  out[#out + 1] = prev
end
if not ok then
  out[1] = 1
  return out
end
local base = A + 2 * n + 3
local amount = tonumber(ARGV[base + 1])
local m = #KEYS - sk - 2 * n
local states = {}
for j = 1, m do
  local v = redis.call('HMGET', KEYS[sk + 2 * n + j], 'spent', 'reserved')
  local spent = tonumber(v[1] or '0')
  local reserved = tonumber(v[2] or '0')
  local hard = tonumber(ARGV[base + 2 + j])
  if hard >= 0 and spent + reserved + amount > hard then
    out[1] = 2
    out[#out + 1] = j
    out[#out + 1] = spent
    out[#out + 1] = reserved
    return out
  end
  states[j] = {spent, reserved}
end
for i = 1, n do
  redis.call('INCRBY', KEYS[sk + 2 * i - 1], ARGV[A + 2 * i + 3])
  redis.call('EXPIRE', KEYS[sk + 2 * i - 1], ARGV[A + 2])
end
for j = 1, m do
  redis.call('HINCRBY', KEYS[sk + 2 * n + j], 'reserved', amount)
  redis.call('EXPIRE', KEYS[sk + 2 * n + j], ARGV[base + 2])
  out[#out + 1] = states[j][1]
  out[#out + 1] = states[j][2] + amount
end
return out
"""


class RedisGate(_Remote):
    """Both steps in one Lua script, over the keys ``RedisCounts`` and ``RedisCounters`` use.

    An admission carries the settlements that waited for it, so that under load a request costs one
    round trip in all; a settlement waits for the next admission at most ``settle_delay_s``.

    Args:
        counts: The rate-limit counts (their key names).
        budgets: The budget counters (their key names); must share ``counts``' Redis client.
    """

    settle_delay_s = 0.02
    """How long settlements may wait for an admission to carry them before going alone."""

    def __init__(self, counts: RedisCounts, budgets: RedisCounters) -> None:
        self._counts = counts
        self._budgets = budgets
        self._script = counts.redis.register_script(_GATE)  # registered once; each call is an EVALSHA

    async def admit(self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()) -> Outcome:  # noqa: D102  # fmt: skip
        keys, args = self._settlements(settlements)
        n = len(ask.keys) if ask is not None else 0
        args += [round(ask.weight * 1_000_000) if ask is not None else 0, 3 * WINDOW_S, n]
        if ask is not None:
            for key, cost, rule in zip(ask.keys, ask.costs, ask.rules, strict=True):
                keys += [self._counts.key(key, ask.window), self._counts.key(key, ask.window - 1)]
                args += [rule.limit, cost]
        scopes = reservation.scopes if reservation is not None else ()
        args += [reservation.amount if reservation is not None else 0, PERIOD_TTL_S]
        if reservation is not None:
            keys += [self._budgets.key(scope, reservation.period) for scope, _ in scopes]
            args += [-1 if hard is None else hard for _, hard in scopes]
        raw = [int(v) for v in await self._script(keys=keys, args=args)]
        out = Outcome(before=[(raw[1 + 2 * i], raw[2 + 2 * i]) for i in range(n)])
        rest = raw[1 + 2 * n :]
        if raw[0] == 1:
            out.rates_ok = False
        elif raw[0] == 2:
            scope, hard = scopes[rest[0] - 1]
            out.refused = Refused(scope, rest[1], rest[2], hard or 0)
        else:
            out.states = [(rest[2 * j], rest[2 * j + 1]) for j in range(len(scopes))]
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> None:  # noqa: D102
        keys, args = self._settlements(settlements)
        if keys:
            await self._script(keys=keys, args=args)

    def _settlements(self, settlements: Sequence[Settlement]) -> tuple[list[str], list[int]]:
        """The keys and the header plus arguments of the settlement part (``[sk, sa, ...]``)."""
        keys: list[str] = []
        args: list[int] = [PERIOD_TTL_S, 3 * WINDOW_S] if settlements else []
        for s in settlements:
            r, c = s.reservation, s.charged
            budget = [self._budgets.key(scope, r.period) for scope, _ in r.scopes] if r is not None else []
            tokens = [self._counts.key(k, c.window) for k in c.token_keys] if c is not None else []
            keys += budget + tokens
            delta = s.tokens - c.tokens if c is not None else 0
            args += [len(budget), len(tokens), r.amount if r is not None else 0, s.actual, delta]
        return keys, [len(keys), len(args), *args]


def gate_for(counts: Counts, budgets: BudgetCounters, *, leases: bool = True) -> Gate:
    """The gate over these counters.

    When both live in the same Redis: per-replica leases (``gateway.ledger.lease``: admission
    without a round trip while this replica's slices cover it), or with ``leases=False`` one script
    per step. Otherwise the steps one after the other.
    """
    if isinstance(counts, RedisCounts) and isinstance(budgets, RedisCounters) and counts.redis is budgets.redis:
        if leases:
            from gateway.ledger.lease import LeasedGate  # here: lease imports this module

            return LeasedGate(counts, budgets)
        return RedisGate(counts, budgets)
    return SplitGate(counts, budgets)


__all__ = ["Gate", "Outcome", "RedisGate", "Reservation", "Settlement", "SplitGate", "gate_for"]
