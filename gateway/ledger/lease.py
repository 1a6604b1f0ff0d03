"""Per-replica leases: admission against slices of the shared Redis counters, taken ahead of need.

Owns ``LeasedGate``, the gate used when the counters live in Redis. Each replica takes, per counter
(a rate rule's count in the current minute, a budget scope's month), a slice of what the limit
still allows, charged in Redis like requests or reservations of its own; it then admits locally,
without a round trip, while its slices cover a request, and tops them up in the background before
they run out. A request that its slices do not cover takes the shortfall (plus a fresh slice) in
one script run on its path. Settlements are applied to the slices at once
and reach Redis in one batched script run shortly after. Does not own the counters' layout
(``gateway.ledger.ratelimit``, ``gateway.ledger.budget``), the script's (``lease_script``) or
turning an outcome into an error.

Bounds (all replicas together):

* Rate limits: a slice is counted in the shared window before it is used, so the requests and
  tokens admitted in a window never pass what the limit allows (as without leases). A replica's
  unused slice counts as used for the others, so a request may be refused while up to one slice
  per replica (at most ``1/LEASE_SHARE`` of the limit, or ``LEASE_REQUESTS`` requests' worth) is
  still unused; a slice lives only in its minute and is given back when the minute ends.
* Budgets: Redis admits a slice only if ``spent + reserved + slice <= hard``, where ``reserved``
  holds the reservations in flight and every replica's unused slices. So spend passes the hard limit
  by no more than what requests cost beyond their own reservation (nothing when the reservation is
  the worst case), and a request is refused at most ``unused slices of other replicas`` too early.
  The budget status's ``reserved`` includes the slices. A graceful shutdown gives every slice back.
* Crashes: Redis keeps per budget hash what each replica holds (unused slices and its requests'
  reservations in flight), with an expiry renewed every ``lease_ttl_s / 3``. Once a replica stops
  renewing (SIGKILL), the next script run or status read on the scope gives its holdings back, at
  most ``lease_ttl_s`` after its last renewal. A replica that could not renew for ``LOST_AFTER`` of
  it stops using its slices; giving back a reclaimed holding later changes nothing. Lost at a
  crash: the spend of settlements not yet sent (the last ``settle_delay_s + FLUSH_DELAY_S``, about
  40 ms, and requests in flight) never reaches Redis's ``spent``, which is seeded from the records
  only when new; the records themselves are still written (the writer's own bound). Rate slices
  need no expiry: they count in their minute only, which weighs on admission for two minutes.
* A limit lowered meanwhile binds this replica once its slice of that counter is used up.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING

import structlog

from gateway.ledger.budget import PERIOD_TTL_S, RedisCounters, Refused
from gateway.ledger.gate import Outcome
from gateway.ledger.lease_script import LEASE_SCRIPT
from gateway.ledger.lease_slice import (
    LEASE_REQUESTS,
    LEASE_SHARE,
    LEASE_TTL_S,
    LOST_AFTER,
    BudgetLease,
    BudgetTake,
    RateLease,
    RateTake,
    slice_size,
)
from gateway.ledger.ratelimit import WINDOW_S, RedisCounts

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger.gate import Reservation, Settlement
    from gateway.ledger.ratelimit import Ask

log = structlog.get_logger(__name__)

FLUSH_DELAY_S = 0.02
"""How long settlements collect before they go to Redis in one script run."""


class LeasedGate:
    """Admission against this replica's slices of the Redis counters (see the module's bounds).

    Args:
        counts: The rate-limit counts (their key names).
        budgets: The budget counters (their key names); must share ``counts``' Redis client.
    """

    settle_delay_s = 0.02
    """How long settlements may wait for an admission to carry them (they are then applied here)."""
    lease_ttl_s = LEASE_TTL_S
    """How long Redis keeps this replica's budget holdings without a renewal (set before first use)."""

    def __init__(self, counts: RedisCounts, budgets: RedisCounters) -> None:
        self._counts = counts
        self._budgets = budgets
        self._script = counts.redis.register_script(LEASE_SCRIPT)
        self._rates: dict[str, RateLease] = {}
        self._spend: dict[str, BudgetLease] = {}
        self._rate_adj: dict[tuple[str, int], int] = {}
        self._budget_adj: dict[tuple[str, str], list[int]] = {}
        self._window = 0
        """The latest minute asked for: only its slices are refilled."""
        self._flusher: asyncio.Task[None] | None = None
        self._refiller: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._id = uuid.uuid4().hex
        """This replica's holder name in the budget hashes."""

    def admit_now(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> tuple[Outcome | None, Sequence[Settlement]]:
        """Apply ``settlements`` here and admit from the slices, without I/O.

        Returns:
            The outcome when the slices cover the request (``None`` when they do not), and the
            settlements still to apply (none: all were applied).
        """
        self._apply(settlements)
        rates = self._rate_leases(ask)
        spend = self._budget_leases(reservation)
        if ask is not None and any(lease.free < cost for lease, cost in zip(rates, ask.costs, strict=True)):
            return None, ()
        if reservation is not None and any(lease.free < reservation.amount for lease in spend):
            return None, ()
        out = Outcome()
        low = False
        if ask is not None:
            for lease, cost, rule in zip(rates, ask.costs, ask.rules, strict=True):
                out.before.append((lease.cur - lease.free, lease.prev))
                lease.free -= cost
                lease.limit = rule.limit
                low = low or lease.free * 2 < lease.target
        if reservation is not None:
            for b, (_, hard) in zip(spend, reservation.scopes, strict=True):
                b.free -= reservation.amount
                b.hard = hard
                out.states.append((b.spent, b.reserved - b.free))
                low = low or b.free * 2 < b.target
        if low:
            self._refill_soon()
        return out, ()

    async def admit(  # noqa: D102
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> Outcome:
        out, _ = self.admit_now(ask, reservation, settlements)
        if out is not None:
            return out
        # Hold what the slices have (so that no other request here uses it meanwhile), take the rest.
        rates = self._rate_leases(ask)
        spend = self._budget_leases(reservation)
        held: list[int] = []
        rate_takes: list[RateTake] = []
        budget_takes: list[BudgetTake] = []
        if ask is not None:
            for key, lease, cost, rule in zip(ask.keys, rates, ask.costs, ask.rules, strict=True):
                h = max(0, min(lease.free, cost))
                lease.free -= h
                held.append(h)
                lease.limit, lease.target = rule.limit, slice_size(rule.limit, cost)
                rate_takes.append((key, lease, cost - h, lease.target - lease.free - lease.taking))
        if reservation is not None:
            for (scope, hard), b in zip(reservation.scopes, spend, strict=True):
                h = max(0, min(b.free, reservation.amount))
                b.free -= h
                held.append(h)
                b.hard, b.target = hard, slice_size(hard, reservation.amount)
                budget_takes.append((scope, b, reservation.amount - h, b.target - b.free - b.taking))
        try:
            status, index, raw = await self._send(rate_takes, budget_takes, ask.weight if ask is not None else 1.0)
        except BaseException:
            self._give_back_held(rates, spend, held)
            raise
        out = Outcome()
        n = len(rate_takes)
        if status != 0:
            self._give_back_held(rates, spend, held)
        if ask is not None:
            for i, (lease, cost) in enumerate(zip(rates, ask.costs, strict=True)):
                cur, prev = raw[3 * i], raw[3 * i + 1]
                # before this request: every replica's use, less this replica's unused slice
                out.before.append((cur - held[i], prev) if status != 0 else (cur - lease.free - cost, prev))
        if status == 1:
            out.rates_ok = False
        elif status == 2 and reservation is not None:
            scope, hard = reservation.scopes[index - 1]
            spent, reserved = raw[3 * n + 3 * (index - 1)], raw[3 * n + 3 * (index - 1) + 1]
            out.refused = Refused(scope, spent, reserved, hard or 0)
        elif reservation is not None:
            out.states = [(b.spent, b.reserved - b.free) for b in spend]
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        """Apply ``settlements`` to the slices now; Redis gets them with the next flush."""
        self._apply(settlements)
        self._flush_soon(0.0)

    async def aclose(self) -> None:
        """Give every unused slice back and send what waits (graceful shutdown)."""
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.wait([self._renewer])
        for task in (self._refiller, self._flusher):
            if task is not None:
                await task
        for key, lease in self._rates.items():
            if lease.free:
                self._adjust_rate(key, lease.window, -lease.free)
        for scope, b in self._spend.items():
            if b.free:
                self._adjust_budget(scope, b.period, 0, -b.free)
        self._rates.clear()
        self._spend.clear()
        await self._sync([], [])

    # -- local state ----------------------------------------------------------------------------

    def _rate_leases(self, ask: Ask | None) -> list[RateLease]:
        if ask is None:
            return []
        out = []
        self._window = max(self._window, ask.window)
        for key in ask.keys:
            lease = self._rates.get(key)
            if lease is None or lease.window != ask.window:
                if lease is not None and lease.free > 0:  # the minute is over: give its slice back
                    self._adjust_rate(key, lease.window, -lease.free)
                lease = self._rates[key] = RateLease(ask.window)
            out.append(lease)
        return out

    def _budget_leases(self, reservation: Reservation | None) -> list[BudgetLease]:
        if reservation is None:
            return []
        out = []
        lost = time.monotonic() - self.lease_ttl_s * LOST_AFTER
        for scope, _ in reservation.scopes:
            b = self._spend.get(scope)
            if b is None or b.period != reservation.period:
                if b is not None and b.free > 0:  # the month is over: give its slice back
                    self._adjust_budget(scope, b.period, 0, -b.free)
                b = self._spend[scope] = BudgetLease(reservation.period)
            elif b.free > 0 and b.renewed < lost:  # Redis may have given it to the others meanwhile
                log.warning("ledger_lease_lost", scope=scope, free=b.free)
                b.free = 0
            out.append(b)
        return out

    def _apply(self, settlements: Sequence[Settlement]) -> None:
        """A request's unused reservation and tokens go back to its slices (or to Redis when they are gone)."""
        for s in settlements:
            r, c = s.reservation, s.charged
            if r is not None:
                used = min(s.actual, r.amount)
                for scope, _ in r.scopes:
                    b = self._spend.get(scope)
                    self._adjust_budget(scope, r.period, s.actual, -used)
                    if b is not None and b.period == r.period:
                        b.free += r.amount - used
                        b.spent += s.actual
                        b.reserved -= used
                    else:
                        self._adjust_budget(scope, r.period, 0, used - r.amount)
            if c is not None and (delta := s.tokens - c.tokens):
                for key in c.token_keys:
                    lease = self._rates.get(key)
                    if delta < 0 and lease is not None and lease.window == c.window:
                        lease.free -= delta
                    else:
                        self._adjust_rate(key, c.window, delta)
                        if lease is not None and lease.window == c.window:
                            lease.cur += delta
        if settlements:
            self._flush_soon(FLUSH_DELAY_S)

    def _adjust_rate(self, key: str, window: int, delta: int) -> None:
        k = (key, window)
        self._rate_adj[k] = self._rate_adj.get(k, 0) + delta

    def _adjust_budget(self, scope: str, period: str, spent: int, reserved: int) -> None:
        adj = self._budget_adj.setdefault((scope, period), [0, 0])
        adj[0] += spent
        adj[1] += reserved

    def _give_back_held(self, rates: list[RateLease], spend: list[BudgetLease], held: list[int]) -> None:
        for lease, h in zip(rates, held, strict=False):
            lease.free += h
        for b, h in zip(spend, held[len(rates) :], strict=True):
            b.free += h

    # -- Redis ----------------------------------------------------------------------------------

    def _flush_soon(self, delay: float) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush(delay))

    async def _flush(self, delay: float) -> None:
        """Send what waits, and again (after ``delay``) as long as more came meanwhile."""
        while self._rate_adj or self._budget_adj:
            if delay:
                await asyncio.sleep(delay)
            delay = FLUSH_DELAY_S
            try:
                await self._sync([], [])
            except Exception:  # noqa: BLE001 - logged by _send; a lost flush must not crash the loop
                return

    def _refill_soon(self) -> None:
        if self._refiller is None or self._refiller.done():
            self._refiller = asyncio.get_running_loop().create_task(self._refill())

    async def _refill(self) -> None:
        """Top every slice that ran below half its size up to its size (what fits), in one script run."""
        rate_takes: list[RateTake] = [
            (key, lease, 0, lease.target - lease.free - lease.taking)
            for key, lease in self._rates.items()
            if (lease.free + lease.taking) * 2 < lease.target and lease.window == self._window
        ]
        budget_takes: list[BudgetTake] = [
            (scope, b, 0, b.target - b.free - b.taking)
            for scope, b in self._spend.items()
            if (b.free + b.taking) * 2 < b.target
        ]
        try:
            await self._sync(rate_takes, budget_takes)
        except Exception as exc:  # noqa: BLE001 - requests then take what they need on their path
            log.warning("ledger_lease_refill_failed", error=type(exc).__name__)

    async def _sync(self, rate_takes: list[RateTake], budget_takes: list[BudgetTake]) -> None:
        # NOTE: refills count last minute in full (weight 1): a slice granted now stays within the
        # limit for the rest of the minute, as the sliding window only lets last minute weigh less
        if rate_takes or budget_takes or self._rate_adj or self._budget_adj:
            await self._send(rate_takes, budget_takes, 1.0)

    async def _send(
        self, rate_takes: list[RateTake], budget_takes: list[BudgetTake], weight: float
    ) -> tuple[int, int, list[int]]:
        """One script run: the waiting adjustments, then the takes. Granted slices are added here."""
        rate_adj, self._rate_adj = self._rate_adj, {}
        budget_adj, self._budget_adj = self._budget_adj, {}
        keys = [self._counts.key(k, w) for k, w in rate_adj]
        keys += [self._budgets.key(s, p) for s, p in budget_adj]
        args: list[int | str] = [len(rate_adj), len(budget_adj), len(rate_takes), len(budget_takes)]
        args += [round(weight * 1_000_000), 3 * WINDOW_S, PERIOD_TTL_S]
        args += [self._id, round(self.lease_ttl_s * 1000), *rate_adj.values()]
        for spent, reserved in budget_adj.values():
            args += [spent, reserved]
        for key, lease, need, extra in rate_takes:
            keys += [self._counts.key(key, lease.window), self._counts.key(key, lease.window - 1)]
            args += [lease.limit, need, max(0, extra)]
        for scope, b, need, extra in budget_takes:
            keys.append(self._budgets.key(scope, b.period))
            args += [-1 if b.hard is None else b.hard, need, max(0, extra)]
        leases: list[RateLease | BudgetLease] = [t[1] for t in rate_takes] + [t[1] for t in budget_takes]
        extras = [max(0, t[3]) for t in rate_takes] + [max(0, t[3]) for t in budget_takes]
        for taker, extra in zip(leases, extras, strict=True):
            taker.taking += extra
        sent = time.monotonic()
        try:
            raw = [int(v) for v in await self._script(keys=keys, args=args)]
        except Exception as exc:
            # NOTE: not retried: the script may have run before the connection failed, and an
            # adjustment applied twice would count a cost twice. A lost one leaves a reservation held
            # (in this replica's holding: it expires once this replica shuts down or dies).
            if rate_adj or budget_adj:
                log.error("ledger_settle_failed", error=type(exc).__name__, counters=len(rate_adj) + len(budget_adj))
            raise
        finally:
            for taker, extra in zip(leases, extras, strict=True):
                taker.taking -= extra
        for scope, period in [*budget_adj, *((t[0], t[1].period) for t in budget_takes)]:
            if (held := self._spend.get(scope)) is not None and held.period == period:
                held.renewed = max(held.renewed, sent)
        status, index, rest = raw[0], raw[1], raw[2:]
        if status == 0:
            self._granted(rate_takes, budget_takes, rest)
        if self._spend and (self._renewer is None or self._renewer.done()):
            self._renewer = asyncio.get_running_loop().create_task(self._renew())
        return status, index, rest

    async def _renew(self) -> None:
        """Renew this replica's holdings in every budget scope it leases, every third of their lifetime."""
        while self._spend:
            await asyncio.sleep(self.lease_ttl_s / 3)
            for scope, b in self._spend.items():
                self._adjust_budget(scope, b.period, 0, 0)
            try:
                await self._sync([], [])
            except Exception as exc:  # noqa: BLE001 - retried at the next tick; slices are dropped when too old
                log.warning("ledger_lease_renew_failed", error=type(exc).__name__)

    def _granted(self, rate_takes: list[RateTake], budget_takes: list[BudgetTake], rest: list[int]) -> None:
        for i, (key, lease, need, _) in enumerate(rate_takes):
            cur, prev, granted = rest[3 * i : 3 * i + 3]
            if self._rates.get(key) is lease:
                lease.cur, lease.prev = cur, prev
                lease.free += granted - need
            elif granted > need:  # the minute ended meanwhile: give the slice back
                self._adjust_rate(key, lease.window, need - granted)
        n = 3 * len(rate_takes)
        for j, (scope, b, need, _) in enumerate(budget_takes):
            spent, reserved, granted = rest[n + 3 * j : n + 3 * j + 3]
            if self._spend.get(scope) is b:
                b.spent, b.reserved = spent, reserved
                b.free += granted - need
            elif granted > need:
                self._adjust_budget(scope, b.period, 0, need - granted)


__all__ = ["FLUSH_DELAY_S", "LEASE_REQUESTS", "LEASE_SHARE", "LEASE_TTL_S", "LeasedGate"]
