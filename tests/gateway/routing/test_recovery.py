"""A deployment back from an outage gets its traffic back at its breaker's first successful probe.

Driven through the real ``Router`` and ``Dispatcher`` over loopback HTTP: the cheap deployment's
port refuses connections (the outage), then a fake upstream starts listening on it (the recovery).
"""

from __future__ import annotations

import random

import httpx

from gateway.dispatch import Dispatcher
from gateway.obs.metrics import Metrics
from gateway.policy import Plan, Price, ProviderConfig, RoutingOptions, Target
from gateway.providers import build_providers
from gateway.router import Router, Workload
from gateway.types import ChatRequest, Message, TextPart
from tests.fakes.upstream import FakeKeys, FakeUpstream
from tests.gateway.e2e.conftest import _free_port

FAILURES = 7
"""Consecutive failures that open the breaker; they also push the error rate past a half (1 - 0.9**7 = 0.52)."""
COOLDOWN_S = 30.0
CHEAP = Target("cheap", "m", Price(0.1, 0.1))
BACKUP = Target("backup", "m", Price(5.0, 15.0))
REQUEST = ChatRequest(model="alias", messages=[Message("user", [TextPart("hello")])])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_deployment_back_from_an_outage_gets_its_probe_and_then_its_traffic():
    keys = FakeKeys()
    cheap_port = _free_port()
    clock = Clock()
    options = RoutingOptions(explore_share=0.0, retries=0, breaker_failures=FAILURES, breaker_cooldown_s=COOLDOWN_S)
    router = Router(options, rng=random.Random(1))  # noqa: S311 - not security
    router.breakers.clock = clock
    dispatcher = Dispatcher(router, Metrics(), clock=clock)
    plan = Plan("alias", (CHEAP, BACKUP))
    work = Workload(input_tokens=100, output_tokens=50)
    with FakeUpstream(keys) as backup:
        configs = {
            "cheap": ProviderConfig("cheap", "openai", f"http://127.0.0.1:{cheap_port}/v1", keys.openai, 5.0, 1.0),
            "backup": ProviderConfig("backup", "openai", f"{backup.url}/v1", keys.openai, 5.0, 1.0),
        }
        async with httpx.AsyncClient() as client:
            providers = build_providers(configs, client)

            async def send() -> tuple[str, str]:
                decision = router.decide(plan, work, configs)
                _, dispatched = await dispatcher.chat(decision, REQUEST, providers)
                return decision.reason, dispatched.target.key

            for _ in range(FAILURES):  # the outage: every request fails over to the backup
                assert await send() == ("cheapest-meeting-slo", BACKUP.key)
            assert router.breakers.state(CHEAP.key) == "open"
            assert router.stats[CHEAP.key].error_rate > 0.5
            explained = router.decide(plan, work, configs, explore=False)
            assert explained.candidates[0].reason == "breaker open"

            for _ in range(2):  # still down: each half-open probe fails, and the breaker opens again
                clock.now += COOLDOWN_S
                assert await send() == ("cheapest-meeting-slo", BACKUP.key)
                assert router.breakers.state(CHEAP.key) == "open"
            assert router.stats[CHEAP.key].error_rate > 0.6  # one success alone would not bring it under a half

            clock.now += COOLDOWN_S
            with FakeUpstream(keys, port=cheap_port):  # back
                probe = router.decide(plan, work, configs, explore=False)
                assert probe.order[0] == CHEAP  # half-open: the probe decides, not the failures before it
                assert probe.candidates[0].reason == "chosen: cheapest-meeting-slo (breaker half-open: probing)"
                assert await send() == ("cheapest-meeting-slo", CHEAP.key)
                assert router.breakers.state(CHEAP.key) == "closed"
                assert router.stats[CHEAP.key].error_rate == 0.0
                assert [await send() for _ in range(3)] == [("cheapest-meeting-slo", CHEAP.key)] * 3
