"""The live state every request reads: the policy in force, its provider adapters and the router.

Owns putting an edited policy in force without a restart and without disturbing requests in flight:
a request takes one ``Live`` snapshot when it starts and uses it to the end; adapters whose provider
configuration did not change are kept (their connections, and for the in-process engine its loaded
weights); the router's statistics and breakers carry over. An adapter a new policy no longer uses is
closed only after the longest a request may take. Does not own where policies come from
(``gateway.store.policies``, ``gateway.watcher``) nor validating them (``gateway.policy``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from gateway.dispatch import Dispatcher
from gateway.providers import SelfHostProvider, build_providers
from gateway.router import Router

if TYPE_CHECKING:
    from collections.abc import Mapping

    import httpx

    from gateway.obs.metrics import Metrics
    from gateway.policy import Plan, Policy
    from gateway.providers.base import Provider
    from gateway.router import Decision, Workload

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Live:
    """One consistent view: a policy and the adapters of its providers."""

    policy: Policy
    providers: Mapping[str, Provider]
    version: int | None = None
    """The policy's version in the store (``None`` when it came from a file)."""


class Runtime:
    """The live policy, its adapters on one pooled HTTP client, and the router that outlives edits."""

    def __init__(self, policy: Policy, client: httpx.AsyncClient, metrics: Metrics) -> None:
        self.client = client
        self.router = Router(policy.routing)
        self.dispatcher = Dispatcher(self.router, metrics)
        self.live = Live(policy, build_providers(policy.providers, client))
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: list[SelfHostProvider] = []

    @property
    def policy(self) -> Policy:
        """The policy in force."""
        return self.live.policy

    def decide(self, plan: Plan, workload: Workload, live: Live, *, explore: bool = True) -> Decision:
        """The router's decision for ``plan``, with the in-process engines' own load (queue, free KV) in view."""
        loads = {}
        for target in plan.targets:
            provider = live.providers[target.provider]
            if isinstance(provider, SelfHostProvider) and (load := provider.load(target.model)) is not None:
                loads[target.key] = load
        return self.router.decide(plan, workload, live.policy.providers, loads=loads, explore=explore)

    def swap(self, policy: Policy, version: int | None = None) -> None:
        """Put ``policy`` in force for every request that starts from now on."""
        old = self.live
        changed = {name: c for name, c in policy.providers.items() if old.policy.providers.get(name) != c}
        built = build_providers(changed, self.client)
        providers = {name: built[name] if name in built else old.providers[name] for name in policy.providers}
        self.live = Live(policy, providers, version)
        self.router.reconfigure(policy.routing)
        kept = {id(p) for p in providers.values()}
        for provider in old.providers.values():
            if id(provider) not in kept and isinstance(provider, SelfHostProvider):
                self._retire(provider, policy.routing.total_timeout_s)
        log.info("policy_in_force", version=version, source=policy.source, rebuilt=sorted(changed))

    def _retire(self, provider: SelfHostProvider, grace_s: float) -> None:
        """Close an engine no policy uses once every request that may still be on it is done."""
        self._retired.append(provider)

        async def close_later() -> None:
            await asyncio.sleep(grace_s)
            self._retired.remove(provider)
            await provider.aclose()

        task = asyncio.get_running_loop().create_task(close_later())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Release what providers hold beyond the shared client (the in-process engines' threads)."""
        for task in self._closing:
            task.cancel()
        for provider in [*self.live.providers.values(), *self._retired]:
            if isinstance(provider, SelfHostProvider):
                await provider.aclose()
