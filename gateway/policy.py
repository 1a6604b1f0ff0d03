"""Routing policy: load and validate the YAML, then resolve a requested model to an ordered plan.

Owns loading the file against its schema (``gateway.policy_file``) and validating it (errors name
the file and the key path), provider credentials resolved from the settings' environment snapshot,
the resolved policy the gateway runs on, and ``resolve``: a pure function from a model name to the
targets to try. Does not own calling providers (``gateway.dispatch``) or anything about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import yaml

from gateway.errors import InvalidRequest, PermissionDenied, UnknownModel
from gateway.policy_file import (
    CacheMode,
    CacheSpec,
    ModelSpec,
    PolicyDoc,
    ProviderKind,
    ProviderSpec,
    RoutingSpec,
    SloSpec,
    TargetSpec,
    TenantSpec,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

_S = TypeVar("_S", bound=msgspec.Struct)

_DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "selfhost": "inprocess://engine",
}


class PolicyError(ValueError):
    """A policy file is invalid; the message names the file and the key path."""


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """A provider with its credentials resolved; what adapters are built from."""

    name: str
    kind: ProviderKind
    base_url: str
    api_key: str | None = field(repr=False)
    timeout_s: float
    connect_timeout_s: float
    headers: Mapping[str, str] = field(default_factory=dict)
    key_required: bool = True
    engine: dict[str, Any] = field(default_factory=dict)
    """Engine options of a ``selfhost`` provider."""
    gpu_dollars_per_hour: float | None = None
    """Set for self-hosted engines: their token prices derive from it (``gateway.router``)."""
    prefill_cost_ratio: float = 0.1

    @property
    def enabled(self) -> bool:
        """Whether requests may be sent to it: it has a key, or needs none."""
        return self.api_key is not None or not self.key_required


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per million tokens."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """One deployment a request can be sent to: provider, upstream model and its terms."""

    provider: str
    model: str
    price: Price | None = None
    """List price; ``None`` for a self-hosted engine (derived from its GPU cost) or when unknown (free)."""
    batch_discount: float = 0.0
    max_concurrency: int | None = None
    attempt_timeout_s: float | None = None

    @property
    def key(self) -> str:
        """``provider/model``: how statistics, breakers and headers name this deployment."""
        return f"{self.provider}/{self.model}"


@dataclass(frozen=True, slots=True)
class SloClass:
    """A latency objective (see ``SloSpec``)."""

    name: str
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    deadline_s: float | None = None
    service_tiers: tuple[str, ...] = ()
    engine_reserve: float = 0.0
    """Share of an engine's KV cache this class leaves to the others (see ``SloSpec.engine_reserve``)."""


@dataclass(frozen=True, slots=True)
class TenantRules:
    """A tenant's overrides (see ``TenantSpec``)."""

    allowed_models: frozenset[str] | None = None
    default_slo_class: str | None = None
    max_input_price: float | None = None
    max_output_price: float | None = None


@dataclass(frozen=True, slots=True)
class RoutingOptions:
    """The ``routing`` section (see ``RoutingSpec``)."""

    explore_share: float = 0.02
    retries: int = 1
    backoff_ms: float = 100.0
    backoff_max_ms: float = 2000.0
    total_timeout_s: float = 600.0
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0
    stats_window: int = 200


# --- response cache (issue 5) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheRules:
    """The compiled ``cache`` section (see ``CacheSpec``)."""

    mode: CacheMode = "off"
    ttl_s: float = 3600.0
    cacheable: Literal["deterministic", "opt_in", "all"] = "deterministic"
    shared_across_tenants: bool = False
    key_by: Literal["alias", "deployment"] = "alias"
    max_entry_bytes: int = 1 << 20
    flight_wait_s: float = 120.0

    @property
    def reads(self) -> bool:
        """Hits may be served."""
        return self.mode in ("on", "read_only")

    @property
    def writes(self) -> bool:
        """Answers may be stored."""
        return self.mode in ("on", "write_only")


def _cache_rules(raw: dict[str, Any], source: str) -> CacheRules:
    spec = _convert(raw, CacheSpec, "$.cache", source)
    mode: CacheMode = ("on" if spec.mode else "off") if isinstance(spec.mode, bool) else spec.mode
    return CacheRules(
        mode,
        spec.ttl_s,
        spec.cacheable,
        spec.shared_across_tenants,
        spec.key_by,
        spec.max_entry_bytes,
        spec.flight_wait_s,
    )


