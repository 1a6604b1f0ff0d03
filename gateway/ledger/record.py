"""The usage record: one row per request, whatever its outcome, and how its cost is computed.

Owns the record's fields, the cost arithmetic (integer nano-dollars, so sums are exact to the
cent on every back-end), the money saved by provider cache hits, and the SLO verdict from measured
TTFT, TPOT and total latency. Does not own where prices come from (``gateway.ledger.prices``) nor
writing records (``gateway.ledger.writer``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from datetime import datetime

    from gateway.policy import Price, SloClass
    from gateway.types import Usage

NANOS_PER_USD = 1_000_000_000
"""Costs are integer nano-dollars: a price in dollars per million tokens is nano-dollars per 1000 tokens."""


@dataclass(slots=True)
class UsageRecord:
    """What one request used and cost, and how fast it was served; written behind the response."""

    id: str
    """Unique per record (a UUID's hex); makes a retried batch insert idempotent."""
    ts: datetime
    """When the request finished (UTC)."""
    request_id: str
    endpoint: str
    """``chat.completions``, ``messages`` or ``embeddings``."""
    alias: str
    """The model the caller asked for."""
    status: int
    """HTTP status the caller saw; 499 when the caller went away mid-stream."""
    tenant: str | None = None
    """``None`` when the request failed before authentication."""
    tenant_id: int | None = None
    key_id: int | None = None
    provider: str | None = None
    """The provider that served it; ``None`` when no deployment answered."""
    deployment: str | None = None
    """``provider/model`` of the deployment that served it."""
    slo_class: str = "standard"
    streamed: bool = False
    input_tokens: int = 0
    """All prompt tokens, cached and cache-write tokens included."""
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    usage_source: str = "none"
    """``provider`` (reported upstream), ``engine`` (exact, self-hosted), ``estimate`` (tiktoken) or ``none``."""
    price_id: int | None = None
    """The price version in force (row of ``prices``); ``None`` for the policy's list price or no price."""
    cost_nanos: int = 0
    saved_nanos: int = 0
    """What cache hits saved against the full input price."""
    queue_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    latency_ms: float = 0.0
    slo_met: bool | None = None
    """``None`` when the request failed (it has no latency to judge)."""
    error: str | None = None
    """The error class name when the request failed."""

    @staticmethod
    def new_id() -> str:
        """A fresh record id."""
        return uuid.uuid4().hex


class Cost(NamedTuple):
    """A request's cost and what cache hits saved, in nano-dollars."""

    nanos: int
    saved: int


def cost_of(usage: Usage, price: Price | None, *, discount: float = 0.0) -> Cost:
    """The cost of ``usage`` at ``price`` (dollars per million tokens), minus ``discount`` (0..1).

    Cached prompt tokens are charged at the cached-input price (the input price when none is given);
    cache-write tokens at the input price. Each part is rounded to a whole nano-dollar once, so the
    same usage always costs the same integer and sums are exact.
    """
    if price is None:
        return Cost(0, 0)
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    cached_price = price.input if price.cached_input is None else price.cached_input
    keep = 1.0 - discount
    full = (usage.input_tokens - cached) * price.input + usage.output_tokens * price.output
    cost = round(full * 1000 * keep) + round(cached * cached_price * 1000 * keep)
    saved = round(cached * max(price.input - cached_price, 0.0) * 1000 * keep)
    return Cost(cost, saved)


def worst_case_nanos(input_tokens: int, output_tokens: int, price: Price | None) -> int:
    """An upper bound of a request's cost before it runs: no cache hits, every allowed output token."""
    if price is None:
        return 0
    return round((input_tokens * price.input + output_tokens * price.output) * 1000)


def slo_met(slo: SloClass, latency_s: float, ttft_s: float | None, tpot_s: float | None, output_tokens: int) -> bool:
    """Whether a served request met its class's objectives.

    A streamed request is judged on its TTFT and TPOT. A non-streamed one has no first byte before the
    whole answer, so it is judged on its total latency against the time the objectives allow for its
    answer, ``ttft + tpot * (output_tokens - 1)``. A deadline bounds the total latency in both cases.
    """
    if slo.deadline_s is not None and latency_s > slo.deadline_s:
        return False
    ttft_limit = slo.ttft_p95_ms / 1000 if slo.ttft_p95_ms is not None else None
    tpot_limit = slo.tpot_p95_ms / 1000 if slo.tpot_p95_ms is not None else None
    if ttft_s is not None:
        if ttft_limit is not None and ttft_s > ttft_limit:
            return False
        return tpot_limit is None or tpot_s is None or tpot_s <= tpot_limit
    if ttft_limit is None and tpot_limit is None:
        return True
    allowed = (ttft_limit or 0.0) + (tpot_limit or 0.0) * max(output_tokens - 1, 0)
    if ttft_limit is None:  # only a TPOT objective: judge the decode part alone
        return latency_s <= allowed if output_tokens > 1 else True
    return latency_s <= allowed
