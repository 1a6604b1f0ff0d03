"""bench/host_step.py drives the engine's real step with the device's part taken out, and leaves the engine module as it found it."""

import pytest
from bench import host_step

from selfhost import engine as engine_module
from selfhost import sampling


def test_host_step_bench_decodes_every_request_through_the_graph_staging_and_restores_sampling():
    result = host_step.measure(requests=3, windows=2, steps=4, kv_gib=1)
    assert [w["running"] for w in result["windows"]] == [3, 3]  # outputs of 100+ tokens: nobody finishes in 8 steps
    assert result["replays"] == 8  # every decode step went through DecodeGraphs.run
    assert all(w["cpu_ms_per_step"] > 0 for w in result["windows"])
    assert engine_module.PendingSample is sampling.PendingSample


def test_host_step_bench_through_the_async_front_times_the_engine_threads_loop():
    result = host_step.measure(requests=3, windows=2, steps=4, kv_gib=1, through_async=True)
    assert result["through_async"] is True
    assert [w["running"] for w in result["windows"]] == [3, 3]
    assert result["replays"] >= 8  # the timed steps went through DecodeGraphs.run (and the prefill before them)
    assert all(w["cpu_ms_per_step"] > 0 and w["ms_per_step"] > 0 for w in result["windows"])
    assert engine_module.PendingSample is sampling.PendingSample


def test_host_step_bench_through_the_async_front_stops_when_the_workload_ends_first():
    with pytest.raises(RuntimeError, match="the workload ended after"):
        host_step.measure(requests=2, windows=2, steps=600, kv_gib=1, through_async=True)
    assert engine_module.PendingSample is sampling.PendingSample


def test_headroom_step_spread_separates_slow_steps_and_counts_collector_passes():
    """``bench.host_headroom`` (GPU) summarises a window's steps on the host side: checked here with made-up times."""
    from bench.host_headroom import step_spread

    walls = [0.002] * 9 + [0.010]
    cpus = [0.002] * 9 + [0.0025]  # the slow step was mostly off the CPU
    spread = step_spread(walls, cpus, [(0, 0.0001), (0, 0.0003), (2, 0.15)])
    assert spread["p50_ms"] == pytest.approx(2.0)
    assert spread["max_ms"] == pytest.approx(10.0)
    assert spread["slow_steps"] == 1
    assert spread["slow_steps_ms"] == pytest.approx(10.0)
    assert spread["slow_steps_cpu_share"] == pytest.approx(0.25)
    assert spread["gc"]["0"] == {"count": 2, "total_ms": pytest.approx(0.4), "max_ms": pytest.approx(0.3)}
    assert spread["gc"]["2"]["max_ms"] == pytest.approx(150.0)
    even = step_spread([0.002] * 5, [0.002] * 5, [])
    assert even["slow_steps"] == 0 and even["slow_steps_cpu_share"] is None and even["gc"] == {}


def test_host_step_bench_mixed_runs_a_long_prompts_chunks_through_the_step_graphs_staging():
    result = host_step.measure(requests=3, windows=2, steps=4, kv_gib=1, mixed=True)
    assert result["mixed"] is True
    assert [w["running"] for w in result["windows"]] == [4, 4]  # the three decoding and the window's long prompt
    assert result["step_replays"] == 1 + 8  # the running set's prefill, then every timed step: none eager
    assert all(w["max_ms"] >= w["median_ms"] > 0 for w in result["windows"])
    assert engine_module.PendingSample is sampling.PendingSample