STANDARD = SloClass("standard")
"""The class used when a policy defines none: no latency objective, so the cheapest healthy target wins."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a request may use: the alias's own targets (ranked by the router) and the fallbacks after them."""

    alias: str
    targets: tuple[Target, ...]
    fallbacks: tuple[Target, ...] = ()
    slo: SloClass = STANDARD
    tenant: TenantRules | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated policy, ready to resolve requests. Immutable: a new edit builds a new Policy."""

    source: str
    providers: Mapping[str, ProviderConfig]
    models: Mapping[str, tuple[Target, ...]]
    passthrough: bool
    fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    slo_classes: Mapping[str, SloClass] = field(default_factory=dict)
    default_slo_class: str | None = None
    tenants: Mapping[str, TenantRules] = field(default_factory=dict)
    routing: RoutingOptions = field(default_factory=RoutingOptions)
    cache: CacheRules = field(default_factory=CacheRules)
    text: str = field(default="", repr=False)
    """The YAML this policy was compiled from."""

    def resolve(self, model: str, tenant: str | None = None, slo: str | None = None) -> Plan:
        """Resolve a requested model to what the router may choose from, for this tenant and SLO class.

        Args:
            model: an alias, or ``provider/model`` when passthrough is on.
            tenant: the caller's tenant; its overrides (allowed models, price caps, default class) apply.
            slo: an SLO class the caller asked for (header or ``service_tier``), or ``None``.

        Raises:
            UnknownModel: no alias or passthrough matches, or no target's provider is configured.
            PermissionDenied: the tenant may not use this model, or every target is above its price caps.
            InvalidRequest: ``slo`` names no SLO class.
        """
        rules = self.tenants.get(tenant) if tenant is not None else None
        targets = self.models.get(model)
        if targets is None and self.passthrough and "/" in model:
            provider, _, upstream = model.partition("/")
            if provider in self.providers and upstream:
                targets = (Target(provider, upstream),)
        if targets is None:
            raise UnknownModel(
                f"The model `{model}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        if rules is not None and rules.allowed_models is not None and model not in rules.allowed_models:
            raise PermissionDenied(
                f"Tenant `{tenant}` may not use the model `{model}`.", param="model", code="model_not_allowed"
            )
        enabled = tuple(t for t in targets if self.providers[t.provider].enabled)
        affordable = tuple(t for t in enabled if _within_caps(t, rules))
        seen = set(affordable)
        fallbacks: list[Target] = []
        for alias in self._fallback_chain(model):
            for t in self.models[alias]:
                if t not in seen and self.providers[t.provider].enabled and _within_caps(t, rules):
                    seen.add(t)
                    fallbacks.append(t)
        if not affordable and fallbacks:  # the alias's own deployments are off: its fallbacks serve it
            affordable, fallbacks = tuple(fallbacks), []
        if not enabled and not affordable:
            needed = sorted({self.providers[t.provider].name for t in targets})
            raise UnknownModel(
                f"The model `{model}` has no configured provider (configure {', '.join(needed)}).",
                param="model",
                code="model_not_found",
            )
        if not affordable:
            raise PermissionDenied(
                f"Every deployment of `{model}` is above tenant `{tenant}`'s price caps.",
                param="model",
                code="price_cap",
            )
        return Plan(model, affordable, tuple(fallbacks), self.slo_class(slo, rules), rules)

    def slo_class(self, requested: str | None, rules: TenantRules | None = None) -> SloClass:
        """The SLO class a request gets: the one it asked for, else its tenant's default, else the policy's.

        Raises:
            InvalidRequest: ``requested`` names no SLO class (and no ``service_tier`` of one).
        """
        if requested is not None:
            if requested in self.slo_classes:
                return self.slo_classes[requested]
            for cls in self.slo_classes.values():
                if requested in cls.service_tiers:
                    return cls
            known = ", ".join(sorted(self.slo_classes)) or "none defined"
            raise InvalidRequest(
                f"Unknown SLO class `{requested}` (known: {known}).", param="x-crossway-slo", code="unknown_slo_class"
            )
        name = (rules.default_slo_class if rules else None) or self.default_slo_class
        if name is not None:
            return self.slo_classes[name]
        return self.slo_classes.get("standard", STANDARD)

    def available_models(self, tenant: str | None = None) -> list[str]:
        """Aliases with at least one enabled target that ``tenant`` may use, sorted."""
        rules = self.tenants.get(tenant) if tenant is not None else None
        allowed = rules.allowed_models if rules is not None else None
        return sorted(
            a
            for a in self.models
            if (allowed is None or a in allowed)
            and any(
                self.providers[t.provider].enabled for name in (a, *self._fallback_chain(a)) for t in self.models[name]
            )
        )

    def _fallback_chain(self, alias: str) -> list[str]:
        """Fallback aliases in the order they are tried: depth first, each once (acyclic by validation)."""
        chain: list[str] = []
        stack = list(reversed(self.fallbacks.get(alias, ())))
        while stack:
            name = stack.pop()
            if name != alias and name not in chain:
                chain.append(name)
                stack.extend(reversed(self.fallbacks.get(name, ())))
        return chain


def _within_caps(target: Target, rules: TenantRules | None) -> bool:
    if rules is None or target.price is None:
        return True
    if rules.max_input_price is not None and target.price.input > rules.max_input_price:
        return False
    return rules.max_output_price is None or target.price.output <= rules.max_output_price


def load_policy(path: Path, env: Mapping[str, str]) -> Policy:
    """Read, validate and compile a policy file.

    Raises:
        PolicyError: the file is missing, not YAML, or invalid; the message names file and key path.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file: {exc.strerror}") from exc
    return parse_policy(text, env, source=str(path))


