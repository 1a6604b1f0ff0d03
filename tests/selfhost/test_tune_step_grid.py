"""``bench.tune_step.grid``: the GEMV tiles the step-rate tuner tries, runs of a group included."""

from __future__ import annotations

from bench.tune_step import grid, named_tiles

from kernels._matmul_config import default_config


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


def test_int4_grid_holds_the_default_down_tile_of_eight_warps():
    """The 8B down projection's default (unsplit, 8 warps) is a tile the tuner can reach."""
    down = default_config("int4", 1, 4096, 7168, 128, interp=False, sms=132)
    assert down.num_warps == 8 and down.split_k == 1
    assert down in grid("int4", 4096, 7168, 128)
    # a down of 2,048 outputs (128 tiles) splits K in two, so that every multiprocessor has a program
    assert default_config("int4", 1, 2048, 4096, 128, interp=False, sms=132).split_k == 2


def test_named_tiles_parse_each_gemvs_specs_in_order():
    tiles = named_tiles("down=16x1024w8pau2,16x512w4s2pau2;o=16x2048w8p")
    assert [(c.block_n, c.block_k, c.split_k, c.num_warps, c.ahead, c.runs) for c in tiles["down"]] == [
        (16, 1024, 1, 8, True, 2),
        (16, 512, 2, 4, True, 2),
    ]
    assert [(c.num_warps, c.prefetch, c.ahead) for c in tiles["o"]] == [(8, True, False)]
    assert named_tiles("") == {}
