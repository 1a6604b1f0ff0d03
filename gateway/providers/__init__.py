"""Provider adapters: one class per vendor API, all behind the ``Provider`` protocol.

Owns choosing the adapter for a configured provider (``build_providers``). Does not own routing
(``gateway.policy``), retries and fallbacks (``gateway.dispatch``), nor the HTTP client's lifetime:
the caller creates the one pooled ``httpx.AsyncClient`` and closes it at shutdown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import Provider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.openai import OpenAIProvider
from gateway.providers.selfhost import SelfHostProvider

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import httpx

    from gateway.policy import ProviderConfig

__all__ = ["AnthropicProvider", "GeminiProvider", "OpenAIProvider", "Provider", "SelfHostProvider", "build_providers"]

_ADAPTERS: dict[str, Callable[[ProviderConfig, httpx.AsyncClient], Provider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
    "selfhost": SelfHostProvider,
}


def build_providers(configs: Mapping[str, ProviderConfig], client: httpx.AsyncClient) -> dict[str, Provider]:
    """One adapter per configured provider, keyed like ``configs``, all sharing ``client``.

    Adapters are built for disabled providers too (no key); ``Policy.resolve`` never routes to those.

    Args:
        configs: provider name -> resolved configuration.
        client: the gateway's one pooled client; adapters never create or close clients.

    Raises:
        ValueError: a config names an unknown ``kind``.
    """
    providers: dict[str, Provider] = {}
    for name, config in configs.items():
        adapter = _ADAPTERS.get(config.kind)
        if adapter is None:
            raise ValueError(f"provider {name!r}: unknown kind {config.kind!r} (known: {', '.join(sorted(_ADAPTERS))})")
        providers[name] = adapter(config, client)
    return providers
