"""Prometheus metrics of the gateway, one registry per app so tests can run several apps.

Owns metric names, labels and buckets. Stages call the small ``observe_*`` methods; nothing else
touches prometheus_client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from collections.abc import Callable

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The gateway's metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "crossway_requests",
            "Requests served, by endpoint, model alias, provider and status.",
            ["endpoint", "model", "provider", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "crossway_request_duration_seconds",
            "Total request latency.",
            ["endpoint", "provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "crossway_ttft_seconds",
            "Time to first token of streamed responses.",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.attempts = Counter(
            "crossway_upstream_attempts",
            "Upstream calls, by provider and outcome.",
            ["provider", "outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "crossway_tokens",
            "Tokens, by provider and kind (input, output, cached_input).",
            ["provider", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "crossway_cost_usd",
            "Spend in US dollars (ledger prices), and what provider cache hits saved, by tenant and provider.",
            ["tenant", "provider", "kind"],
            registry=r,
        )
        self.slo = Counter(
            "crossway_slo_requests",
            "Served requests by tenant, SLO class and whether they met it (goodput numerator).",
            ["tenant", "slo_class", "met"],
            registry=r,
        )
        self.slo_latency = Histogram(
            "crossway_slo_latency_seconds",
            "TTFT and TPOT of served requests by tenant, deployment and SLO class (goodput percentiles).",
            ["tenant", "deployment", "slo_class", "kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.budget = Gauge(
            "crossway_budget_usd",
            "Each budgeted scope's month: spent, reserved by requests in flight, soft and hard limit.",
            ["tenant", "key_id", "kind"],
            registry=r,
        )

    def watch_ledger(self, pending: Callable[[], float]) -> None:
        """Report the usage records waiting to be written (what a crash would lose) at each scrape."""
        Gauge(
            "crossway_ledger_pending_records",
            "Usage records submitted and not yet committed to the database.",
            registry=self.registry,
        ).set_function(pending)

    def observe_request(self, endpoint: str, model: str, provider: str, status: int, seconds: float) -> None:
        """One finished request."""
        self.requests.labels(endpoint, model, provider, str(status)).inc()
        self.duration.labels(endpoint, provider).observe(seconds)

    def observe_attempt(self, provider: str, outcome: str) -> None:
        """One upstream call: ``ok`` or the error class name."""
        self.attempts.labels(provider, outcome).inc()

    def observe_cost(self, tenant: str, provider: str, usd: float, saved_usd: float) -> None:
        """What one request cost and what cache hits saved."""
        self.cost.labels(tenant, provider, "spent").inc(usd)
        if saved_usd:
            self.cost.labels(tenant, provider, "saved").inc(saved_usd)

    def observe_slo(
        self, tenant: str, slo_class: str, met: bool, deployment: str, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        """One served request's SLO verdict and the latencies it was judged on."""
        self.slo.labels(tenant, slo_class, "true" if met else "false").inc()
        if ttft_s is not None:
            self.slo_latency.labels(tenant, deployment, slo_class, "ttft").observe(ttft_s)
        if tpot_s is not None:
            self.slo_latency.labels(tenant, deployment, slo_class, "tpot").observe(tpot_s)

    def set_budgets(self, status: list[dict[str, Any]]) -> None:
        """The budgets' standing (``gateway.ledger.reports.budget_status``), as of this scrape."""
        self.budget.clear()  # a budget removed since the last scrape disappears
        for row in status:
            key_id = str(row["key_id"] or "")
            for kind in ("spent", "reserved", "soft_limit", "hard_limit"):
                value = row[f"{kind}_usd"]
                if value is not None:
                    self.budget.labels(row["tenant"], key_id, kind).set(value)

    def observe_tokens(self, provider: str, input_tokens: int, output_tokens: int, cached: int) -> None:
        """Token counts of one request."""
        self.tokens.labels(provider, "input").inc(input_tokens)
        self.tokens.labels(provider, "output").inc(output_tokens)
        if cached:
            self.tokens.labels(provider, "cached_input").inc(cached)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
