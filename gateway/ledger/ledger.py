"""The ledger as the pipeline sees it: ``admit`` before dispatch, ``finish`` when the request ends.

Owns the order of the checks at admission (buffer room, rate limits, budget reservation), the
per-request accounting context (``Admission``), turning an outcome into a ``UsageRecord`` priced
under the version in force, and settling the reservation and the token charge exactly once per
request, and the record of a request refused before admission. Does not own storage (``writer``),
counters (``budget``, ``ratelimit``) and the one-step admission and settlement over them (``gate``),
limits (``limits``) or prices (``prices``); it composes them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import func, select

from gateway.errors import BudgetExceeded, RateLimited
from gateway.ledger.budget import period_of, period_start
from gateway.ledger.gate import Reservation, Settlement, gate_for
from gateway.ledger.ratelimit import Rule, verdict
from gateway.ledger.record import NANOS_PER_USD, UsageRecord, cost_of, slo_met, worst_case_nanos
from gateway.store.models import UsageRow

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.ledger.budget import BudgetCounters, Refused
    from gateway.ledger.gate import Outcome
    from gateway.ledger.limits import Limits, LimitStore
    from gateway.ledger.prices import PriceBook
    from gateway.ledger.ratelimit import Ask, Charged, HeaderStyle, RateLimiter
    from gateway.ledger.writer import LedgerWriter
    from gateway.policy import Plan, Target
    from gateway.store.db import Database
    from gateway.store.keys import Principal
    from gateway.types import Usage

log = structlog.get_logger(__name__)

SETTLE_BATCH = 256
"""Most settlements sent in one round trip (one script run keeps Redis busy for that long)."""


@dataclass(slots=True)
class Admission:
    """One admitted request's accounting context, from ``admit`` to ``finish``."""

    principal: Principal
    plan: Plan
    request_id: str
    endpoint: str
    """``chat.completions``, ``messages`` or ``embeddings``."""
    started: float
    """``time.perf_counter()`` when the request arrived."""
    streamed: bool
    at: datetime
    """Wall-clock admission time: prices in force then apply, and the budget period is its month."""
    budget_scopes: tuple[str, ...] = ()
    period: str = ""
    reserved: int = 0
    """Nano-dollars reserved in each budget scope."""
    charged: Charged | None = None
    reservation: Reservation | None = None
    """The budget reservation made at admission, settled when the request ends."""
    soft_exceeded: bool = False
    """The reservation passed a soft limit: the request runs, flagged in a header and the log."""
    ttft_s: float | None = None
    """Set by the pipeline when a stream's first event arrives (seconds since the request started)."""
    settled: bool = field(default=False)

    def headers(self, style: HeaderStyle = "openai") -> dict[str, str]:
        """Response headers: the rate limits' standing and, past a soft limit, ``x-crossway-budget: soft-limit``.

        The standing (``x-ratelimit-*``, or ``anthropic-ratelimit-*`` for ``style="anthropic"``) is there
        only when a rate limit applies to the request.
        """
        out = self.charged.headers(style) if self.charged is not None else {}
        if self.soft_exceeded:
            out["x-crossway-budget"] = "soft-limit"
        return out


