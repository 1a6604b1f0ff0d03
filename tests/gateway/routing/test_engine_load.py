"""The self-hosted engine's own load (queue depth, free KV cache) in the routing decision."""

import dataclasses

import pytest

from gateway.policy import DEFERRABLE_ENGINE_RESERVE, Plan, Price, ProviderConfig, RoutingOptions, SloClass, Target
from gateway.router import KV_RESERVE, Workload, route
from gateway.stats import EngineLoad, Observed

INTERACTIVE = SloClass("interactive", ttft_p95_ms=800, tpot_p95_ms=60)
CONFIGS = {
    "api": ProviderConfig("api", "openai", "http://127.0.0.1:9", "k", 60.0, 5.0),
    "gpu": ProviderConfig(
        "gpu", "selfhost", "http://127.0.0.1:9", None, 60.0, 5.0, key_required=False, gpu_dollars_per_hour=2.0
    ),
}
ENGINE = Target("gpu", "smollm2")
API = Target("api", "gpt", Price(1.0, 4.0))
FAST_ENGINE = Observed(0.1, 0.15, 0.005, 0.008, 0.0, 2, 50)
FAST_API = Observed(0.3, 0.4, 0.02, 0.03, 0.0, 0, 50)


BATCH = SloClass("batch", deadline_s=86400, engine_reserve=DEFERRABLE_ENGINE_RESERVE)
STANDARD = SloClass("standard", ttft_p95_ms=2500, tpot_p95_ms=100)
RESERVED_STANDARD = SloClass("standard", ttft_p95_ms=2500, tpot_p95_ms=100, engine_reserve=0.2)


def _decide(engine: EngineLoad | None, slo: SloClass = INTERACTIVE):
    observed = {ENGINE.key: dataclasses.replace(FAST_ENGINE, engine=engine), API.key: FAST_API}
    plan = Plan("m", (ENGINE, API), (), slo)
    return route(plan, observed, {}, Workload(500, 100), CONFIGS, RoutingOptions(), (0.999, 0.0))


def test_idle_engine_is_chosen_over_the_dearer_api():
    decision = _decide(EngineLoad(waiting=0, running=2, kv_free=0.9))
    assert [t.key for t in decision.order] == ["gpu/smollm2", "api/gpt"]


def test_each_queued_request_adds_a_median_ttft_and_a_long_queue_drops_the_engine():
    decision = _decide(EngineLoad(waiting=7, running=16, kv_free=0.5))
    engine = next(c for c in decision.candidates if c.target == ENGINE)
    assert engine.ttft_s == 0.15 + 7 * 0.1
    assert not engine.qualified and "TTFT p95 850 ms > 800 ms" in engine.reason
    assert [t.key for t in decision.order] == ["api/gpt", "gpu/smollm2"]


def test_engine_with_its_kv_cache_nearly_full_is_not_qualified():
    decision = _decide(EngineLoad(waiting=0, running=16, kv_free=KV_RESERVE / 2))
    engine = next(c for c in decision.candidates if c.target == ENGINE)
    assert not engine.qualified and "KV cache" in engine.reason
    assert decision.order[0] == API


@pytest.mark.parametrize(
    ("kv_free", "slo", "first"),
    [
        (DEFERRABLE_ENGINE_RESERVE, BATCH, "gpu/smollm2"),  # at the reserve: still free for batch work
        (DEFERRABLE_ENGINE_RESERVE - 0.01, BATCH, "api/gpt"),
        (0.1, BATCH, "api/gpt"),
        (0.1, STANDARD, "gpu/smollm2"),  # no reserve of its own: the class may use the others'
        (0.1, INTERACTIVE, "gpu/smollm2"),
        (0.2, RESERVED_STANDARD, "gpu/smollm2"),
        (0.19, RESERVED_STANDARD, "api/gpt"),  # a latency class with a reserve leaves the engine too
        (0.19, INTERACTIVE, "gpu/smollm2"),
    ],
)
def test_engine_keeps_each_class_reserve_for_the_tighter_classes(kv_free, slo, first):
    """A request leaves a filling engine's last share, its class's ``engine_reserve``, to requests that need it more."""
    decision = _decide(EngineLoad(waiting=0, running=16, kv_free=kv_free), slo)
    assert [t.key for t in decision.order] == [first, *({"gpu/smollm2", "api/gpt"} - {first})]
    engine = next(c for c in decision.candidates if c.target == ENGINE)
    if first == "api/gpt":
        assert engine.usable and not engine.qualified
        assert engine.reason == f"KV cache {kv_free:.0%} free, kept for tighter classes"
