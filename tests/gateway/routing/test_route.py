import random

import pytest

from gateway.policy import Plan, Price, ProviderConfig, RoutingOptions, SloClass, Target
from gateway.router import (
    AFFINITY_HEADROOM,
    EXPLORE_FLOOR,
    PRIOR_TPOT_S,
    PRIOR_TTFT_S,
    Router,
    Workload,
    engine_price,
    route,
)
from gateway.stats import EngineLoad, Observed

INTERACTIVE = SloClass("interactive", ttft_p95_ms=800, tpot_p95_ms=60)
BATCH = SloClass("batch", deadline_s=100)
NO_EXPLORE = (0.999, 0.0)
WORK = Workload(input_tokens=1000, output_tokens=100)


def provider(name, gpu=None):
    return ProviderConfig(
        name=name,
        kind="selfhost" if gpu is not None else "openai",
        base_url="http://127.0.0.1:9",
        api_key="k",
        timeout_s=60.0,
        connect_timeout_s=5.0,
        gpu_dollars_per_hour=gpu,
    )


PROVIDERS = {"api": provider("api"), "gpu": provider("gpu", gpu=3.6)}


def api(model, inp=1.0, out=4.0, **kw):
    return Target("api", model, Price(inp, out), **kw)


def replica(model, cap=10):
    return Target("gpu", model, None, max_concurrency=cap)


def seen(ttft=0.2, tpot=0.02, *, n=50, err=0.0, in_flight=0, elsewhere=0, ttft_share=None, tpot_share=None):
    return Observed(
        ttft_p50=ttft,
        ttft_p95=ttft,
        tpot_p50=tpot,
        tpot_p95=tpot,
        error_rate=err,
        in_flight=in_flight,
        elsewhere=elsewhere,
        samples=n,
        ttft_share_within=ttft_share,
        tpot_share_within=tpot_share,
    )


def decide(targets, observed=None, *, slo=INTERACTIVE, breakers=None, work=WORK, draws=NO_EXPLORE, share=0.02, fb=()):
    plan = Plan("alias", tuple(targets), tuple(fb), slo)
    options = RoutingOptions(explore_share=share)
    return route(plan, observed or {}, breakers or {}, work, PROVIDERS, options, draws)


def models(decision):
    return [t.model for t in decision.order]


def why(decision, model):
    return next(c for c in decision.candidates if c.target.model == model)


CHEAP, MID, DEAR = api("cheap", 0.5, 2.0), api("mid", 1.0, 4.0), api("dear", 3.0, 12.0)


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ({}, ["cheap", "mid", "dear"]),
        ({"api/cheap": seen(), "api/mid": seen(), "api/dear": seen()}, ["cheap", "mid", "dear"]),
        ({"api/cheap": seen(ttft=0.9)}, ["mid", "dear", "cheap"]),
        ({"api/cheap": seen(tpot=0.07)}, ["mid", "dear", "cheap"]),
        ({"api/cheap": seen(ttft=0.9), "api/mid": seen(tpot=0.061)}, ["dear", "cheap", "mid"]),
        ({"api/cheap": seen(ttft=0.8, tpot=0.06)}, ["cheap", "mid", "dear"]),  # on the limit still meets it
        ({"api/cheap": seen(err=0.6)}, ["mid", "dear", "cheap"]),
    ],
)
def test_route_picks_the_cheapest_candidate_predicted_to_meet_the_slo(observed, expected):
    decision = decide([DEAR, MID, CHEAP], observed)
    assert models(decision) == expected
    assert decision.reason == "cheapest-meeting-slo"
    assert why(decision, expected[0]).reason.startswith("chosen: cheapest-meeting-slo")


def test_route_breaks_price_ties_by_predicted_ttft():
    a, b = api("a"), api("b")
    decision = decide([a, b], {"api/a": seen(ttft=0.4), "api/b": seen(ttft=0.3)})
    assert models(decision) == ["b", "a"]


