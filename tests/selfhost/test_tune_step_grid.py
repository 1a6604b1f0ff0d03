"""``bench.tune_step.grid``: the GEMV tiles the step-rate tuner tries, runs of a group included."""

from __future__ import annotations

from bench.tune_step import grid


def test_int4_half2_grid_tries_each_run_count_the_group_allows():
    for group, runs in ((128, {1, 2, 4}), (64, {1, 2, 4}), (32, {1, 2})):
        tiles = grid("int4", 4096, 7168, group)
        assert {cfg.runs for cfg in tiles} == runs
        assert all(group % (16 * cfg.runs) == 0 and cfg.block_k % group == 0 for cfg in tiles)
        # every tile is tried with each run count
        plain = {(c.block_n, c.block_k, c.split_k, c.num_warps, c.prefetch, c.ahead) for c in tiles if c.runs == 1}
        for r in runs:
            assert {
                (c.block_n, c.block_k, c.split_k, c.num_warps, c.prefetch, c.ahead) for c in tiles if c.runs == r
            } == plain


def test_grids_without_the_half2_loop_keep_one_run():
    assert {cfg.runs for cfg in grid("dense", 4096, 4096, 0)} == {1}
    assert {cfg.runs for cfg in grid("int8", 4096, 4096, 0)} == {1}
    short = grid("int4", 576, 768, 32)  # rows too short for the half2 loop (SmolLM2 down)
    assert short and {cfg.runs for cfg in short} == {1}
