"""Weight-only int8 / int4 matmul (GEMV and tiled paths, split-K) against ``kernels.reference``."""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels.int4_gemv import XPairs
from kernels.int4_matmul import int4_matmul, pairs_for
from kernels.quant_matmul import Config, int8_matmul
from selfhost.models import quant
from tests.kernels.conftest import ON_GPU

# (M, N, K): odd N everywhere; K not a multiple of the loop step for int8
INT8_SHAPES = (
    [(1, 4099, 4096), (3, 1027, 14336), (17, 4096, 4100), (64, 6144, 4096)]
    if ON_GPU
    else [(1, 33, 72), (3, 17, 40), (20, 33, 72)]
)
INT4_SHAPES = (
    # the 8B's GEMV defaults: (1, 4099, 4096) o's, (1, 6150, 4096) qkv's, (2, 4096, 14336) down's
    [(1, 4099, 4096), (1, 6150, 4096), (2, 4096, 14336), (3, 1027, 14336), (17, 4096, 4096), (64, 6144, 4096)]
    if ON_GPU
    else [(1, 33, 192), (3, 17, 64), (20, 33, 192)]
)
CPU_CONFIGS = [
    None,
    Config("gemv", block_n=16, block_k=32, split_k=2, prefetch=True),
    Config("gemv", block_n=16, block_k=16, split_k=1),
    Config("tiled", block_n=16, block_k=16, split_k=1, block_m=16),
    Config("tiled", block_n=16, block_k=16, split_k=3, block_m=16),
]
GPU_CONFIGS = [
    None,
    Config("gemv", 32, 256, 4, prefetch=True),
    Config("gemv", 32, 256, 3, prefetch=True, ahead=True),  # int4: scales and x a step ahead, a ragged split
    Config("gemv", 16, 512, 2, prefetch=True, ahead=True, runs=2),  # int4: two runs of a group a thread
    Config("gemv", 32, 64, 2),
    Config("tiled", 64, 32, 1),
    Config("tiled", 64, 32, 4),
]
CONFIGS = GPU_CONFIGS if ON_GPU else CPU_CONFIGS


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("shape", INT8_SHAPES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_matmul_matches_reference(device, shape, config, dtype):
    m, n, k = shape
    qw, s = reference.quantize_int8(torch.randn(n, k))
    x = torch.randn(m, k, dtype=dtype)
    out = int8_matmul(x.to(device), qw.to(device), s.to(device), config=config)
    ref = reference.int8_matmul(x.float(), qw, s)
    assert out.shape == (m, n) and out.dtype == dtype
    assert _rel_err(out.cpu(), ref) < (1e-2 if dtype == torch.bfloat16 else 1e-3)


def _int4_cases() -> list[tuple[tuple[int, int, int], Config | None, int]]:
    """Shape, config and group combinations the launcher accepts (the others are its checks' business)."""
    cases = []
    for shape in INT4_SHAPES:
        for config in CONFIGS:
            for group in [32, 64] if ON_GPU else [16, 32]:
                if shape[2] % (2 * group):
                    continue
                if config is not None and config.path == "gemv" and config.block_k % group:
                    continue
                if config is not None and config.path == "tiled" and group % config.block_k:
                    continue
                cases.append((shape, config, group))
    return cases


@pytest.mark.parametrize(("shape", "config", "group"), _int4_cases())
def test_int4_matmul_matches_reference(device, shape, config, group):
    m, n, k = shape
    packed, s, z = reference.quantize_int4(torch.randn(n, k), group)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(m, k, dtype=dtype)
        out = int4_matmul(x.to(device), packed.to(device), s.to(device), z.to(device), group, config=config)
        ref = reference.int4_matmul(x.float(), packed, s, z, group)
        assert out.shape == (m, n) and out.dtype == dtype
        assert _rel_err(out.cpu(), ref) < (1e-2 if dtype == torch.bfloat16 else 1e-3)


def test_x_pairs_hold_each_words_four_columns_scaled_for_the_half2_loop():
    x = torch.randn(2, 64).to(torch.bfloat16)
    pa, pb, sums = reference.x_pairs(x, 16)

    def halves(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = (words & 0xFFFF).to(torch.int16).view(torch.float16).float()
        high = (words >> 16).to(torch.int16).view(torch.float16).float()
        return low, high

    scale = torch.tensor([0.25] * 8 + [0.25 / 16] * 8)  # words 0-7 cover the low half of K
    quads = x.float().view(2, 16, 4) * scale[:, None]
    assert torch.equal(torch.stack(halves(pa), -1), quads[..., [0, 2]].half().float())
    assert torch.equal(torch.stack(halves(pb), -1), quads[..., [1, 3]].half().float())
    torch.testing.assert_close(sums, x.float().view(2, 4, 16).sum(-1))


@pytest.mark.parametrize("glu", [False, True])
def test_int4_gemv_reads_x_pairs_as_it_reads_x(device, glu):
    """Where the half2 GEMV runs (K of 2,048 and more, on a GPU) it reads the pairs; elsewhere they are ignored."""
    m, n, k, group = (2, 512, 4096, 128) if ON_GPU else (2, 48, 64, 16)
    packed, s, z = (t.to(device) for t in reference.quantize_int4(torch.randn(n, k), group))
    x = torch.randn(m, k, device=device).to(torch.bfloat16)
    assert (pairs_for(m, packed, group, x.dtype) is not None) == ON_GPU
    pairs = XPairs(*(t.to(device) for t in reference.x_pairs(x, group)), group_size=group)
    plain = int4_matmul(x, packed, s, z, group, glu=glu)
    got = int4_matmul(x, packed, s, z, group, glu=glu, pairs=pairs)
    if ON_GPU:  # x's group sums add up in another order
        assert _rel_err(got.cpu(), plain.cpu()) < 1e-3
        ref = reference.int4_matmul(x.cpu().float(), packed.cpu(), s.cpu(), z.cpu(), group)
        assert _rel_err(got.cpu(), reference.silu_and_mul(ref) if glu else ref) < 1e-2
    else:
        assert torch.equal(got, plain)


def test_int4_matmul_rejects_pairs_of_another_shape(device):
    packed, s, z = (t.to(device) for t in reference.quantize_int4(torch.randn(48, 64), 16))
    x = torch.randn(2, 64, device=device).to(torch.bfloat16)
    with pytest.raises(ValueError, match="pairs must be"):
        int4_matmul(x, packed, s, z, 16, pairs=XPairs.empty(2, 64, 32, device))


@pytest.mark.parametrize("group", [32, 64])
def test_quantize_int4_values_equal_cpu_engine_int4(group):
    """The GPU layout holds the very values the CPU engine's int4 weight holds (only the packing differs)."""
    w = torch.randn(48, 4 * group)
    packed, s, z = reference.quantize_int4(w, group)
    torch.testing.assert_close(
        reference.dequantize_int4(packed, s, z, group), quant.dequantize(quant.quantize_int4(w, group)), atol=0, rtol=0
    )


def test_quantize_int8_equals_cpu_engine_int8():
    w = torch.randn(24, 40)
    q, s = reference.quantize_int8(w)
    cpu = quant.quantize_int8(w)
    assert torch.equal(q, cpu.qweight) and torch.equal(s, cpu.scales)


def test_int4_matmul_rejects_group_not_dividing_half_k(device):
    packed, s, z = reference.quantize_int4(torch.randn(16, 64), 32)
    x = torch.randn(1, 48, device=device)  # K = 48 is not a multiple of 2 * 32
    with pytest.raises(ValueError, match="multiple of 2 \\* group_size"):
        int4_matmul(x, packed[:, :24].contiguous().to(device), s.to(device), z.to(device), 32)


def test_int8_matmul_rejects_float_weight(device):
    with pytest.raises(ValueError, match="qweight must be one of"):
        int8_matmul(torch.randn(1, 8, device=device), torch.randn(4, 8, device=device), torch.ones(4, device=device))


def test_split_k_repeats_bit_exactly_and_leaves_counters_at_zero(device):
    """The in-launch split-K reduction sums in split order and resets its counters for the next launch."""
    from kernels import _common

    n, k, group = (4099, 4096, 64) if ON_GPU else (33, 128, 16)
    cfg = Config("gemv", 32, 128, 4) if ON_GPU else Config("gemv", 16, 16, 3)
    packed, s, z = (t.to(device) for t in reference.quantize_int4(torch.randn(n, k), group))
    x = torch.randn(1, k, device=device)
    first = int4_matmul(x, packed, s, z, group, config=cfg)
    second = int4_matmul(x, packed, s, z, group, config=cfg)
    assert torch.equal(first, second)
    assert int(_common._COUNTERS[x.device].abs().sum()) == 0
    ref = reference.int4_matmul(x.cpu(), packed.cpu(), s.cpu(), z.cpu(), group)
    assert _rel_err(first.cpu(), ref) < 1e-3


def _nan_after(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a view at the start of a larger buffer whose tail is NaN (what an out-of-bounds read would see)."""
    buf = torch.full((t.numel() + 256,), float("nan"), dtype=t.dtype, device=t.device)
    buf[: t.numel()] = t.flatten()
    return buf[: t.numel()].view(t.shape)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_tiled_split_past_k_reads_no_scale_beyond_the_tensors(device, kind):
    # split_k=2 in steps of 16 over K/2 = 48 packed int4 bytes (or K = 80 int8 columns) gives splits
    # of 32 (48): the second split's last step starts at the end of K and must read no scale past it
    torch.manual_seed(0)
    n, k, group = 9, 96 if kind == "int4" else 80, 16
    w, x = torch.randn(n, k), torch.randn(17, k)
    cfg = Config("tiled", block_n=16, block_k=16, split_k=2, block_m=16)
    if kind == "int4":
        packed, scales, zeros = reference.quantize_int4(w, group)
        expected = reference.int4_matmul(x, packed, scales, zeros, group)
        args = (packed.to(device), _nan_after(scales.to(device)), _nan_after(zeros.to(device)), group)
        out = int4_matmul(x.to(device), *args, config=cfg)
    else:
        qweight, scales = reference.quantize_int8(w)
        groups = scales[:, None].expand(n, k // group).contiguous()  # per-group scales, all one row's
        expected = reference.int8_matmul(x, qweight, scales)
        out = int8_matmul(x.to(device), qweight.to(device), _nan_after(groups.to(device)), config=cfg, group_size=group)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_gemv_gives_the_same_bits_with_the_first_weight_tile_loaded_before_the_wait(device, fmt):
    """``Config.prefetch`` (and ``ahead``) move loads, not arithmetic: outputs bit-equal, over split-K and a ragged last step."""
    m, n, k = (3, 1027, 4096 + 256) if ON_GPU else (3, 17, 192)
    w = torch.randn(n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16 if ON_GPU else torch.float32, device=device)
    if fmt == "int8":
        qw, s = (t.to(device) for t in reference.quantize_int8(w))
        run = lambda cfg: int8_matmul(x, qw, s, cfg)  # noqa: E731
    else:
        packed, sc, z = (t.to(device) for t in reference.quantize_int4(w, 32))
        run = lambda cfg: int4_matmul(x, packed, sc, z, 32, cfg)  # noqa: E731
    bk, split = (256, 4) if ON_GPU else (32, 2)
    plain = run(Config("gemv", 16, bk, split))
    assert torch.equal(run(Config("gemv", 16, bk, split, prefetch=True)), plain)
    assert torch.equal(run(Config("gemv", 16, bk, split, prefetch=True, ahead=True)), plain)
    assert torch.equal(run(Config("gemv", 16, bk, split, ahead=True)), plain)


@pytest.mark.parametrize("runs", [2, 4])
@pytest.mark.parametrize("ahead", [False, True])
def test_int4_gemv_with_runs_of_a_group_a_thread_matches_the_plain_tile(device, runs, ahead):
    """``Config.runs`` changes which thread holds which words, not the products: the plain tile's result
    up to the order of its fp32 sums, over split-K, a ragged last step and ragged rows."""
    m, n, k, group = (2, 1027, 4096 + 512, 128) if ON_GPU else (2, 17, 256, 64)
    packed, sc, z = (t.to(device) for t in reference.quantize_int4(torch.randn(n, k), group))
    x = torch.randn(m, k, dtype=torch.bfloat16 if ON_GPU else torch.float32, device=device)
    bk, split = (512, 3) if ON_GPU else (64, 3)
    plain = int4_matmul(x, packed, sc, z, group, Config("gemv", 16, bk, split, prefetch=True, ahead=ahead))
    out = int4_matmul(x, packed, sc, z, group, Config("gemv", 16, bk, split, prefetch=True, ahead=ahead, runs=runs))
    torch.testing.assert_close(out.float(), plain.float(), rtol=1e-2, atol=1e-2)
    ref = reference.int4_matmul(x.float().cpu(), packed.cpu(), sc.cpu(), z.cpu(), group)
    assert _rel_err(out.cpu(), ref) < 1e-2


def test_int4_matmul_rejects_runs_that_do_not_cut_the_group_into_vectors(device):
    packed, s, z = (t.to(device) for t in reference.quantize_int4(torch.randn(16, 128), 32))
    x = torch.randn(1, 128, device=device)
    with pytest.raises(ValueError, match="runs 4 must cut group_size 32"):
        int4_matmul(x, packed, s, z, 32, Config("gemv", 16, 32, 1, runs=4))


GLU_CONFIGS = (
    [
        None,
        Config("gemv", 2, 1024, 1, num_warps=2),
        Config("gemv", 16, 256, 4),
        Config("gemv", 16, 512, 2, prefetch=True, ahead=True),
        Config("gemv", 16, 512, 2, prefetch=True, ahead=True, runs=2),
        Config("tiled", 64, 32, 2),
    ]
    if ON_GPU
    else [
        None,
        Config("gemv", 16, 32, 2, prefetch=True),
        Config("gemv", 2, 16, 1),
        Config("tiled", 16, 16, 1, block_m=16),
        Config("tiled", 16, 16, 3, block_m=16),
    ]
)


@pytest.mark.parametrize("config", GLU_CONFIGS)
@pytest.mark.parametrize("kind", ["int8", "int8g", "int4"])
def test_glu_matmul_equals_the_matmul_then_silu_and_mul_bit_for_bit(device, config, kind):
    """``glu`` writes silu(gate) * up of a ``[gate; up]`` weight's product; I odd, so tiles straddle its end."""
    from kernels.activation import silu_and_mul

    m, i, k = (3, 1027, 4096) if ON_GPU else (3, 17, 64)
    group = 32 if ON_GPU else 16
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(2 * i, k)
    if kind == "int4":
        tensors = tuple(t.to(device) for t in reference.quantize_int4(w, group))
        out = int4_matmul(x, *tensors, group, config=config, glu=True)
        ref = silu_and_mul(int4_matmul(x, *tensors, group, config=config))
    else:
        g = group if kind == "int8g" else 0
        qw, s = (t.to(device) for t in (_int8_groups(w, g) if g else reference.quantize_int8(w)))
        out = int8_matmul(x, qw, s, config=config, glu=True, group_size=g)
        ref = silu_and_mul(int8_matmul(x, qw, s, config=config, group_size=g))
    assert out.shape == (m, i)
    assert torch.equal(out, ref)


def _int8_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group symmetric int8 (GGUF Q8_0's form): ``(N, K)`` int8 and ``(N, K / group)`` scales."""
    g = w.view(w.shape[0], -1, group)  # (N, K / group, group)
    s = g.abs().amax(-1) / 127
    return (g / s[..., None]).round().to(torch.int8).view_as(w), s.to(torch.bfloat16)


def test_glu_rejects_an_odd_number_of_weight_rows_or_a_tile_of_them(device):
    qw, s = (t.to(device) for t in reference.quantize_int8(torch.randn(9, 16)))
    with pytest.raises(ValueError, match="even number of weight rows"):
        int8_matmul(torch.randn(1, 16, device=device), qw, s, glu=True)
    qw, s = (t.to(device) for t in reference.quantize_int8(torch.randn(8, 16)))
    with pytest.raises(ValueError, match="even block_n"):
        int8_matmul(torch.randn(1, 16, device=device), qw, s, Config("gemv", 3, 16, 1), glu=True)