@pytest.mark.parametrize(
    ("observed", "slo", "reason"),
    [
        (seen(ttft=0.9), INTERACTIVE, "TTFT p95 900 ms > 800 ms"),
        (seen(tpot=0.07), INTERACTIVE, "TPOT p95 70 ms > 60 ms"),
        (seen(ttft=0.9, tpot=0.07), INTERACTIVE, "TTFT p95 900 ms > 800 ms; TPOT p95 70 ms > 60 ms"),
        (seen(err=0.6), INTERACTIVE, "error rate 60%"),
        (seen(ttft=1.0, tpot=1.0), BATCH, "would finish after the 100 s deadline"),
    ],
)
def test_route_drops_a_candidate_predicted_to_miss_and_says_why(observed, slo, reason):
    decision = decide([CHEAP, MID], {"api/cheap": observed}, slo=slo)
    cheap = why(decision, "cheap")
    assert not cheap.qualified and cheap.usable
    assert cheap.reason == reason
    assert models(decision)[0] == "mid"
    assert why(decision, "mid").qualified


def test_route_judges_an_unmeasured_deployment_by_the_optimistic_prior():
    few = seen(ttft=5.0, tpot=1.0, n=4)
    decision = decide([CHEAP, MID], {"api/cheap": few})
    cheap = why(decision, "cheap")
    assert (cheap.ttft_s, cheap.tpot_s) == (PRIOR_TTFT_S, PRIOR_TPOT_S)
    assert cheap.qualified and models(decision)[0] == "cheap"


@pytest.mark.parametrize(
    ("shares", "errors", "expected"),
    [
        ({"cheap": 0.5, "mid": 0.9, "dear": 0.7}, {}, ["mid", "dear", "cheap"]),
        ({"cheap": 0.8, "mid": 0.8, "dear": 0.8}, {}, ["cheap", "mid", "dear"]),  # equal odds: cheapest first
        ({"cheap": 0.9, "mid": 0.8, "dear": 0.1}, {"cheap": 0.4}, ["mid", "cheap", "dear"]),
    ],
)
def test_route_falls_back_to_the_likeliest_to_meet_the_slo_when_none_qualifies(shares, errors, expected):
    observed = {f"api/{m}": seen(ttft=0.9, ttft_share=share, err=errors.get(m, 0.0)) for m, share in shares.items()}
    decision = decide([CHEAP, MID, DEAR], observed)
    assert decision.reason == "best-effort"
    assert models(decision) == expected
    assert why(decision, "mid").p_meet == pytest.approx(shares["mid"] * (1 - errors.get("mid", 0.0)))


@pytest.mark.parametrize(
    ("breakers", "observed", "expected", "reasons"),
    [
        ({"api/cheap": "open"}, {}, ["mid", "dear", "cheap"], {"cheap": "breaker open"}),
        ({"api/cheap": "half_open"}, {}, ["cheap", "mid", "dear"], {}),
        ({}, {"api/cheap": seen(in_flight=4)}, ["mid", "dear", "cheap"], {"cheap": "at concurrency cap (4)"}),
        ({}, {"api/cheap": seen(in_flight=3)}, ["cheap", "mid", "dear"], {}),
        # the cap counts other replicas' requests too (gateway.inflight)
        (
            {},
            {"api/cheap": seen(in_flight=1, elsewhere=3)},
            ["mid", "dear", "cheap"],
            {"cheap": "at concurrency cap (4)"},
        ),
        ({}, {"api/cheap": seen(in_flight=1, elsewhere=2)}, ["cheap", "mid", "dear"], {}),
        (
            {"api/mid": "open"},
            {"api/cheap": seen(in_flight=9), "api/dear": seen(ttft=2.0)},
            ["dear", "mid", "cheap"],  # a usable but slow one first, then the unusable in plan order
            {
                "cheap": "at concurrency cap (4)",
                "mid": "breaker open",
                "dear": "chosen: best-effort (TTFT p95 2000 ms > 800 ms)",
            },
        ),
    ],
)
def test_route_puts_unusable_candidates_last(breakers, observed, expected, reasons):
    capped = api("cheap", 0.5, 2.0, max_concurrency=4)
    decision = decide([DEAR, MID, capped], observed, breakers=breakers)
    assert models(decision) == expected
    for model, reason in reasons.items():
        assert why(decision, model).reason == reason
        assert not why(decision, model).qualified


