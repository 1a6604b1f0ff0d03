"""A GEMV that finishes with the residual RMSNorm (``ResidualNorm``) against the matmul then ``rms_norm_residual``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from kernels import reference
from kernels.dense_gemv import dense_gemv, dense_gemv_norm
from kernels.quant_matmul import Config, ResidualNorm, int4_matmul, int4_matmul_norm, int8_matmul, int8_matmul_norm
from kernels.rmsnorm import rms_norm_residual
from tests.kernels.conftest import ON_GPU

if TYPE_CHECKING:
    from collections.abc import Callable

Pair = tuple[torch.Tensor, torch.Tensor]


def _formats(
    device: torch.device, dtype: torch.dtype, n: int, k: int
) -> dict[str, tuple[Callable[..., torch.Tensor], Callable[..., Pair]]]:
    """Per weight format: (the matmul, the matmul that finishes with the norm), over one random (n, k) weight."""
    w = (torch.randn(n, k) * 0.05).to(dtype).to(device)
    q8, s8 = reference.quantize_int8(w.float().cpu())
    q8, s8 = q8.to(device), s8.to(device)
    p4, s4, z4 = (t.to(device) for t in reference.quantize_int4(w.float().cpu(), 16))
    return {
        "dense": (
            lambda x, cfg, gated: dense_gemv(x, w, cfg, gated=gated),
            lambda x, norm, cfg, gated: dense_gemv_norm(x, w, norm, cfg, gated=gated),
        ),
        "int8": (
            lambda x, cfg, gated: int8_matmul(x, q8, s8, cfg, gated=gated),
            lambda x, norm, cfg, gated: int8_matmul_norm(x, q8, s8, norm, cfg, gated=gated),
        ),
        "int4": (
            lambda x, cfg, gated: int4_matmul(x, p4, s4, z4, 16, cfg, gated=gated),
            lambda x, norm, cfg, gated: int4_matmul_norm(x, p4, s4, z4, 16, norm, cfg, gated=gated),
        ),
    }


CONFIGS = (
    [None, Config("gemv", 2, 1024, 1, num_warps=2), Config("gemv", 8, 512, 4)]
    if ON_GPU
    else [None, Config("gemv", 4, 32, 1), Config("gemv", 16, 32, 2)]
)


@pytest.mark.parametrize("fmt", ["dense", "int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_gemv_norm_equals_matmul_then_rms_norm_residual(device, fmt, rows, gated, cfg):
    """Normed rows and new residual bit-equal to the two launches, over split-K, several rows and a ragged last tile;
    a second launch gives the same (the row counters are back at zero)."""
    n, k = (4099, 4096) if ON_GPU else (37, 64)
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    matmul, matmul_norm = _formats(device, dtype, n, k)[fmt]
    x = torch.randn(rows, 2 * k if gated else k, dtype=dtype, device=device)
    norm = ResidualNorm(torch.randn(rows, n, dtype=dtype, device=device), 1 + 0.1 * torch.randn(n, device=device), 1e-5)
    want = rms_norm_residual(matmul(x, cfg, gated), norm.residual, norm.weight, norm.eps)
    for _ in range(2):
        got = matmul_norm(x, norm, cfg, gated)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])


def test_gemv_norm_falls_back_to_two_launches_past_the_gemv_rows(device):
    """Eight rows take the tiled path, whose tiles cannot see a whole row: the norm runs after it."""
    n, k = (1027, 4096) if ON_GPU else (33, 64)
    matmul, matmul_norm = _formats(device, torch.float32, n, k)["int8"]
    x = torch.randn(8, k, device=device)
    norm = ResidualNorm(torch.randn(8, n, device=device), torch.ones(n, device=device), 1e-6)
    want = rms_norm_residual(matmul(x, None, False), norm.residual, norm.weight, norm.eps)
    got = matmul_norm(x, norm, None, False)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_gemv_norm_rejects_a_residual_of_another_shape(device):
    _, matmul_norm = _formats(device, torch.float32, 33, 64)["dense"]
    norm = ResidualNorm(torch.randn(1, 32, device=device), torch.ones(33, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual must be"):
        matmul_norm(torch.randn(1, 64, device=device), norm, None, False)
