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
