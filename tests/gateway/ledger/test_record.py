from __future__ import annotations

from gateway.ledger.record import cost_of, slo_met, worst_case_nanos
from gateway.policy import Price, SloClass
from gateway.types import Usage

PRICE = Price(input=2.5, output=10.0, cached_input=1.25)


def test_cost_of_charges_cached_tokens_at_cached_price_and_reports_saving() -> None:
    usage = Usage(input_tokens=1000, output_tokens=200, cached_input_tokens=400)
    cost = cost_of(usage, PRICE)
    # 600 * 2.5 + 200 * 10 = 3500 micro-dollars; 400 * 1.25 = 500 micro-dollars
    assert cost.nanos == 3_500_000 + 500_000
    assert cost.saved == 400 * (2.5 - 1.25) * 1000


def test_cost_of_uses_input_price_when_no_cached_price() -> None:
    usage = Usage(input_tokens=10, output_tokens=0, cached_input_tokens=10)
    cost = cost_of(usage, Price(input=3.0, output=0.0))
    assert cost.nanos == 30_000
    assert cost.saved == 0


def test_cost_of_applies_discount_and_is_zero_without_price() -> None:
    usage = Usage(input_tokens=100, output_tokens=100)
    assert cost_of(usage, PRICE, discount=0.5).nanos == round((100 * 2.5 + 100 * 10) * 1000 * 0.5)
    assert cost_of(usage, None).nanos == 0


def test_worst_case_bounds_cost_of_any_usage_within_it() -> None:
    bound = worst_case_nanos(1000, 500, PRICE)
    for cached in (0, 500, 1000):
        for out in (0, 250, 500):
            assert cost_of(Usage(1000, out, cached_input_tokens=cached), PRICE).nanos <= bound


def test_slo_met_judges_streams_on_ttft_and_tpot() -> None:
    slo = SloClass("interactive", ttft_p95_ms=500, tpot_p95_ms=50)
    assert slo_met(slo, 3.0, ttft_s=0.4, tpot_s=0.04, output_tokens=60)
    assert not slo_met(slo, 3.0, ttft_s=0.6, tpot_s=0.04, output_tokens=60)
    assert not slo_met(slo, 3.0, ttft_s=0.4, tpot_s=0.06, output_tokens=60)


def test_slo_met_judges_non_streamed_on_total_latency_against_allowed_time() -> None:
    slo = SloClass("interactive", ttft_p95_ms=500, tpot_p95_ms=50)
    # allowed: 0.5 + 0.05 * 9 = 0.95 s for 10 tokens
    assert slo_met(slo, 0.9, ttft_s=None, tpot_s=None, output_tokens=10)
    assert not slo_met(slo, 1.0, ttft_s=None, tpot_s=None, output_tokens=10)


def test_slo_met_enforces_deadline_and_passes_without_objectives() -> None:
    assert not slo_met(SloClass("batch", deadline_s=60), 61, None, None, 10)
    assert slo_met(SloClass("batch", deadline_s=60), 59, None, None, 10)
    assert slo_met(SloClass("standard"), 100.0, None, None, 1000)
