"""The dispatcher files an attempt's latency samples under the load its decision was judged at."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import httpx
import pytest

from gateway.dispatch import Dispatcher
from gateway.obs.metrics import Metrics
from gateway.policy import ProviderConfig, RoutingOptions, Target
from gateway.providers import build_providers
from gateway.router import Decision, Router
from gateway.stats import DeploymentStats, load_band
from gateway.types import ChatRequest, Message, TextPart
from tests.fakes.upstream import FakeKeys, FakeUpstream

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

TARGET = Target("openai", "gpt-4o-mini")


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


async def _dispatch_one(upstream: FakeUpstream, loads: Mapping[str, int]) -> DeploymentStats:
    router = Router(RoutingOptions(explore_share=0.0), rng=random.Random(1))  # noqa: S311 - not security
    config = ProviderConfig("openai", "openai", f"{upstream.url}/v1", FakeKeys().openai, 5.0, 1.0)
    request = ChatRequest(model="alias", messages=[Message("user", [TextPart("hello")])])
    async with httpx.AsyncClient() as client:
        providers = build_providers({"openai": config}, client)
        decision = Decision((TARGET,), "cheapest-meeting-slo", (), loads)
        response, dispatched = await Dispatcher(router, Metrics()).chat(decision, request, providers)
    assert dispatched.target == TARGET and response.usage.output_tokens > 0
    return router.stats[TARGET.key]


async def test_dispatch_files_samples_under_the_engine_load_the_decision_was_judged_at(upstream):
    """Behind several gateway replicas, an engine's own load, not this replica's share of it, says its band."""
    stats = await _dispatch_one(upstream, {TARGET.key: 17})
    assert list(stats.by_load) == [load_band(17)]
    ttft, tpot = stats.by_load[load_band(17)]
    assert (len(ttft), len(tpot)) == (1, 0)  # a whole (non-streamed) answer gives a TTFT sample only
    assert stats.in_flight == 0


async def test_dispatch_files_samples_under_its_own_in_flight_count_without_a_judged_load(upstream):
    stats = await _dispatch_one(upstream, {})
    assert list(stats.by_load) == [load_band(1)]
    assert stats.in_flight == 0
