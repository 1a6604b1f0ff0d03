"""Finance routes under ``/admin/finance``: spend, CSV, goodput, budgets, limits, prices.

The ``GET`` routes take the admin key or the read-only finance key; the writes only the admin key.

Owns the HTTP shape; the queries are ``gateway.ledger.reports``'s, limits ``LimitStore``'s and prices
``gateway.ledger.prices``'. Ranges are ``start`` (inclusive) and ``end`` (exclusive) ISO-8601 times,
defaulting to the current month so far.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get, post, put
from litestar.datastructures import State
from litestar.params import FromQuery

from gateway.api.admin import json_response, require_admin, require_reader
from gateway.errors import InvalidRequest
from gateway.ledger import Limits
from gateway.ledger.budget import period_of, period_start
from gateway.ledger.prices import add_price
from gateway.ledger.reports import GOODPUT_GROUPS, GROUPS, budget_status, goodput, spend
from gateway.policy import Price


class _NewLimits(msgspec.Struct, forbid_unknown_fields=True):
    tenant: str
    key_id: int = 0
    rpm: int | None = None
    tpm: int | None = None
    budget_soft_usd: float | None = None
    budget_hard_usd: float | None = None


class _NewPrice(msgspec.Struct, forbid_unknown_fields=True):
    deployment: str
    input: float
    output: float
    cached_input: float | None = None
    effective_from: datetime | None = None
    author: str = "admin"


def _range(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    try:
        lo = datetime.fromisoformat(start) if start else period_start(period_of(now))
        hi = datetime.fromisoformat(end) if end else now
    except ValueError as exc:
        raise InvalidRequest(f"Invalid time: {exc}", param="start") from exc
    return (lo if lo.tzinfo else lo.replace(tzinfo=UTC)), (hi if hi.tzinfo else hi.replace(tzinfo=UTC))


def _groups(group_by: str, known: tuple[str, ...] = GROUPS) -> list[Any]:
    groups = [g for g in group_by.split(",") if g]
    bad = [g for g in groups if g not in known]
    if bad:
        raise InvalidRequest(f"Unknown group {bad[0]!r} (known: {', '.join(known)}).", param="group_by")
    return groups


@get("/admin/finance/spend", summary="Spend by tenant, model, provider or day")
async def get_spend(
    request: Request[Any, Any, Any],
    state: State,
    start: FromQuery[str | None] = None,
    end: FromQuery[str | None] = None,
    group_by: FromQuery[str] = "tenant",
) -> Response[bytes]:
    """Requests, tokens and cost per group over a range."""
    require_reader(request, state)
    lo, hi = _range(start, end)
    rows = await spend(state.db, lo, hi, _groups(group_by))
    return json_response({"start": lo.isoformat(), "end": hi.isoformat(), "data": rows})


@get("/admin/finance/spend.csv", summary="Spend as CSV")
async def get_spend_csv(
    request: Request[Any, Any, Any],
    state: State,
    start: FromQuery[str | None] = None,
    end: FromQuery[str | None] = None,
    group_by: FromQuery[str] = "tenant,model,provider,day",
) -> Response[bytes]:
    """The same figures as ``/admin/finance/spend``, one CSV row per group."""
    require_reader(request, state)
    lo, hi = _range(start, end)
    groups = _groups(group_by)
    rows = await spend(state.db, lo, hi, groups)
    out = io.StringIO()
    fields = [
        *groups,
        "requests",
        "failed",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "cost_usd",
        "saved_usd",
    ]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "cost_usd": f"{row['cost_usd']:.9f}", "saved_usd": f"{row['saved_usd']:.9f}"})
    return Response(
        out.getvalue().encode(),
        media_type="text/csv",
        headers={"content-disposition": 'attachment; filename="spend.csv"'},
    )


@get("/admin/finance/goodput", summary="Goodput per tenant, deployment and SLO class")
async def get_goodput(
    request: Request[Any, Any, Any],
    state: State,
    start: FromQuery[str | None] = None,
    end: FromQuery[str | None] = None,
    group_by: FromQuery[str] = "tenant,deployment,slo_class",
) -> Response[bytes]:
    """Share of requests meeting their SLO, SLO-met requests per second, cost per SLO-met request, latency quantiles.

    ``group_by`` takes ``tenant``, ``deployment``, ``slo_class`` and ``day`` (``day`` alone: a series over time).
    """
    require_reader(request, state)
    lo, hi = _range(start, end)
    groups = _groups(group_by, GOODPUT_GROUPS)
    data = await goodput(state.db, lo, hi, groups)
    return json_response({"start": lo.isoformat(), "end": hi.isoformat(), "data": data})


@get("/admin/finance/budgets", summary="Budget status")
async def get_budgets(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Every scope with a budget: limits, this month's spend and what requests in flight have reserved."""
    require_reader(request, state)
    data = await budget_status(state.ledger.limits, state.ledger.budgets, datetime.now(UTC))
    return json_response({"data": data})


@put("/admin/finance/limits", summary="Set a tenant's or key's limits and budget")
async def put_limits(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Create or replace the limits of a tenant (``key_id`` 0) or of one key."""
    require_admin(request, state)
    try:
        new = msgspec.json.decode(await request.body(), type=_NewLimits)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Invalid request body: {exc}") from exc
    saved = await state.ledger.limits.put(Limits(**msgspec.structs.asdict(new)))
    return json_response({"tenant": saved.tenant, "key_id": saved.key_id, "rpm": saved.rpm, "tpm": saved.tpm,
                  "budget_soft_usd": saved.budget_soft_usd, "budget_hard_usd": saved.budget_hard_usd})  # fmt: skip


@get("/admin/finance/prices", summary="Price versions")
async def get_prices(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Every price version, oldest first per deployment."""
    require_reader(request, state)
    return json_response({"data": [
        {"id": v.id, "deployment": v.deployment, "effective_from": v.effective_from.isoformat(),
         "input": v.price.input, "output": v.price.output, "cached_input": v.price.cached_input, "author": v.author}
        for v in state.ledger.prices.history()
    ]})  # fmt: skip


@post("/admin/finance/prices", summary="Add a price version")
async def post_price(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Append a price version for a deployment, in force from ``effective_from`` (default: now)."""
    require_admin(request, state)
    try:
        new = msgspec.json.decode(await request.body(), type=_NewPrice)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Invalid request body: {exc}") from exc
    since = new.effective_from or datetime.now(UTC)
    since = since if since.tzinfo else since.replace(tzinfo=UTC)
    version = await add_price(
        state.db, new.deployment, since, Price(new.input, new.output, new.cached_input), new.author
    )
    await state.ledger.prices.load(state.db)
    return json_response({"id": version.id, "deployment": version.deployment, "effective_from": since.isoformat()}, 201)


ROUTES = [get_spend, get_spend_csv, get_goodput, get_budgets, put_limits, get_prices, post_price]
