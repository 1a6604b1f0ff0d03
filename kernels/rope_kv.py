# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Rotary embedding fused with the paged KV-cache write.

One program per token rotates its query heads in place and stores its rotated keys and its values
straight into their cache slot.

Owns the Triton kernel and its launcher; semantics are ``kernels.reference.rope_write_kv``, which
the launcher falls back to where no kernel can run. Does not own the rotary tables (the model
builds them) nor slot assignment (the KV cache manager).
"""

from __future__ import annotations

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, next_pow2, pdl_args, tl, triton

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _rope_write_kv_kernel(
        q_ptr,  # (N, nh, hd) queries, rotated in place
        k_ptr,  # (N, nkv, hd) new keys
        v_ptr,  # (N, nkv, hd) new values
        pos_ptr,  # (N,) positions
        cos_ptr,  # (P, >= hd/2) fp32 cos table
        sin_ptr,  # (P, >= hd/2) fp32 sin table
        kc_ptr,  # (num_blocks, block_size, nkv, hd) key cache
        vc_ptr,  # (num_blocks, block_size, nkv, hd) value cache
        slot_ptr,  # (N,) flat slots; negative skips the cache write
        sq_n,  # q strides: token, head
        sq_h,
        sk_n,  # k strides: token, head
        sk_h,
        sv_n,  # v strides: token, head
        sv_h,
        s_cos,  # row stride of both tables
        sc_slot,  # cache strides: slot (= block stride / block_size), head
        sc_h,
        NH: tl.constexpr,  # query heads
        NKV: tl.constexpr,  # key/value heads
        HALF: tl.constexpr,  # hd / 2
        BLOCK_H: tl.constexpr,  # power of two >= max(NH, NKV)
        BLOCK_D: tl.constexpr,  # power of two >= HALF
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        pdl_enter(PDL)
        tok = tl.program_id(0)
        heads = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1)
        d = tl.arange(0, BLOCK_D)[None, :]  # (1, BLOCK_D)
        dmask = d < HALF
        pos = tl.load(pos_ptr + tok).to(tl.int64)
        c = tl.load(cos_ptr + pos * s_cos + d, mask=dmask, other=0.0).to(tl.float32)  # (1, BLOCK_D)
        s = tl.load(sin_ptr + pos * s_cos + d, mask=dmask, other=0.0).to(tl.float32)

        qmask = (heads < NH) & dmask
        q_base = q_ptr + tok * sq_n + heads * sq_h + d
        q1 = tl.load(q_base, mask=qmask, other=0.0)
        q2 = tl.load(q_base + HALF, mask=qmask, other=0.0)
        q1f, q2f = q1.to(tl.float32), q2.to(tl.float32)
        tl.store(q_base, (q1f * c - q2f * s).to(q1.dtype), mask=qmask)
        tl.store(q_base + HALF, (q2f * c + q1f * s).to(q1.dtype), mask=qmask)

        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:
            kmask = (heads < NKV) & dmask
            k_base = k_ptr + tok * sk_n + heads * sk_h + d
            k1 = tl.load(k_base, mask=kmask, other=0.0).to(tl.float32)
            k2 = tl.load(k_base + HALF, mask=kmask, other=0.0).to(tl.float32)
            c_base = slot * sc_slot + heads * sc_h + d
            kc = kc_ptr + c_base
            tl.store(kc, (k1 * c - k2 * s).to(kc_ptr.dtype.element_ty), mask=kmask)
            tl.store(kc + HALF, (k2 * c + k1 * s).to(kc_ptr.dtype.element_ty), mask=kmask)
            v_base = v_ptr + tok * sv_n + heads * sv_h + d
            v1 = tl.load(v_base, mask=kmask, other=0.0)
            v2 = tl.load(v_base + HALF, mask=kmask, other=0.0)
            vc = vc_ptr + c_base
            tl.store(vc, v1.to(vc_ptr.dtype.element_ty), mask=kmask)
            tl.store(vc + HALF, v2.to(vc_ptr.dtype.element_ty), mask=kmask)


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate ``q`` in place; write rotated ``k`` and ``v`` into the caches at ``slot_mapping``.

    See ``kernels.reference.rope_write_kv`` for the argument shapes.

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take.
    """
    check(q.dim() == 3 and k.dim() == 3 and v.shape == k.shape, "q must be (N, nh, hd), k and v (N, nkv, hd)")
    N, nh, hd = q.shape
    nkv = k.shape[1]
    check(k.shape[0] == N and k.shape[2] == hd and hd % 2 == 0, f"k {tuple(k.shape)} does not fit q {tuple(q.shape)}")
    check(
        k_cache.dim() == 4 and k_cache.shape[2:] == (nkv, hd), f"cache shape {tuple(k_cache.shape)} != (B, bs, nkv, hd)"
    )
    check(v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype, "k_cache and v_cache must match")
    check(positions.shape == (N,) and slot_mapping.shape == (N,), "positions and slot_mapping must be (N,)")
    check(cos.shape == sin.shape and cos.dim() == 2 and cos.shape[1] >= hd // 2, "cos/sin must be (P, >= hd/2)")
    check_dtype("cos", cos, torch.float32)
    check_dtype("sin", sin, torch.float32)
    check_dtype("positions", positions, torch.int32, torch.int64)
    check_dtype("slot_mapping", slot_mapping, torch.int32, torch.int64)
    if not can_launch(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
        reference.rope_write_kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
        return
    for name, t in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin), ("k_cache", k_cache)):
        check_last_contiguous(name, t)
    check(cos.stride() == sin.stride(), "cos and sin must share strides")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    if N == 0:
        return
    _rope_write_kv_kernel[(N,)](
        q,
        k,
        v,
        positions,
        cos,
        sin,
        k_cache,
        v_cache,
        slot_mapping,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NH=nh,
        NKV=nkv,
        HALF=hd // 2,
        BLOCK_H=next_pow2(max(nh, nkv)),
        BLOCK_D=next_pow2(hd // 2),
        num_warps=4,
        **pdl_args(q),
    )
