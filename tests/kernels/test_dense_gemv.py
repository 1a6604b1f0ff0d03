"""Dense GEMV (float weight, few rows, optional SiLU-and-mul on load) against plain torch."""

from __future__ import annotations

import pytest
import torch

from kernels.dense_gemv import dense_gemv
from kernels.quant_matmul import Config
from tests.kernels.conftest import ON_GPU

# (M, N, K): odd N, K not a multiple of the loop step
SHAPES = [(1, 4099, 4100), (3, 1027, 576), (4, 49157, 576)] if ON_GPU else [(1, 33, 72), (3, 17, 40), (4, 9, 100)]
CONFIGS = (
    [None, Config("gemv", 32, 128, 4, prefetch=True), Config("gemv", 64, 64, 1)]
    if ON_GPU
    else [None, Config("gemv", 16, 32, 3, prefetch=True), Config("gemv", 16, 16, 1)]
)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dense_gemv_matches_torch_matmul(device, shape, config, dtype):
    m, n, k = shape
    w, x = torch.randn(n, k, dtype=dtype), torch.randn(m, k, dtype=dtype)
    out = dense_gemv(x.to(device), w.to(device), config)
    ref = x.double() @ w.double().T
    assert out.shape == (m, n) and out.dtype == dtype
    assert _rel_err(out.cpu(), ref) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("config", CONFIGS)
def test_glu_dense_gemv_equals_the_gemv_then_silu_and_mul_bit_for_bit(device, config):
    """``glu`` writes silu(gate) * up of a ``[gate; up]`` weight's product; I odd, so tiles straddle its end."""
    from kernels.activation import silu_and_mul

    m, i, k = (2, 1027, 1536) if ON_GPU else (2, 17, 40)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(2 * i, k, dtype=torch.bfloat16, device=device)
    out = dense_gemv(x, w, config, glu=True)
    assert out.shape == (m, i)
    assert torch.equal(out, silu_and_mul(dense_gemv(x, w, config)))


def test_dense_gemv_rows_do_not_depend_on_their_batch(device):
    """One program per row, the same loop for every row: a row's bits are the same alone or with others."""
    n, k = (4099, 4100) if ON_GPU else (33, 72)
    w, x = (
        torch.randn(n, k, device=device, dtype=torch.bfloat16),
        torch.randn(4, k, device=device, dtype=torch.bfloat16),
    )
    together = dense_gemv(x, w)
    for r in range(4):
        assert torch.equal(dense_gemv(x[r : r + 1], w), together[r : r + 1])


def test_dense_gemv_rejects_a_tiled_config(device):
    with pytest.raises(ValueError, match="only the GEMV path"):
        dense_gemv(torch.randn(1, 16, device=device), torch.randn(8, 16, device=device), Config("tiled", 16, 16, 1))
