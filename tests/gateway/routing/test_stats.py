import math

import pytest

from gateway.stats import LOAD_BAND, MIN_BAND_SAMPLES, DeploymentStats, Observed, Stats, Window, load_band


def window_of(values, size=100):
    window = Window(size)
    for v in values:
        window.add(v)
    return window


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0], 0.5, 1.0),
        ([1.0], 0.95, 1.0),
        ([3.0, 1.0, 2.0], 0.5, 2.0),
        ([5.0, 4.0, 3.0, 2.0, 1.0], 0.5, 3.0),  # banker's rounding of 2.5 would give 2.0
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
        ([float(v) for v in range(1, 21)], 0.95, 19.0),
        ([float(v) for v in range(1, 101)], 0.95, 95.0),
        ([float(v) for v in range(1, 31)], 0.95, 29.0),  # ceil(28.5) = 29: never under the p95
        ([float(v) for v in range(1, 101)], 0.07, 7.0),  # 0.07 * 100 is 7.000000000000001 in floats
        ([float(v) for v in range(1, 11)], 0.0, 1.0),
        ([float(v) for v in range(1, 11)], 1.0, 10.0),
    ],
)
def test_window_quantile_is_the_nearest_rank(values, q, expected):
    assert window_of(values).quantile(q) == expected


def test_window_quantile_and_share_are_none_when_empty():
    window = Window(10)
    assert window.quantile(0.5) is None
    assert window.share_at_most(1.0) is None
    assert len(window) == 0


def test_window_keeps_only_the_last_size_samples():
    window = window_of([100.0, 100.0, 1.0, 2.0, 3.0], size=3)
    assert len(window) == 3
    assert window.quantile(1.0) == 3.0
    assert window.quantile(0.0) == 1.0


def test_window_quantile_sees_samples_added_after_a_read():
    window = window_of([1.0, 2.0])
    assert window.quantile(1.0) == 2.0
    window.add(9.0)
    assert window.quantile(1.0) == 9.0


@pytest.mark.parametrize(
    ("limit", "share"),
    [(0.5, 0.0), (1.0, 0.25), (2.5, 0.5), (4.0, 1.0), (10.0, 1.0)],
)
def test_window_share_at_most_counts_samples_within_the_limit(limit, share):
    assert window_of([4.0, 1.0, 3.0, 2.0]).share_at_most(limit) == share


@pytest.mark.parametrize("failures", [1, 2, 5, 20])
def test_error_rate_is_an_ewma_of_failures(failures):
    stats = DeploymentStats(10)
    for _ in range(failures):
        stats.outcome(False)
    assert stats.error_rate == pytest.approx(1 - (1 - DeploymentStats.ERROR_DECAY) ** failures)
    assert stats.outcomes == failures


def test_error_rate_decays_with_successes_after_failures():
    stats = DeploymentStats(10)
    stats.outcome(False)
    assert stats.error_rate == pytest.approx(0.1)
    for _ in range(10):
        stats.outcome(True)
    assert stats.error_rate == pytest.approx(0.1 * 0.9**10)
    assert not math.isclose(stats.error_rate, 0.0)


def test_recovered_forgets_the_failures_and_later_outcomes_count_afresh():
    stats = DeploymentStats(10)
    for _ in range(20):
        stats.outcome(False)
    stats.recovered()
    assert stats.error_rate == 0.0
    stats.outcome(False)
    assert stats.error_rate == pytest.approx(DeploymentStats.ERROR_DECAY)


def test_error_rate_stays_zero_with_only_successes():
    stats = DeploymentStats(10)
    for _ in range(50):
        stats.outcome(True)
    assert stats.error_rate == 0.0


def test_observed_snapshot_reports_quantiles_shares_and_in_flight():
    stats = Stats(window=50)
    for i in range(1, 11):
        stats.record("p/m", ttft=i / 10, tpot=i / 100)
    stats.record("p/m", ok=False)
    stats["p/m"].in_flight = 3
    seen = stats["p/m"].observed(ttft_limit=0.5, tpot_limit=0.08)
    assert seen.ttft_p50 == pytest.approx(0.5)
    assert seen.ttft_p95 == pytest.approx(1.0)
    assert seen.tpot_p50 == pytest.approx(0.05)
    assert seen.tpot_p95 == pytest.approx(0.1)
    assert seen.samples == 10
    assert seen.in_flight == 3
    assert seen.error_rate == pytest.approx(0.1)
    assert seen.ttft_share_within == pytest.approx(0.5)
    assert seen.tpot_share_within == pytest.approx(0.8)


def test_observed_has_no_shares_without_limits():
    stats = Stats()
    stats.record("p/m", ttft=0.1, tpot=0.01)
    seen = stats["p/m"].observed()
    assert seen.ttft_share_within is None and seen.tpot_share_within is None


def test_stats_create_deployments_on_first_mention_and_list_them_sorted():
    stats = Stats(window=8)
    assert stats.keys() == []
    stats.record("b/m", ttft=0.2)
    assert stats["a/m"].observed() == Observed()
    assert stats.keys() == ["a/m", "b/m"]
    assert stats["b/m"].ttft.quantile(0.5) == 0.2
    assert len(stats["b/m"].tpot) == 0


@pytest.mark.parametrize(("load", "band"), [(0, 0), (1, 0), (LOAD_BAND, 0), (LOAD_BAND + 1, 1), (3 * LOAD_BAND, 2)])
def test_load_band_groups_loads_in_bands_of_load_band(load, band):
    assert load_band(load) == band


def test_observed_at_a_load_uses_that_bands_samples_once_it_has_enough():
    stats = Stats(window=50)
    for _ in range(MIN_BAND_SAMPLES):
        stats.record("e/m", ttft=0.1, tpot=0.01, load=1)
    for _ in range(MIN_BAND_SAMPLES - 1):
        stats.record("e/m", ttft=5.0, tpot=0.09, load=30)
    engine = stats["e/m"]
    assert engine.observed(0.8, load=30).ttft_p95 == 5.0  # too few at load 30: the whole window speaks
    assert engine.observed(0.8, load=30).samples == 2 * MIN_BAND_SAMPLES - 1
    stats.record("e/m", ttft=5.0, tpot=0.09, load=29)
    at_30 = engine.observed(0.8, 0.05, load=30)
    assert (at_30.ttft_p50, at_30.tpot_p50, at_30.samples) == (5.0, 0.09, MIN_BAND_SAMPLES)
    assert (at_30.ttft_share_within, at_30.tpot_share_within) == (0.0, 0.0)
    at_1 = engine.observed(0.8, 0.05, load=1)
    assert (at_1.ttft_p95, at_1.tpot_p95, at_1.ttft_share_within) == (0.1, 0.01, 1.0)
    assert engine.observed(load=12).samples == 2 * MIN_BAND_SAMPLES  # an unseen band: the whole window


def test_record_without_a_verdict_adds_samples_but_no_outcome():
    stats = Stats()
    stats.record("p/m", ttft=0.1, ok=False)
    stats.record("p/m", tpot=0.01, ok=None)
    assert stats["p/m"].outcomes == 1
    assert stats["p/m"].error_rate == pytest.approx(0.1)
    assert len(stats["p/m"].tpot) == 1