def parse_policy(text: str, env: Mapping[str, str], *, source: str = "<policy>") -> Policy:
    """Validate and compile policy YAML text (see ``load_policy``)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from exc
    if raw is not None and not isinstance(raw, dict):
        raise PolicyError(f"{source}: `$`: expected a mapping at the top level, got {type(raw).__name__}")
    doc = _convert(raw if raw is not None else {}, PolicyDoc, "$", source)
    providers = {
        name: _provider_config(name, _convert(spec, ProviderSpec, f"$.providers.{name}", source), env)
        for name, spec in doc.providers.items()
    }
    specs = {alias: _convert(spec, ModelSpec, f"$.models.{alias}", source) for alias, spec in doc.models.items()}
    models: dict[str, tuple[Target, ...]] = {}
    for alias, spec in specs.items():
        if not spec.targets:
            raise PolicyError(f"{source}: `$.models.{alias}.targets` must name at least one target")
        for i, t in enumerate(spec.targets):
            if t.provider not in providers:
                raise PolicyError(
                    f"{source}: `$.models.{alias}.targets[{i}].provider`: unknown provider "
                    f"{t.provider!r} (known: {', '.join(sorted(providers)) or 'none'})"
                )
        models[alias] = tuple(_target(t) for t in spec.targets)
    fallbacks = {alias: tuple(spec.fallbacks) for alias, spec in specs.items() if spec.fallbacks}
    _check_fallbacks(fallbacks, models, source)
    slo_classes = {
        name: _slo_class(name, _convert(spec, SloSpec, f"$.slo_classes.{name}", source))
        for name, spec in doc.slo_classes.items()
    }
    _check_slo_name(doc.default_slo_class, slo_classes, "$.default_slo_class", source)
    tenants: dict[str, TenantRules] = {}
    for name, raw_rules in doc.tenants.items():
        spec_t = _convert(raw_rules, TenantSpec, f"$.tenants.{name}", source)
        _check_slo_name(spec_t.default_slo_class, slo_classes, f"$.tenants.{name}.default_slo_class", source)
        for i, alias in enumerate(spec_t.allowed_models or []):
            if alias not in models and not (doc.passthrough and alias.partition("/")[0] in providers):
                raise PolicyError(f"{source}: `$.tenants.{name}.allowed_models[{i}]`: unknown model {alias!r}")
        tenants[name] = TenantRules(
            allowed_models=frozenset(spec_t.allowed_models) if spec_t.allowed_models is not None else None,
            default_slo_class=spec_t.default_slo_class,
            max_input_price=spec_t.max_input_price,
            max_output_price=spec_t.max_output_price,
        )
    routing = msgspec.structs.asdict(_convert(doc.routing, RoutingSpec, "$.routing", source))
    return Policy(
        source=source,
        providers=providers,
        models=models,
        passthrough=doc.passthrough,
        fallbacks=fallbacks,
        slo_classes=slo_classes,
        default_slo_class=doc.default_slo_class,
        tenants=tenants,
        routing=RoutingOptions(**routing),
        cache=_cache_rules(doc.cache, source),
        text=text,
    )


def _target(spec: TargetSpec) -> Target:
    price = spec.price
    return Target(
        spec.provider,
        spec.model,
        price=Price(price.input, price.output, price.cached_input) if price is not None else None,
        batch_discount=spec.batch_discount,
        max_concurrency=spec.max_concurrency,
        attempt_timeout_s=spec.attempt_timeout_s,
    )


DEFERRABLE_ENGINE_RESERVE = 0.35
"""A deadline-only class's ``engine_reserve`` unless the policy sets one.