class Ledger:
    """Admission checks and usage records for every request.

    Args:
        db: Where the period's spend is read when budget counters start.
        writer: Write-behind of records.
        prices: Price versions.
        limits: Per-tenant and per-key limits.
        budgets: Budget counters (Redis or in-process).
        rates: Rate limiter, its counts where ``budgets`` are (both in process or both in one Redis).
        default_max_output_tokens: The output a budgeted request without ``max_tokens`` is reserved
            for, and capped at (so its spend cannot pass its reservation).
        now: Wall clock (UTC), injectable for tests.
    """

    def __init__(
        self,
        db: Database,
        writer: LedgerWriter,
        prices: PriceBook,
        limits: LimitStore,
        budgets: BudgetCounters,
        rates: RateLimiter,
        *,
        default_max_output_tokens: int = 4096,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.db = db
        self.writer = writer
        self.prices = prices
        self.limits = limits
        self.budgets = budgets
        self.rates = rates
        self.gate = gate_for(rates.counts, budgets)
        """Admission and settlement, each one atomic step (with Redis: local while this replica's slices cover it)."""
        self.default_max_output_tokens = default_max_output_tokens
        self._now = now
        self._seeded: set[tuple[str, str]] = set()
        self._unsettled: list[Settlement] = []
        self._closing = False
        self._settler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load prices and limits, start the writer."""
        await self.prices.load(self.db)
        await self.limits.reload()
        self.writer.start()

    async def aclose(self) -> None:
        """Finish pending settlements, then flush every record (graceful shutdown)."""
        self._closing = True
        if self._settler is not None:
            await self._settler
        if self._unsettled:  # what ended after the settler's last look
            await self._settle()
        await self.gate.aclose()
        await self.writer.aclose()

    async def admit(
        self,
        principal: Principal,
        plan: Plan,
        *,
        request_id: str,
        endpoint: str,
        started: float,
        streamed: bool,
        input_tokens: Callable[[], int],
        max_output_tokens: int | None,
    ) -> tuple[Admission, int | None]:
        """Check and charge a request before it is dispatched. A refused request is recorded too.

        Args:
            principal: Who asks.
            plan: The deployments it may use (its worst-case cost is the dearest of them).
            request_id: The request's id.
            endpoint: ``chat.completions``, ``messages`` or ``embeddings``.
            started: ``time.perf_counter()`` when the request arrived.
            streamed: Whether the answer is streamed.
            input_tokens: Estimates the prompt's tokens; called only when a limit needs it.
            max_output_tokens: The request's ``max_tokens``.

        Returns:
            The admission, and the ``max_tokens`` the request must be sent with: the caller's, or the
            default cap when a budget applies and the caller set none (``None``: leave it unset).

        Raises:
            RateLimited: a requests- or tokens-per-minute limit of the tenant or the key is reached.
            BudgetExceeded: the worst-case cost would take the tenant or the key past its hard budget.
        """
        await self.writer.room()
        admission = Admission(principal, plan, request_id, endpoint, started, streamed, self._now())
        try:
            return admission, await self._check(admission, input_tokens, max_output_tokens)
        except (RateLimited, BudgetExceeded) as exc:
            self.finish(admission, target=None, status=exc.status_code, usage=None, error=type(exc).__name__)
            raise

    async def _check(
        self, admission: Admission, input_tokens: Callable[[], int], max_output_tokens: int | None
    ) -> int | None:
        principal = admission.principal
        tenant_limits, key_limits = await self.limits.of(principal.tenant, principal.key_id)
        scopes = [s for s in (tenant_limits, key_limits) if s is not None]
        if not scopes:  # the common case: no counter is touched, no token is counted
            return max_output_tokens
        budgeted = [s for s in scopes if s.budget_hard_usd is not None or s.budget_soft_usd is not None]
        if budgeted and max_output_tokens is None:
            max_output_tokens = self.default_max_output_tokens
        rules = [Rule(s.scope, "requests", s.rpm) for s in scopes if s.rpm is not None]
        rules += [Rule(s.scope, "tokens", s.tpm) for s in scopes if s.tpm is not None]
        prompt = input_tokens() if budgeted or any(r.kind == "tokens" for r in rules) else 0
        output = max_output_tokens or 0
        ask = self.rates.ask(rules, prompt + output) if rules else None
        reservation = await self._reservation(admission, budgeted, prompt, output) if budgeted else None
        outcome = await self._admit_step(ask, reservation)
        charged = verdict(ask, outcome.rates_ok, outcome.before) if ask is not None else None  # 429
        if outcome.refused is not None and reservation is not None:  # nothing was charged: nothing to settle
            raise _exceeded(outcome.refused, reservation)
        admission.charged = charged
        if reservation is not None:
            admission.reservation = reservation
            admission.budget_scopes = tuple(s for s, _ in reservation.scopes)
            admission.period, admission.reserved = reservation.period, reservation.amount
            for s, (spent_now, reserved_now) in zip(budgeted, outcome.states, strict=True):
                soft = _nanos(s.budget_soft_usd)
                if soft is not None and spent_now + reserved_now > soft:
                    admission.soft_exceeded = True
                    log.warning(
                        "budget_soft_limit",
                        scope=s.scope,
                        period=reservation.period,
                        spent_usd=spent_now / NANOS_PER_USD,
                    )
        return max_output_tokens

    async def _admit_step(self, ask: Ask | None, reservation: Reservation | None) -> Outcome:
        """The gate's one admission step, carrying the settlements that waited for it.

        The step runs to its end even when the caller goes away meanwhile (its settlements belong to
        other requests); what it then charged for the vanished caller is given back.
        """
        waiting, self._unsettled = self._unsettled, []
        decided, settlements = self.gate.admit_now(ask, reservation, waiting)
        if decided is not None:  # no I/O: nothing to shield
            return decided
        step = asyncio.ensure_future(self.gate.admit(ask, reservation, settlements))
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            step.add_done_callback(lambda done: self._give_back(done, ask, reservation))
            raise
        except Exception:
            # NOTE: not retried: the script may have run before the connection failed, and a settlement
            # applied twice would count a cost twice. A lost one leaves its reservation held until re-seeding.
            if settlements:
                log.error("ledger_settle_failed", requests=len(settlements), cost=sum(x.actual for x in settlements))
            raise

    def _give_back(self, step: asyncio.Future[Outcome], ask: Ask | None, reservation: Reservation | None) -> None:
        """Release what an admission charged for a caller that went away before it returned."""
        if step.cancelled() or step.exception() is not None:
            return
        outcome = step.result()
        if not outcome.rates_ok or outcome.refused is not None:
            return  # refused: nothing was charged
        charged = verdict(ask, True, outcome.before) if ask is not None else None
        self._queue_settlement(Settlement(charged, 0, reservation, 0))

    def _queue_settlement(self, settlement: Settlement) -> None:
        self._unsettled.append(settlement)
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle())

    async def _reservation(self, admission: Admission, scopes: list[Limits], prompt: int, output: int) -> Reservation:
        period = period_of(admission.at)
        amount = max(
            (
                worst_case_nanos(prompt, output, self.prices.price_for(t, admission.at).price)
                for t in (*admission.plan.targets, *admission.plan.fallbacks)
            ),
            default=0,
        )
        for s in scopes:
            await self._seed(s, period)
        return Reservation(tuple((s.scope, _nanos(s.budget_hard_usd)) for s in scopes), period, amount)

    async def _seed(self, limits: Limits, period: str) -> None:
        """Start a scope's counters at the period's spend so far (once per process and period)."""
        if (limits.scope, period) in self._seeded:
            return
        if not await self.budgets.seeded(limits.scope, period):
            column = UsageRow.key_id if limits.key_id else UsageRow.tenant
            value: int | str = limits.key_id or limits.tenant
            async with self.db.session() as s:
                stored = await s.scalar(
                    select(func.coalesce(func.sum(UsageRow.cost_nanos), 0)).where(
                        column == value, UsageRow.ts >= period_start(period)
                    )
                )
            unwritten = sum(
                r.cost_nanos
                for r in self.writer.pending_records()
                if (r.key_id == limits.key_id if limits.key_id else r.tenant == limits.tenant)
                and period_of(r.ts) == period
            )
            await self.budgets.seed(limits.scope, period, int(stored or 0) + unwritten)
        self._seeded.add((limits.scope, period))

    def refuse(
        self,
        principal: Principal,
        *,
        request_id: str,
        endpoint: str,
        started: float,
        alias: str,
        status: int,
        error: str,
        streamed: bool = False,
    ) -> UsageRecord:
        """Record a request of a known tenant refused before admission (bad body, unknown or forbidden model).

        Such a request used no tokens and costs nothing; its record says how it failed. A request refused
        at admission (rate limit, budget) is recorded by ``admit`` itself; one without a tenant (401) is not.
        """
        record = UsageRecord(
            id=UsageRecord.new_id(),
            ts=self._now(),
            request_id=request_id,
            endpoint=endpoint,
            alias=alias,
            status=status,
            tenant=principal.tenant,
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            streamed=streamed,
            latency_ms=(time.perf_counter() - started) * 1000,
            error=error,
        )
        self.writer.submit(record)
        return record

    def finish(
        self,
        admission: Admission,
        *,
        target: Target | None,
        status: int,
        usage: Usage | None,
        error: str | None = None,
    ) -> UsageRecord | None:
        """Record how an admitted request ended and settle its charges; a second call does nothing.

        Args:
            admission: From ``admit``.
            target: The deployment that served it, ``None`` when none did.
            status: HTTP status the caller saw (499: the caller went away).
            usage: Tokens used (billed even when the request failed mid-stream), ``None`` when unknown.
            error: The error class name of a failed request.

        Returns:
            The record handed to the writer, or ``None`` when this admission was already finished.
        """
        if admission.settled:
            return None
        admission.settled = True
        latency = time.perf_counter() - admission.started
        plan = admission.plan
        if target is not None and usage is not None:  # an engine's price follows its measured throughput
            self.prices.observe(target, admission.started, admission.started + latency, usage.output_tokens)
        priced = self.prices.price_for(target, admission.at) if target is not None else None
        discount = target.batch_discount if target is not None and plan.slo.deadline_s is not None else 0.0
        cost = cost_of(usage, priced.price, discount=discount) if usage is not None and priced else None
        output = usage.output_tokens if usage is not None else 0
        ttft = admission.ttft_s
        tpot = (latency - ttft) / (output - 1) if ttft is not None and output > 1 else None
        record = UsageRecord(
            id=UsageRecord.new_id(),
            ts=self._now(),
            request_id=admission.request_id,
            endpoint=admission.endpoint,
            alias=plan.alias,
            status=status,
            tenant=admission.principal.tenant,
            tenant_id=admission.principal.tenant_id,
            key_id=admission.principal.key_id,
            provider=target.provider if target is not None else None,
            deployment=target.key if target is not None else None,
            slo_class=plan.slo.name,
            streamed=admission.streamed,
            input_tokens=usage.input_tokens if usage is not None else 0,
            cached_input_tokens=usage.cached_input_tokens if usage is not None else 0,
            cache_write_tokens=usage.cache_write_tokens if usage is not None else 0,
            output_tokens=output,
            usage_source=usage.source if usage is not None else "none",
            price_id=priced.price_id if priced is not None else None,
            cost_nanos=cost.nanos if cost is not None else 0,
            saved_nanos=cost.saved if cost is not None else 0,
            ttft_ms=ttft * 1000 if ttft is not None else None,
            tpot_ms=tpot * 1000 if tpot is not None else None,
            latency_ms=latency * 1000,
            slo_met=slo_met(plan.slo, latency, ttft, tpot, output) if status == 200 else None,
            error=error,
        )
        self.writer.submit(record)
        if admission.reservation is not None or admission.charged is not None:
            tokens = (usage.input_tokens + usage.output_tokens) if usage is not None else 0
            self._queue_settlement(Settlement(admission.charged, tokens, admission.reservation, record.cost_nanos))
        return record

    async def _settle(self) -> None:
        """Settle what no admission carried within ``settle_delay_s``, one round trip per batch."""
        if self.gate.settle_delay_s and not self._closing:
            await asyncio.sleep(self.gate.settle_delay_s)
        while self._unsettled:
            batch, self._unsettled = self._unsettled[:SETTLE_BATCH], self._unsettled[SETTLE_BATCH:]
            try:
                await self.gate.settle(batch)
            except Exception as exc:  # noqa: BLE001 - a lost settlement must not crash the loop; the log says which
                cost = sum(s.actual for s in batch)
                log.error("ledger_settle_failed", error=type(exc).__name__, requests=len(batch), cost=cost)


def _exceeded(refused: Refused, reservation: Reservation) -> BudgetExceeded:
    return BudgetExceeded(
        f"Budget exhausted for `{refused.scope}` in {reservation.period}: ${refused.spent / NANOS_PER_USD:.4f} spent, "
        f"${refused.reserved / NANOS_PER_USD:.4f} reserved by requests in flight (and replicas' slices), "
        f"hard limit ${refused.hard / NANOS_PER_USD:.4f}; "
        f"this request may cost up to ${reservation.amount / NANOS_PER_USD:.6f}.",
        code="budget_exceeded",
    )


def _nanos(usd: float | None) -> int | None:
    return round(usd * NANOS_PER_USD) if usd is not None else None
