"""Finance queries: spend and goodput (grouped by tenant, model, provider, day...), and budget standing.

Owns the SQL (portable between SQLite and PostgreSQL) and the goodput arithmetic. Does not own HTTP
(``gateway.api.finance``) nor the metrics exposition (``gateway.api.health``), which both read these.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import case, func, select

from gateway.ledger.budget import period_of
from gateway.ledger.record import NANOS_PER_USD
from gateway.store.models import UsageRow

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger.budget import BudgetCounters
    from gateway.ledger.limits import LimitStore
    from gateway.store.db import Database

GroupBy = Literal["tenant", "model", "provider", "deployment", "day"]
GROUPS: tuple[GroupBy, ...] = ("tenant", "model", "provider", "deployment", "day")
GoodputGroupBy = Literal["tenant", "deployment", "slo_class", "day"]
GOODPUT_GROUPS: tuple[GoodputGroupBy, ...] = ("tenant", "deployment", "slo_class", "day")


def _column(group: GroupBy) -> Any:
    if group == "day":
        return func.date(UsageRow.ts)  # a date on PostgreSQL (UTC sessions), a string on SQLite
    return {"tenant": UsageRow.tenant, "model": UsageRow.alias, "provider": UsageRow.provider,
            "deployment": UsageRow.deployment}[group]  # fmt: skip


async def spend(db: Database, start: datetime, end: datetime, group_by: Sequence[GroupBy]) -> list[dict[str, Any]]:
    """Requests (and how many of them failed: any status but 200), tokens and cost per group in ``[start, end)``.

    Largest cost first.
    """
    keys = [_column(g).label(g) for g in group_by]
    stmt = (
        select(
            *keys,
            func.count().label("requests"),
            func.sum(case((UsageRow.status != 200, 1), else_=0)).label("failed"),
            func.sum(UsageRow.input_tokens).label("input_tokens"),
            func.sum(UsageRow.cached_input_tokens).label("cached_input_tokens"),
            func.sum(UsageRow.output_tokens).label("output_tokens"),
            func.sum(UsageRow.cost_nanos).label("cost_nanos"),
            func.sum(UsageRow.saved_nanos).label("saved_nanos"),
        )
        .where(UsageRow.ts >= start, UsageRow.ts < end)
        .group_by(*keys)
    )
    async with db.session() as s:
        result = (await s.execute(stmt)).mappings().all()
    out = []
    for row in result:
        item: dict[str, Any] = {g: (str(row[g]) if row[g] is not None else None) for g in group_by}
        counts = ("requests", "failed", "input_tokens", "cached_input_tokens", "output_tokens")
        item.update({k: int(row[k] or 0) for k in counts})
        item["cost_usd"] = int(row["cost_nanos"] or 0) / NANOS_PER_USD
        item["saved_usd"] = int(row["saved_nanos"] or 0) / NANOS_PER_USD
        out.append(item)
    out.sort(key=lambda r: -r["cost_usd"])
    return out


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def goodput(
    db: Database,
    start: datetime,
    end: datetime,
    group_by: Sequence[GoodputGroupBy] = ("tenant", "deployment", "slo_class"),
) -> list[dict[str, Any]]:
    """Goodput per group (by default per tenant, deployment and SLO class) over ``[start, end)``.

    Each row: the share of requests that met their SLO, SLO-met requests per second, cost per SLO-met
    request, and p50/p95/p99 of TTFT and TPOT (streamed requests only have them). Grouped by ``day``
    (UTC), a row's requests per second are over the part of the range that falls in that day, so a
    series of days is comparable with a whole range.
    """
    stmt = select(
        UsageRow.ts, UsageRow.tenant, UsageRow.deployment, UsageRow.slo_class, UsageRow.slo_met, UsageRow.cost_nanos,
        UsageRow.ttft_ms, UsageRow.tpot_ms,
    ).where(UsageRow.ts >= start, UsageRow.ts < end, UsageRow.deployment.is_not(None))  # fmt: skip
    async with db.session() as s:
        result = (await s.execute(stmt)).all()
    groups: dict[tuple[str | None, ...], list[Any]] = defaultdict(list)
    for row in result:
        groups[tuple(_goodput_key(row, g) for g in group_by)].append(row)
    out = []
    for key, items in sorted(groups.items(), key=lambda kv: tuple(str(k) for k in kv[0])):
        met = sum(1 for r in items if r.slo_met)
        cost = sum(r.cost_nanos for r in items)
        ttft = sorted(r.ttft_ms for r in items if r.ttft_ms is not None)
        tpot = sorted(r.tpot_ms for r in items if r.tpot_ms is not None)
        labels: dict[str, Any] = dict(zip(group_by, key, strict=True))
        seconds = _seconds(start, end, labels.get("day"))
        out.append({
            **labels, "requests": len(items),
            "slo_met": met, "slo_met_share": met / len(items), "goodput_rps": met / seconds,
            "cost_per_slo_met_usd": (cost / met / NANOS_PER_USD) if met else None,
            **{f"ttft_p{int(q * 100)}_ms": _quantile(ttft, q) for q in (0.5, 0.95, 0.99)},
            **{f"tpot_p{int(q * 100)}_ms": _quantile(tpot, q) for q in (0.5, 0.95, 0.99)},
        })  # fmt: skip
    return out


def _goodput_key(row: Any, group: GoodputGroupBy) -> str | None:
    if group == "day":
        return str(row.ts.astimezone(UTC).date())  # the same 'YYYY-MM-DD' as ``spend``'s day
    value = getattr(row, group)
    return None if value is None else str(value)


def _seconds(start: datetime, end: datetime, day: str | None) -> float:
    """The length of ``[start, end)``, or of its overlap with ``day`` (UTC) when one is given."""
    if day is not None:
        lo = datetime.fromisoformat(day).replace(tzinfo=UTC)
        start, end = max(start, lo), min(end, lo + timedelta(days=1))
    return max((end - start).total_seconds(), 1e-9)


async def budget_status(limits: LimitStore, budgets: BudgetCounters, at: datetime) -> list[dict[str, Any]]:
    """Every scope with a budget: its limits, the month's spend and what requests in flight have reserved."""
    period = period_of(at)
    data = []
    for lim in limits.cached():
        if lim.budget_hard_usd is None and lim.budget_soft_usd is None:
            continue
        spent, reserved = await budgets.state(lim.scope, period)
        data.append({
            "tenant": lim.tenant, "key_id": lim.key_id or None, "period": period,
            "soft_limit_usd": lim.budget_soft_usd, "hard_limit_usd": lim.budget_hard_usd,
            "spent_usd": spent / NANOS_PER_USD, "reserved_usd": reserved / NANOS_PER_USD,
        })  # fmt: skip
    return data
