"""The qkv matmuls' rotary + KV-cache epilogue (``rope=``) against the matmul followed by ``rope_write_kv``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import reference
from kernels.dense_gemv import dense_gemv
from kernels.int4_matmul import int4_matmul
from kernels.quant_matmul import Config, int8_matmul
from kernels.rope_kv import RopeKV
from tests.kernels.conftest import ON_GPU

# (heads, kv heads, head dim, K): GQA ratios 1 and 3 (the 8B shape's 4 on the GPU)
HEADS = [(32, 8, 128, 4096), (9, 3, 64, 576)] if ON_GPU else [(3, 1, 16, 64), (2, 2, 8, 32)]
CONFIGS = (
    [
        None,
        Config("gemv", 8, 512, 1),
        Config("gemv", 16, 64, 3, prefetch=True),
        Config("gemv", 16, 1024, 1, prefetch=True, ahead=True),
        Config("tiled", 64, 32, 1),
    ]
    if ON_GPU
    else [
        None,
        Config("gemv", 4, 32, 1),
        Config("gemv", 16, 16, 3, prefetch=True),  # split K; a tile straddles q, k and v heads
        Config("tiled", 16, 16, 1),  # the tiled path runs rope_write_kv after its plain tiles
    ]
)
KINDS = ["bf16", "int8", "int8g", "int4"]
Matmul = Callable[..., torch.Tensor]


def _matmul(kind: str, n: int, k: int, device: torch.device) -> Matmul:
    """``kind``'s matmul over a random ``(n, k)`` weight: ``f(x, config, rope=None)``."""
    w = torch.randn(n, k) * 0.1
    group = 32 if ON_GPU else 16
    if kind == "bf16":
        wd = w.to(device, torch.bfloat16)
        return lambda x, cfg, rope=None: dense_gemv(
            x, wd, None if cfg is None or cfg.path == "tiled" else cfg, rope=rope
        )
    if kind == "int4":
        t4 = tuple(t.to(device) for t in reference.quantize_int4(w, group))
        return lambda x, cfg, rope=None: int4_matmul(x, *t4, group, config=cfg, rope=rope)
    g = group if kind == "int8g" else 0
    if g:
        blocks = w.view(n, -1, g)  # (N, K / G, G)
        s = blocks.abs().amax(-1) / 127
        t8 = ((blocks / s[..., None]).round().to(torch.int8).view(n, k).to(device), s.to(device, torch.bfloat16))
    else:
        t8 = tuple(t.to(device) for t in reference.quantize_int8(w))
    return lambda x, cfg, rope=None: int8_matmul(x, *t8, config=cfg, rope=rope, group_size=g)


def _rope(m: int, nkv: int, hd: int, device: torch.device, slots: list[int]) -> RopeKV:
    """Rotary tables of 64 positions, random positions and a zeroed bf16 cache of 6 blocks of 4 slots."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(64).float(), inv)  # (P, hd/2)
    cache = torch.zeros(6, 4, nkv, hd, dtype=torch.bfloat16, device=device)
    return RopeKV(
        positions=torch.randint(0, 64, (m,), device=device),
        cos=ang.cos().to(device),
        sin=ang.sin().to(device),
        k_cache=cache,
        v_cache=cache.clone(),
        slot_mapping=torch.tensor(slots, device=device),
    )


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("kind", KINDS)
def test_rope_epilogue_equals_the_matmul_then_rope_write_kv_bit_for_bit(device, kind, heads, config):
    """Queries, the cache slots written and the ones a negative slot skips are those of the two launches."""
    nh, nkv, hd, k = heads
    n, m = (nh + 2 * nkv) * hd, 2
    matmul = _matmul(kind, n, k, device)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    fused = _rope(m, nkv, hd, device, slots=[13, -1])
    unfused = RopeKV(
        fused.positions, fused.cos, fused.sin, fused.k_cache.clone(), fused.v_cache.clone(), fused.slot_mapping
    )
    q = matmul(x, config, rope=fused)
    q_ref = unfused.apply(matmul(x, config))
    assert q.shape == (m, nh * hd)
    assert torch.equal(q, q_ref)
    assert torch.equal(fused.k_cache, unfused.k_cache) and torch.equal(fused.v_cache, unfused.v_cache)
    flat_k = fused.k_cache.view(-1, nkv, hd)  # (slots, nkv, hd)
    assert flat_k[13].abs().sum() > 0  # the row's key was written at its slot...
    assert flat_k[:13].abs().sum() == 0 and flat_k[14:].abs().sum() == 0  # ...and the skipped row's nowhere


def test_rope_epilogue_matches_the_reference_rotary(device):
    """The fused queries and keys are ``reference.rope_write_kv``'s over the reference product, to bf16 rounding."""
    nh, nkv, hd, k = HEADS[0]
    n = (nh + 2 * nkv) * hd
    matmul = _matmul("int8", n, k, device)
    x = torch.randn(1, k, dtype=torch.bfloat16, device=device)
    fused = _rope(1, nkv, hd, device, slots=[5])
    q = matmul(x, None, rope=fused)
    qkv = matmul(x, None).float().cpu()
    kc, vc = torch.zeros(6, 4, nkv, hd), torch.zeros(6, 4, nkv, hd)
    q_ref = qkv[:, : nh * hd].view(1, nh, hd).clone()
    reference.rope_write_kv(
        q_ref,
        qkv[:, nh * hd : nh * hd + nkv * hd].view(1, nkv, hd),
        qkv[:, nh * hd + nkv * hd :].view(1, nkv, hd),
        fused.positions.cpu(),
        fused.cos.cpu(),
        fused.sin.cpu(),
        kc,
        vc,
        fused.slot_mapping.cpu(),
    )
    torch.testing.assert_close(q.float().cpu(), q_ref.view(1, -1), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(fused.k_cache.float().cpu(), kc, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(fused.v_cache.float().cpu(), vc, rtol=0, atol=0)


def test_rope_epilogue_rejects_glu_a_wrong_width_and_a_position_per_row_missing(device):
    nh, nkv, hd, k = HEADS[-1]
    n = (nh + 2 * nkv) * hd
    x = torch.randn(2, k, dtype=torch.bfloat16, device=device)
    qw, s = (t.to(device) for t in reference.quantize_int8(torch.randn(n, k)))
    rope = _rope(2, nkv, hd, device, slots=[0, 1])
    with pytest.raises(ValueError, match="glu or rope"):
        int8_matmul(x, qw, s, glu=True, rope=rope)
    with pytest.raises(ValueError, match="not \\[q; k; v\\] heads"):
        int8_matmul(x, qw[: n - hd // 2], s[: n - hd // 2], rope=rope)
    with pytest.raises(ValueError, match="positions and slot_mapping"):
        int8_matmul(x[:1], qw, s, rope=rope)