@pytest.mark.parametrize(
    ("breaker", "expected", "reason"),
    [
        ("closed", ["mid", "cheap"], "error rate 90%"),
        ("half_open", ["cheap", "mid"], "chosen: cheapest-meeting-slo (breaker half-open: probing)"),
    ],
)
def test_route_sends_a_half_open_deployment_its_probe_whatever_its_error_rate(breaker, expected, reason):
    decision = decide([CHEAP, MID], {"api/cheap": seen(err=0.9)}, breakers={"api/cheap": breaker})
    assert models(decision) == expected
    assert why(decision, "cheap").reason == reason


def test_route_says_unusable_and_keeps_plan_order_when_every_candidate_is_unusable():
    decision = decide([DEAR, MID, CHEAP], breakers={"api/dear": "open", "api/mid": "open", "api/cheap": "open"})
    assert decision.reason == "unusable"
    assert models(decision) == ["dear", "mid", "cheap"]


def test_route_appends_plan_fallbacks_after_every_own_target():
    fb = (api("fb1", 0.0, 0.0), api("fb2", 0.0, 0.0))
    decision = decide([MID, CHEAP], {"api/mid": seen(ttft=2.0)}, breakers={"api/cheap": "open"}, fb=fb)
    assert models(decision) == ["mid", "cheap", "fb1", "fb2"]
    assert {c.target.model for c in decision.candidates} == {"mid", "cheap"}


@pytest.mark.parametrize(
    ("draws", "share", "first", "reason"),
    [
        # mid costs twice the choice (cheap): explored on the lower half of the draws under the share.
        ((0.04, 0.0), 0.1, "mid", "explore"),
        ((0.0, 0.49), 0.1, "mid", "explore"),
        ((0.05, 0.0), 0.1, "cheap", "cheapest-meeting-slo"),
        ((0.09, 0.49), 0.1, "cheap", "cheapest-meeting-slo"),
        # slow is cheaper than the choice: explored on every draw under the share.
        ((0.0, 0.5), 0.1, "slow", "explore"),
        ((0.099, 0.999), 0.1, "slow", "explore"),  # a usable candidate that misses may be explored
        ((0.1, 0.0), 0.1, "cheap", "cheapest-meeting-slo"),  # the draw must fall under the share
        ((0.0, 0.5), 0.0, "cheap", "cheapest-meeting-slo"),  # a share of 0 never explores
    ],
)
def test_route_explores_another_usable_candidate_on_a_scripted_draw(draws, share, first, reason):
    slow = api("slow", 0.1, 0.1)
    observed = {"api/slow": seen(ttft=3.0)}
    decision = decide([CHEAP, MID, slow, DEAR], observed, breakers={"api/dear": "open"}, draws=draws, share=share)
    assert models(decision)[0] == first
    assert decision.reason == reason
    assert models(decision)[-1] == "dear"  # never explores an unusable candidate
    assert sorted(models(decision)) == ["cheap", "dear", "mid", "slow"]


@pytest.mark.parametrize(("explore_draw", "explored"), [(0.0, True), (0.0049, True), (0.0051, False), (0.05, False)])
def test_route_explores_a_much_dearer_candidate_at_the_floor_share(explore_draw, explored):
    """A candidate 100 times dearer than the choice keeps EXPLORE_FLOOR (5 %) of the exploration share."""
    dearer = api("dearer", 50.0, 200.0)
    decision = decide([CHEAP, dearer], draws=(explore_draw, 0.0), share=0.1)
    assert EXPLORE_FLOOR == 0.05
    assert models(decision) == (["dearer", "cheap"] if explored else ["cheap", "dearer"])
    assert decision.reason == ("explore" if explored else "cheapest-meeting-slo")


def test_route_does_not_explore_with_a_single_usable_candidate():
    decision = decide([CHEAP, MID], breakers={"api/mid": "open"}, draws=(0.0, 0.9), share=0.5)
    assert models(decision) == ["cheap", "mid"]
    assert decision.reason == "cheapest-meeting-slo"


