"""Fused RMSNorm + residual, SiLU-and-mul and rotary + KV write against ``kernels.reference``."""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels.activation import silu_and_mul
from kernels.int4_gemv import XPairs
from kernels.rmsnorm import rms_norm_residual
from kernels.rope_kv import rope_write_kv
from tests.kernels.conftest import ON_GPU

DTYPES = [torch.float32, torch.bfloat16]
ROW_SHAPES = [(4, 4096), (7, 5120), (1, 8)] if ON_GPU else [(1, 8), (3, 33), (5, 100)]


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm_residual_matches_reference(device, shape, dtype, with_residual):
    x = torch.randn(shape, dtype=dtype, device=device)
    res = torch.randn(shape, dtype=dtype, device=device) if with_residual else None
    w = torch.randn(shape[1], dtype=dtype, device=device)
    out, h = rms_norm_residual(x, res, w, 1e-5)
    ref_out, ref_h = reference.rms_norm_residual(x.cpu(), None if res is None else res.cpu(), w.cpu(), 1e-5)
    # the add rounds once, to nearest, on the GPU; triton 3.6's interpreter truncates bf16 casts (1 ulp)
    exact = ON_GPU or dtype == torch.float32
    torch.testing.assert_close(h.cpu(), ref_h, **({"atol": 0, "rtol": 0} if exact else tol(dtype)))
    torch.testing.assert_close(out.cpu(), ref_out, **tol(dtype))


@pytest.mark.parametrize(
    ("shape", "group"), [((1, 4096), 128), ((3, 2048), 32)] if ON_GPU else [((1, 64), 16), ((3, 96), 16)]
)
def test_rms_norm_residual_writes_its_output_as_the_int4_gemvs_x_pairs(device, shape, group):
    x = torch.randn(shape, dtype=torch.bfloat16, device=device)
    res = torch.randn(shape, dtype=torch.bfloat16, device=device)
    w = torch.randn(shape[1], dtype=torch.bfloat16, device=device)
    pairs = XPairs.empty(shape[0], shape[1], group, device)
    out, h = rms_norm_residual(x, res, w, 1e-5, pairs=pairs)
    plain_out, plain_h = rms_norm_residual(x, res, w, 1e-5)
    assert torch.equal(out, plain_out) and torch.equal(h, plain_h)
    pa, pb, sums = reference.x_pairs(out.cpu(), group)
    assert torch.equal(pairs.pa.cpu(), pa) and torch.equal(pairs.pb.cpu(), pb)
    torch.testing.assert_close(pairs.sums.cpu(), sums, atol=1e-4, rtol=1e-5)  # summed in another order


def test_rms_norm_residual_rejects_pairs_of_another_shape(device):
    x = torch.randn(2, 64, dtype=torch.bfloat16, device=device)
    w = torch.ones(64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="pairs must be"):
        rms_norm_residual(x, None, w, 1e-5, pairs=XPairs.empty(2, 32, 16, device))
    with pytest.raises(ValueError, match="pairs need bf16 or fp16"):
        rms_norm_residual(x.float(), None, w.float(), 1e-5, pairs=XPairs.empty(2, 64, 16, device))


def test_rms_norm_residual_rejects_mismatched_weight(device):
    x = torch.randn(2, 16, device=device)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm_residual(x, None, torch.ones(8, device=device), 1e-5)


@pytest.mark.parametrize("shape", [(3, 2 * 14336), (1, 2 * 1030)] if ON_GPU else [(1, 14), (4, 2 * 1030)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(device, shape, dtype):
    x = torch.randn(shape, dtype=dtype, device=device) * 3
    torch.testing.assert_close(silu_and_mul(x).cpu(), reference.silu_and_mul(x.cpu()), **tol(dtype))


def test_silu_and_mul_rejects_odd_columns(device):
    with pytest.raises(ValueError, match="2I"):
        silu_and_mul(torch.randn(2, 7, device=device))


def _rope_tables(hd: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(positions).float(), inv)  # (P, hd/2)
    return ang.cos(), ang.sin()


@pytest.mark.parametrize(("nh", "nkv"), [(4, 4), (6, 2), (8, 2), (8, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_write_kv_matches_reference_and_writes_only_its_slots(device, nh, nkv, dtype):
    """Queries are rotated in place; each token's K/V land in its slot, a -1 slot is skipped, others are untouched."""
    n, hd, bs, blocks = (37, 128, 16, 8) if ON_GPU else (5, 16, 4, 3)
    scale = 4 if ON_GPU else 1
    q = torch.randn(n, nh * scale, hd, dtype=dtype, device=device)
    k = torch.randn(n, nkv * scale, hd, dtype=dtype, device=device)
    v = torch.randn_like(k)
    pos = torch.randint(0, 500, (n,), device=device)
    cos, sin = (t.to(device) for t in _rope_tables(hd, 512))
    slots = torch.randperm(blocks * bs, device=device)[:n]
    slots[n // 2] = -1
    kc = torch.randn(blocks, bs, nkv * scale, hd, dtype=dtype, device=device)  # poison: random, not zeros
    vc = torch.randn_like(kc)
    ref_args = [t.cpu().clone() for t in (q, k, v, pos, cos, sin, kc, vc, slots)]
    rope_write_kv(q, k, v, pos, cos, sin, kc, vc, slots)
    reference.rope_write_kv(*ref_args)
    torch.testing.assert_close(q.cpu(), ref_args[0], **tol(dtype))
    torch.testing.assert_close(kc.cpu(), ref_args[6], **tol(dtype))
    torch.testing.assert_close(vc.cpu(), ref_args[7], atol=0, rtol=0)


def test_rope_write_kv_rejects_cache_of_other_head_count(device):
    q, k = torch.randn(2, 4, 8, device=device), torch.randn(2, 2, 8, device=device)
    cos, sin = _rope_tables(8, 4)
    kc = torch.zeros(2, 4, 3, 8, device=device)
    with pytest.raises(ValueError, match="cache shape"):
        rope_write_kv(
            q,
            k,
            k,
            torch.zeros(2, dtype=torch.long, device=device),
            cos.to(device),
            sin.to(device),
            kc,
            kc,
            torch.zeros(2, dtype=torch.long, device=device),
        )