NOTE(hsim): filled with batch work at peak, the engine sent interactive requests to an API at twice
the budget API's discounted batch price (bench/routing_sim.py: goodput/$ +15 %; 0.2, 0.35 and 0.5
were tried, 0.35 and 0.5 within 0.5 % of each other)."""


def _slo_class(name: str, spec: SloSpec) -> SloClass:
    reserve = spec.engine_reserve
    if reserve is None:
        deadline_only = spec.ttft_p95_ms is None and spec.tpot_p95_ms is None
        reserve = DEFERRABLE_ENGINE_RESERVE if deadline_only else 0.0
    return SloClass(name, spec.ttft_p95_ms, spec.tpot_p95_ms, spec.deadline_s, tuple(spec.service_tiers), reserve)


def _check_slo_name(name: str | None, classes: Mapping[str, SloClass], path: str, source: str) -> None:
    if name is not None and name not in classes:
        known = ", ".join(sorted(classes)) or "none defined"
        raise PolicyError(f"{source}: `{path}`: unknown SLO class {name!r} (known: {known})")


def _check_fallbacks(fallbacks: Mapping[str, tuple[str, ...]], models: Mapping[str, object], source: str) -> None:
    """Every fallback names an alias, and following fallbacks never comes back to where it started."""
    for alias, names in fallbacks.items():
        for i, name in enumerate(names):
            if name not in models:
                raise PolicyError(f"{source}: `$.models.{alias}.fallbacks[{i}]`: unknown model {name!r}")

    def visit(alias: str, path: list[str]) -> None:
        for name in fallbacks.get(alias, ()):
            if name in path:
                cycle = " -> ".join([*path[path.index(name) :], name])
                raise PolicyError(f"{source}: `$.models.{path[0]}.fallbacks`: cyclic fallbacks {cycle}")
            visit(name, [*path, name])

    for alias in fallbacks:
        visit(alias, [alias])


def _convert(raw: object, kind: type[_S], path: str, source: str) -> _S:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        message = message.replace("`$", f"`{path}") if "`$" in message else f"{message} - at `{path}`"
        raise PolicyError(f"{source}: {message}") from exc


def _provider_config(name: str, spec: ProviderSpec, env: Mapping[str, str]) -> ProviderConfig:
    base_url = (env.get(spec.base_url_env) if spec.base_url_env else None) or spec.base_url
    api_key = (env.get(spec.api_key_env) or None) if spec.api_key_env else None
    # A key-less server (a local vLLM, our own engine) is enabled only once its address is known:
    # falling back to the vendor's public URL without a key could never work.
    key_required = spec.api_key_required and spec.kind != "selfhost"
    if not key_required and base_url is None and spec.kind != "selfhost":
        key_required = True
    return ProviderConfig(
        name=name,
        kind=spec.kind,
        base_url=(base_url or _DEFAULT_BASE_URLS[spec.kind]).rstrip("/"),
        api_key=api_key,
        timeout_s=spec.timeout_s,
        connect_timeout_s=spec.connect_timeout_s,
        headers=dict(spec.headers),
        key_required=key_required,
        engine=dict(spec.engine),
        gpu_dollars_per_hour=spec.gpu_dollars_per_hour,
        prefill_cost_ratio=spec.prefill_cost_ratio,
    )