def test_route_is_pure():
    observed = {"api/cheap": seen(ttft=0.9, ttft_share=0.3), "api/mid": seen(in_flight=2)}
    first = decide([CHEAP, MID, DEAR], observed, draws=(0.01, 0.7))
    assert decide([CHEAP, MID, DEAR], observed, draws=(0.01, 0.7)) == first


REPLICAS = [replica(f"r{i}") for i in range(3)]


def affinity(prefix, loads, targets=REPLICAS):
    observed = {t.key: seen(in_flight=load) for t, load in zip(targets, loads, strict=True)}
    work = Workload(1000, 100, prefix_key=prefix)
    return models(decide(targets, observed, work=work))[0]


@pytest.mark.parametrize("loads", [(0, 0, 0), (7, 0, 3), (0, 7, 1), (2, 2, 7)])
def test_prefix_affinity_keeps_a_prefix_on_one_replica_while_it_has_headroom(loads):
    homes = {p: affinity(p, (0, 0, 0)) for p in ("sys-a", "sys-b", "sys-c", "sys-d")}
    assert {p: affinity(p, loads) for p in homes} == homes


def test_prefix_affinity_spreads_different_prefixes_over_replicas():
    homes = {affinity(f"prefix-{i}", (0, 0, 0)) for i in range(40)}
    assert homes == {"r0", "r1", "r2"}


@pytest.mark.parametrize("replicas", [2, 3])
def test_prefix_affinity_moves_off_a_full_replica_and_returns_when_it_drains(replicas):
    targets = REPLICAS[:replicas]
    idle = (0,) * replicas
    home = affinity("sys-a", idle, targets)
    full_load = int(AFFINITY_HEADROOM * 10)  # 8 of 10: no headroom, yet under the cap
    loads = tuple(full_load if t.model == home else 0 for t in targets)
    moved = affinity("sys-a", loads, targets)
    assert moved != home
    assert affinity("sys-a", tuple(full_load - 1 if t.model == home else 0 for t in targets), targets) == home


def test_prefix_affinity_does_not_override_a_cheaper_external_api():
    free = api("free", 0.0, 0.0)
    work = Workload(1000, 100, prefix_key="sys-a")
    decision = decide([*REPLICAS, free], {t.key: seen() for t in REPLICAS}, work=work)
    assert models(decision)[0] == "free"


def test_engine_price_is_the_gpu_second_of_a_decode_step_shared_by_the_batch():
    config = provider("gpu", gpu=3.6)  # one tenth of a cent per second
    per_in, per_out = engine_price(config, 0.02, running=0)
    assert per_out == pytest.approx(0.001 * 0.02)
    assert per_in == pytest.approx(0.1 * per_out)
    prices = [engine_price(config, 0.02, running)[1] for running in range(9)]
    assert prices == sorted(prices, reverse=True) and len(set(prices)) == 9
    assert prices[7] == pytest.approx(prices[0] / 8)


def test_route_prices_an_uncapped_engine_lower_as_its_running_batch_grows():
    r0 = Target("gpu", "r0")
    costs = [why(decide([r0], {r0.key: seen(in_flight=n)}), "r0").cost_usd for n in (0, 1, 3, 15)]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == 4
    # 1000 input tokens at a tenth of the output price, 100 output tokens, TPOT 20 ms, $0.001/s.
    assert costs[0] == pytest.approx(0.001 * 0.02 * (100 + 0.1 * 1000))


@pytest.mark.parametrize(("in_flight", "batch"), [(0, 64), (10, 64), (63, 64)])
def test_route_prices_a_capped_engine_at_the_batch_it_is_provisioned_for(in_flight, batch):
    r0 = replica("r0", cap=64)
    cost = why(decide([r0], {r0.key: seen(in_flight=in_flight)}), "r0").cost_usd
    assert cost == pytest.approx(0.001 * 0.02 * (100 + 0.1 * 1000) / batch)


