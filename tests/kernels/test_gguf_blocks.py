"""GGUF Q4_1 / Q8_0 blocks repacked into the matmul layouts, and the matmuls over them, against gguf-py.

The oracle is ``gguf.quants.dequantize`` (llama.cpp's own Python port) on bytes written by
``gguf.quants.quantize``: the repacked weight must be GGUF's weight, and the kernels' products
must equal ``x @ W_gguf.T`` up to fp32 accumulation (bf16 rounding for bf16 activations).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from kernels import gguf_blocks, reference
from kernels.activation import silu_and_mul
from kernels.int4_matmul import int4_matmul
from kernels.quant_matmul import Config, int8_matmul
from tests.kernels.conftest import ON_GPU

Q4_1 = gguf.GGMLQuantizationType.Q4_1
Q8_0 = gguf.GGMLQuantizationType.Q8_0

# (M, N, K): N not a multiple of any tile; Q8_0 K only a multiple of 32, Q4_1 K of 64 (the int4 layout)
SHAPES_Q8_0 = (
    [(1, 4099, 4128), (3, 1027, 2080), (17, 577, 4128)] if ON_GPU else [(1, 37, 160), (3, 33, 96), (17, 19, 160)]
)
SHAPES_Q4_1 = (
    [(1, 4099, 4096), (3, 1027, 2048), (17, 577, 4096)] if ON_GPU else [(1, 37, 192), (3, 33, 128), (17, 19, 192)]
)
CONFIGS = (
    [None, Config("gemv", 32, 256, 4), Config("tiled", 64, 32, 2)]
    if ON_GPU
    else [None, Config("gemv", 16, 64, 2), Config("tiled", 16, 16, 3, block_m=16)]
)


def _cases(shapes: list[tuple[int, int, int]]) -> list[tuple[tuple[int, int, int], Config | None]]:
    """Every shape with every config, but the interpreter runs GEMV only at decode row counts (it is slow there)."""
    return [(s, c) for s in shapes for c in CONFIGS if ON_GPU or c is None or c.path == "tiled" or s[0] <= 4]


def _gguf(n: int, k: int, qtype: gguf.GGMLQuantizationType, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(raw (N, bytes) uint8, GGUF's dequantized fp32 (N, K))`` of a random weight with outlier rows."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 3.0, (n, 1)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    return torch.from_numpy(raw.copy()), torch.from_numpy(quants.dequantize(raw, qtype).copy())


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def test_block_unpacking_is_bit_exact_with_gguf_py() -> None:
    raw41, w41 = _gguf(19, 160, Q4_1)
    raw80, w80 = _gguf(19, 160, Q8_0)
    assert torch.equal(gguf_blocks.dequantize_q4_1(raw41), w41)
    assert torch.equal(gguf_blocks.dequantize_q8_0(raw80), w80)


def test_repacked_weights_are_ggufs_weights() -> None:
    raw41, w41 = _gguf(19, 192, Q4_1)
    raw80, w80 = _gguf(19, 160, Q8_0)
    packed, scales, zeros = gguf_blocks.q4_1_to_int4(raw41)
    assert packed.shape == (19, 96) and scales.dtype == torch.float16 and zeros.dtype == torch.float32
    # (q - 8) d + (m + 8 d) against d q + m: one fp32 rounding apart at most
    torch.testing.assert_close(reference.dequantize_int4(packed, scales, zeros, 32), w41, rtol=1e-6, atol=1e-6)
    qweight, d = gguf_blocks.q8_0_to_int8(raw80)
    assert qweight.dtype == torch.int8 and d.shape == (19, 5)
    assert torch.equal(reference.dequantize_int8(qweight, d), w80)


def test_q4_1_needs_k_a_multiple_of_64_and_whole_blocks() -> None:
    raw, _ = _gguf(4, 96, Q4_1)
    with pytest.raises(gguf_blocks.BlockLayoutError, match="multiple of 64"):
        gguf_blocks.q4_1_to_int4(raw)
    with pytest.raises(gguf_blocks.BlockLayoutError, match="whole 34-byte blocks"):
        gguf_blocks.q8_0_to_int8(raw)  # Q4_1 bytes (60 a row) read as Q8_0


@pytest.mark.parametrize(("shape", "config"), _cases(SHAPES_Q8_0))
def test_q8_0_matmul_equals_x_times_gguf_weight(device, shape, config) -> None:
    m, n, k = shape
    raw, w = _gguf(n, k, Q8_0)
    qweight, scales = (t.to(device) for t in gguf_blocks.q8_0_to_int8(raw))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x = torch.randn(m, k).to(dtype)
        out = int8_matmul(x.to(device), qweight, scales, config=config, group_size=32)
        assert out.shape == (m, n) and out.dtype == dtype
        assert _rel_err(out.cpu(), x.float() @ w.t()) < tol


@pytest.mark.parametrize(("shape", "config"), _cases(SHAPES_Q4_1))
def test_q4_1_matmul_equals_x_times_gguf_weight(device, shape, config) -> None:
    m, n, k = shape
    raw, w = _gguf(n, k, Q4_1)
    packed, scales, zeros = (t.to(device) for t in gguf_blocks.q4_1_to_int4(raw))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x = torch.randn(m, k).to(dtype)
        out = int4_matmul(x.to(device), packed, scales, zeros, 32, config=config)
        assert out.shape == (m, n) and out.dtype == dtype
        assert _rel_err(out.cpu(), x.float() @ w.t()) < tol


def test_group_wise_int8_rejects_scales_of_the_wrong_shape(device) -> None:
    qweight, scales = gguf_blocks.q8_0_to_int8(_gguf(8, 64, Q8_0)[0])
    x = torch.randn(1, 64, device=device)
    with pytest.raises(ValueError, match="scales must be \\(8, 4\\)"):
        int8_matmul(x, qweight.to(device), scales.to(device), group_size=16)
    with pytest.raises(ValueError, match="group_size must be a power of two"):
        int8_matmul(x, qweight.to(device), scales.to(device), group_size=48)


@pytest.mark.parametrize("kind", ["int8", "int8g", "int4"])
def test_glu_on_gguf_blocks_is_the_matmul_then_silu_and_mul_on_both_paths(device, kind) -> None:
    """``glu`` over a GGUF ``[gate; up]``: the GEMV applies it as it writes, the tiled path runs the activation after."""
    m, n, k = (16, 2054, 2048) if ON_GPU else (5, 38, 128)
    tiled = Config("tiled", 64, 32, 2) if ON_GPU else Config("tiled", 16, 16, 2, block_m=16)
    gemv = Config("gemv", 32, 256, 2) if ON_GPU else Config("gemv", 16, 32, 2)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    if kind == "int4":
        tensors = tuple(t.to(device) for t in gguf_blocks.q4_1_to_int4(_gguf(n, k, Q4_1)[0]))

        def matmul(a: torch.Tensor, cfg: Config, glu: bool) -> torch.Tensor:
            return int4_matmul(a, *tensors, 32, config=cfg, glu=glu)

    else:
        group = 32 if kind == "int8g" else 0
        q, s = gguf_blocks.q8_0_to_int8(_gguf(n, k, Q8_0)[0]) if group else reference.quantize_int8(torch.randn(n, k))

        def matmul(a: torch.Tensor, cfg: Config, glu: bool) -> torch.Tensor:
            return int8_matmul(a, q.to(device), s.to(device), config=cfg, glu=glu, group_size=group)

    assert torch.equal(matmul(x, tiled, True), silu_and_mul(matmul(x, tiled, False)))
    assert torch.equal(matmul(x[:1], gemv, True), silu_and_mul(matmul(x[:1], gemv, False)))
