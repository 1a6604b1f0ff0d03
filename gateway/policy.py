"""Routing policy: load and validate the YAML, then resolve a requested model to an ordered plan.

Owns the policy file's schema, its validation (errors name the file and the key path), provider
credentials resolved from the settings' environment snapshot, and ``resolve``: a pure function from
a model name to the targets to try. Does not own calling providers (``gateway.dispatch``) or
anything about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import yaml

from gateway.errors import UnknownModel

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

ProviderKind = Literal["openai", "anthropic", "gemini", "selfhost"]
_S = TypeVar("_S", bound=msgspec.Struct)

_DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "selfhost": "inprocess://engine",
}


class PolicyError(ValueError):
    """A policy file is invalid; the message names the file and the key path."""


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


class TargetSpec(msgspec.Struct, forbid_unknown_fields=True):
    """One deployment of an alias: a provider and the model name it knows."""

    provider: str
    model: str


class ModelSpec(msgspec.Struct, forbid_unknown_fields=True):
    """A model alias that clients ask for."""

    targets: list[TargetSpec]
    description: str | None = None


class PolicyDoc(msgspec.Struct, forbid_unknown_fields=True):
    """The whole policy file. Entries are validated one by one so errors can name their key."""

    providers: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    models: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    passthrough: bool = True
    """Let clients ask for ``provider/model`` directly when the provider is enabled."""
    version: int = 1


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

    @property
    def enabled(self) -> bool:
        """Whether requests may be sent to it: it has a key, or needs none."""
        return self.api_key is not None or not self.key_required


@dataclass(frozen=True, slots=True)
class Target:
    """One place a request can be sent."""

    provider: str
    model: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The ordered targets to try for one request."""

    alias: str
    targets: tuple[Target, ...]


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated policy, ready to resolve requests. Immutable: a new edit builds a new Policy."""

    source: str
    providers: Mapping[str, ProviderConfig]
    models: Mapping[str, tuple[Target, ...]]
    passthrough: bool

    def resolve(self, model: str) -> Plan:
        """Resolve a requested model to the enabled targets, in policy order.

        Raises:
            UnknownModel: no alias or passthrough matches, or no target's provider is configured.
        """
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
        enabled = tuple(t for t in targets if self.providers[t.provider].enabled)
        if not enabled:
            needed = sorted({self.providers[t.provider].name for t in targets})
            raise UnknownModel(
                f"The model `{model}` has no configured provider (configure {', '.join(needed)}).",
                param="model",
                code="model_not_found",
            )
        return Plan(model, enabled)

    def available_models(self) -> list[str]:
        """Aliases with at least one enabled target, sorted."""
        return sorted(a for a, ts in self.models.items() if any(self.providers[t.provider].enabled for t in ts))


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
        models[alias] = tuple(Target(t.provider, t.model) for t in spec.targets)
    return Policy(source=source, providers=providers, models=models, passthrough=doc.passthrough)


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
    )
