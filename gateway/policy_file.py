"""The policy file's schema: what each section of the YAML may say, with its defaults and bounds.

Owns the ``msgspec`` structs the loader converts each entry into (``PolicyDoc`` for the whole file,
then one spec per provider, model, SLO class, tenant, routing and cache section), so that a wrong
key or value is reported with its key path. Does not own loading, cross-checks between sections or
the resolved policy the gateway runs on (``gateway.policy``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

ProviderKind = Literal["openai", "anthropic", "gemini", "selfhost"]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Positive = Annotated[float, msgspec.Meta(gt=0)]


class ProviderSpec(msgspec.Struct, forbid_unknown_fields=True):
    """One upstream API account as written in the policy."""

    kind: ProviderKind
    base_url: str | None = None
    """Default base URL; ``base_url_env`` wins when that variable is set."""
    base_url_env: str | None = None
    api_key_env: str | None = None
    """Environment variable holding the key, the same one the vendor's SDK reads."""
    api_key_required: bool = True
    """False for OpenAI-compatible servers that take no key (a local vLLM)."""
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    engine: dict[str, Any] = msgspec.field(default_factory=dict)
    """``selfhost`` only: ``selfhost.config.EngineConfig`` fields (``max_num_seqs``, ``dtype``, ``device``...)."""
    gpu_dollars_per_hour: NonNegative | None = None
    """A self-hosted engine (in-process or its own server): what its GPU costs. Its token prices then
    follow from its measured speed at its current load (``gateway.router.engine_price``)."""
    prefill_cost_ratio: NonNegative = 0.1
    """Self-hosted only: the cost of a prompt token relative to a generated one (prefill is batched)."""


class PriceSpec(msgspec.Struct, forbid_unknown_fields=True):
    """List prices in US dollars per million tokens."""

    input: NonNegative = 0.0
    output: NonNegative = 0.0
    cached_input: NonNegative | None = None
    """Price of prompt tokens read from the provider's cache; ``None`` means the input price."""


class TargetSpec(msgspec.Struct, forbid_unknown_fields=True):
    """One deployment of an alias: a provider, the model name it knows, and what it costs."""

    provider: str
    model: str
    price: PriceSpec | None = None
    batch_discount: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    """Share of the price taken off for requests in the ``batch`` SLO class (0.5 = half price)."""
    max_concurrency: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """In-flight requests this deployment takes; beyond it, it is skipped. Counted over every gateway
    replica when Redis is configured (``gateway.inflight``: each replica adds the others' counts as of
    its last sync, at most 0.1 s old), else per replica."""
    attempt_timeout_s: Positive | None = None
    """Time allowed to the first byte of one attempt; ``None`` means the provider's timeout."""


class ModelSpec(msgspec.Struct, forbid_unknown_fields=True):
    """A model alias that clients ask for."""

    targets: list[TargetSpec]
    description: str | None = None
    fallbacks: list[str] = msgspec.field(default_factory=list)
    """Other aliases tried, in order, once every target of this one has failed (before the first byte)."""


class SloSpec(msgspec.Struct, forbid_unknown_fields=True):
    """A latency objective; a deployment qualifies when its predicted p95s are within these."""

    ttft_p95_ms: Positive | None = None
    tpot_p95_ms: Positive | None = None
    deadline_s: Positive | None = None
    """Batch classes: the whole answer is due within this many seconds."""
    service_tiers: list[str] = msgspec.field(default_factory=list)
    """OpenAI ``service_tier`` values that select this class when no header names one."""
    engine_reserve: Annotated[float, msgspec.Meta(ge=0, lt=1)] | None = None
    """Share of a self-hosted engine's KV cache that this class's requests leave to the other
    classes: below it free, they go to the cheapest other deployment that qualifies. Default: 0.35
    for a deadline-only class, 0 for a class with a latency objective."""
    description: str | None = None


class TenantSpec(msgspec.Struct, forbid_unknown_fields=True):
    """What one tenant may use and what it gets by default."""

    allowed_models: list[str] | None = None
    """Aliases this tenant may call (``None``: all)."""
    default_slo_class: str | None = None
    max_input_price: NonNegative | None = None
    """Deployments dearer than this (dollars per million input tokens) are not used for this tenant."""
    max_output_price: NonNegative | None = None


class RoutingSpec(msgspec.Struct, forbid_unknown_fields=True):
    """How the router and dispatcher behave."""

    explore_share: Annotated[float, msgspec.Meta(ge=0, le=0.5)] = 0.02
    """Share of requests sent to a qualifying deployment other than the best, to keep statistics fresh."""
    retries: Annotated[int, msgspec.Meta(ge=0, le=5)] = 1
    """Further attempts on the same deployment after a retryable error, before falling back."""
    backoff_ms: NonNegative = 100.0
    backoff_max_ms: NonNegative = 2000.0
    total_timeout_s: Positive = 600.0
    """Deadline over all attempts of one request, until its first byte."""
    breaker_failures: Annotated[int, msgspec.Meta(ge=1)] = 5
    """Consecutive failures that open a deployment's circuit breaker."""
    breaker_cooldown_s: Positive = 30.0
    """How long an open breaker waits before letting one probe through."""
    stats_window: Annotated[int, msgspec.Meta(ge=8, le=10_000)] = 200
    """Recent samples per deployment behind the latency quantiles."""


class PolicyDoc(msgspec.Struct, forbid_unknown_fields=True):
    """The whole policy file. Entries are validated one by one so errors can name their key."""

    providers: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    models: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    passthrough: bool = True
    """Let clients ask for ``provider/model`` directly when the provider is enabled."""
    version: int = 1
    slo_classes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    default_slo_class: str | None = None
    tenants: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    routing: dict[str, Any] = msgspec.field(default_factory=dict)
    cache: dict[str, Any] = msgspec.field(default_factory=dict)


CacheMode = Literal["on", "off", "read_only", "write_only"]


class CacheSpec(msgspec.Struct, forbid_unknown_fields=True):
    """The ``cache`` section: the exact-match response cache."""

    mode: CacheMode | bool = "off"
    """``on``, ``off``, ``read_only`` (serve hits, store nothing) or ``write_only`` (store, never serve).
    YAML reads a bare ``on``/``off`` as a boolean; both spellings are accepted."""
    ttl_s: Positive = 3600.0
    cacheable: Literal["deterministic", "opt_in", "all"] = "deterministic"
    """``deterministic``: temperature 0 or a seed; ``opt_in``: requests sending ``x-crossway-cache: use``;
    ``all``: every request."""
    shared_across_tenants: bool = False
    """Off: the tenant is part of the key, so tenants never see each other's answers."""
    key_by: Literal["alias", "deployment"] = "alias"
    """Key on the alias asked for, or on the deployment (``provider/model``) that answers."""
    max_entry_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1 << 20
    """Larger answers are served but not stored."""
    flight_wait_s: Positive = 120.0
    """How long identical concurrent requests wait for the first one's answer before calling upstream."""