def test_route_sends_to_an_idle_capped_engine_that_is_cheap_when_full():
    """Priced at its current batch (alone: $0.004 here) the idle engine would lose to the API ($0.0014)."""
    r0, dear = replica("r0", cap=32), api("dear", 1.0, 4.0)
    decision = decide([dear, r0], {r0.key: seen(in_flight=0), dear.key: seen()})
    assert models(decision) == ["r0", "dear"]


@pytest.mark.parametrize(("slo", "factor"), [(BATCH, 0.5), (INTERACTIVE, 1.0)])
def test_route_applies_the_batch_discount_only_to_deadline_classes(slo, factor):
    discounted = api("d", 1.0, 4.0, batch_discount=0.5)
    cost = why(decide([discounted], slo=slo), "d").cost_usd
    assert cost == pytest.approx(factor * (1000 * 1.0 + 100 * 4.0) / 1e6)


def test_router_decide_learns_from_recorded_samples():
    router = Router(RoutingOptions(explore_share=0.0), rng=random.Random(1))  # noqa: S311
    plan = Plan("alias", (CHEAP, MID), (), INTERACTIVE)
    assert models(router.decide(plan, WORK, PROVIDERS))[0] == "cheap"
    for _ in range(20):
        router.stats.record("api/cheap", ttft=1.5, tpot=0.02)
    decision = router.decide(plan, WORK, PROVIDERS)
    assert models(decision)[0] == "mid"
    assert why(decision, "cheap").p_meet == 0.0  # no recent TTFT within 800 ms


def test_router_decide_skips_a_deployment_whose_breaker_opened():
    router = Router(RoutingOptions(explore_share=0.0, breaker_failures=2), rng=random.Random(1))  # noqa: S311
    plan = Plan("alias", (CHEAP, MID), (), INTERACTIVE)
    for _ in range(2):
        router.breakers["api/cheap"].failure(router.breakers.clock())
    assert models(router.decide(plan, WORK, PROVIDERS)) == ["mid", "cheap"]


def _engine_after_a_burst():
    """A router whose engine answered fast at load 2 and slowly at load 30, and a plan of it and ``MID``."""
    gpu = replica("r0", cap=40)
    router = Router(RoutingOptions(explore_share=0.0), rng=random.Random(1))  # noqa: S311
    for _ in range(20):
        router.stats.record(gpu.key, ttft=0.1, tpot=0.02, load=2)
        router.stats.record(gpu.key, ttft=4.0, tpot=0.05, load=30)
    return gpu, router, Plan("alias", (gpu, MID), (), INTERACTIVE)


def test_router_judges_an_engine_by_samples_taken_at_the_load_it_would_start_at():
    """Samples from a burst that queued the engine condemn it at that load only, not once it is idle."""
    gpu, router, plan = _engine_after_a_burst()
    assert models(router.decide(plan, WORK, PROVIDERS))[0] == "r0"  # idle: starts at load 1, band 1-4
    router.stats[gpu.key].in_flight = 29  # this request would start at load 30
    decision = router.decide(plan, WORK, PROVIDERS)
    assert models(decision)[0] == "mid"
    assert why(decision, "r0").reason == "TTFT p95 4000 ms > 800 ms"


def test_router_judges_an_engine_by_its_own_load_report_not_this_replicas_in_flight_count():
    """Behind N gateway replicas each sees about 1/N of an engine's load; the engine's own count says its band."""
    gpu, router, plan = _engine_after_a_burst()
    # this replica has nothing in flight there; the engine runs 29 requests, so this one would start at 30
    busy = {gpu.key: EngineLoad(waiting=0, running=29, kv_free=0.5)}
    decision = router.decide(plan, WORK, PROVIDERS, loads=busy)
    assert models(decision)[0] == "mid"
    assert why(decision, "r0").reason == "TTFT p95 4000 ms > 800 ms"
    assert decision.loads == {gpu.key: 30}
    idle = {gpu.key: EngineLoad(waiting=0, running=1, kv_free=0.9)}
    decision = router.decide(plan, WORK, PROVIDERS, loads=idle)
    assert models(decision)[0] == "r0" and decision.loads == {gpu.key: 2}
