# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Rotary embedding fused with the paged KV-cache write.

One program per token rotates its query heads in place and stores its rotated keys and its values
straight into their cache slot. The same work can also be a qkv projection's epilogue: a GEMV that
is handed a ``RopeKV`` writes the rotated queries as its output and the keys and values into the
caches (``_rope_write_tile``, called by ``kernels._matmul_launch``), which saves this kernel's launch.

Owns the Triton kernel and its launcher, ``RopeKV`` and the epilogue; semantics are
``kernels.reference.rope_write_kv``, which the launcher falls back to where no kernel can run. Does
not own the rotary tables (the model builds them) nor slot assignment (the KV cache manager).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, next_pow2, pdl_args, tl, triton


@dataclass(frozen=True, slots=True)
class RopeKV:
    """A qkv projection's rotary + KV-cache write, for the matmul to do as it writes (``rope=``).

    The projection's N output columns are ``[q heads; k heads; v heads]``, ``head_dim`` each, the k
    and v parts as wide as one cache slot. With it, a matmul returns the rotated queries ``(M,
    q_size)`` and has written the rows' rotated keys and values at their slots; the arguments are
    ``rope_write_kv``'s, one position and slot per row of x.
    """

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor

    @property
    def head_dim(self) -> int:
        """Elements of one head."""
        return int(self.k_cache.shape[3])

    @property
    def kv_size(self) -> int:
        """Columns of the k part (and of the v part): one cache slot's elements."""
        return int(self.k_cache.shape[2]) * self.head_dim

    def check(self, rows: int, n: int) -> None:
        """Raise unless ``rows`` rows of an ``n``-column qkv product can take this write (the fused form)."""
        hd = self.head_dim
        check(self.k_cache.dim() == 4, f"cache shape {tuple(self.k_cache.shape)} != (B, bs, nkv, hd)")
        check(hd % 2 == 0 and n % hd == 0 and n > 2 * self.kv_size, f"{n} columns are not [q; k; v] heads of {hd}")
        _check_rows_and_tables(
            self.positions, self.slot_mapping, self.cos, self.sin, self.k_cache, self.v_cache, rows, hd
        )
        check(self.cos.stride() == self.sin.stride() and self.cos.stride(1) == 1, "cos and sin must share strides")
        check(self.k_cache.is_contiguous() and self.v_cache.is_contiguous(), "caches must be contiguous")

    def apply(self, qkv: torch.Tensor) -> torch.Tensor:
        """The unfused form over a finished ``(M, N)`` qkv product: ``rope_write_kv``, then the queries ``(M, q_size)``."""
        m, n = qkv.shape
        hd, kv = self.head_dim, self.kv_size
        q_size = n - 2 * kv
        q = qkv[:, :q_size].view(m, q_size // hd, hd)  # strided views into qkv: no copies
        k = qkv[:, q_size : q_size + kv].view(m, kv // hd, hd)
        v = qkv[:, q_size + kv :].view(m, kv // hd, hd)
        rope_write_kv(q, k, v, self.positions, self.cos, self.sin, self.k_cache, self.v_cache, self.slot_mapping)
        return qkv[:, :q_size]


if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _rotate(x1, x2, c, s):
        """``(x1 c - x2 s, x2 c + x1 s)`` in fp32.

        NOTE(h7): the FMAs are spelled out: left to the compiler, the kernel and the GEMV epilogue
        contracted the same expression differently on the H100, and their bf16 results differed.
        """
        return tl.fma(x1, c, -(x2 * s)), tl.fma(x2, c, x1 * s)

    @triton.jit
    def _rope_rows(pos_ptr, slot_ptr, rm, mmask, ROPE: tl.constexpr):
        """The rows' positions and cache slots for ``_rope_write_tile`` (placeholders without ROPE).

        NOTE(h7): the host stages both before the step and no kernel writes them, so a matmul loads
        them before its PDL wait: the epilogue at the end of each program then waits on one round
        trip (the tables' row) instead of two in a chain. On the H100 at batch 1 (2026-11-27), against
        loading them in the epilogue: the 8B shape 0.2-0.5 % faster in every format, SmolLM2 in the
        engine 2-4 % a token in int8, int4 and GGUF; loading the tables' row early too was slower for
        int8 and bf16.
        """
        if ROPE:
            pos = tl.load(pos_ptr + rm, mask=mmask, other=0).to(tl.int64)
            slot = tl.load(slot_ptr + rm, mask=mmask, other=-1).to(tl.int64)
        else:
            pos = rm.to(tl.int64)
            slot = pos
        return pos, slot

    @triton.jit
    def _rope_write_tile(a, b, j, rm, mmask, q_ptr, sq_m, pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, HALF: tl.constexpr):  # fmt: skip
        """Finish a qkv GEMV tile as ``rope_write_kv`` would: ``a``, ``b`` are ``(rows, P)`` fp32 pairs.

        Pair ``j`` is column ``d = j % HALF`` of head ``j // HALF`` of ``[q; k; v]`` (``a``) and the
        column ``HALF`` after it (``b``), each already rounded to the output dtype, as the product the
        unfused kernel loads. q pairs are rotated into ``q_ptr`` (``(M, QN)``), k pairs rotated and v
        pairs as they are into the caches at the row's slot (``KVN`` elements a slot); a negative
        slot writes no cache. ``pos`` and ``slot`` are the rows' (``_rope_rows``).
        """
        d = j % HALF  # (P,)
        col = (j // HALF) * (2 * HALF) + d  # (P,) a's column of [q; k; v]
        ok = mmask[:, None] & (col < QN + 2 * KVN)[None, :]  # (rows, P)
        pos = pos[:, None]  # (rows, 1)
        c = tl.load(cos_ptr + pos * s_cos + d[None, :], mask=ok, other=0.0)
        s = tl.load(sin_ptr + pos * s_cos + d[None, :], mask=ok, other=0.0)
        rot = (col < QN + KVN)[None, :]
        a_rot, b_rot = _rotate(a, b, c, s)
        ra = tl.where(rot, a_rot, a)
        rb = tl.where(rot, b_rot, b)
        is_q = ok & (col < QN)[None, :]
        q_at = q_ptr + rm[:, None] * sq_m + col[None, :]
        tl.store(q_at, ra.to(q_ptr.dtype.element_ty), mask=is_q)
        tl.store(q_at + HALF, rb.to(q_ptr.dtype.element_ty), mask=is_q)
        slot = slot[:, None]  # (rows, 1)
        cached = ok & (slot >= 0)
        is_k = cached & ((col >= QN) & (col < QN + KVN))[None, :]
        k_at = kc_ptr + slot * KVN + (col - QN)[None, :]
        tl.store(k_at, ra.to(kc_ptr.dtype.element_ty), mask=is_k)
        tl.store(k_at + HALF, rb.to(kc_ptr.dtype.element_ty), mask=is_k)
        is_v = cached & (col >= QN + KVN)[None, :]
        v_at = vc_ptr + slot * KVN + (col - QN - KVN)[None, :]
        tl.store(v_at, ra.to(vc_ptr.dtype.element_ty), mask=is_v)
        tl.store(v_at + HALF, rb.to(vc_ptr.dtype.element_ty), mask=is_v)

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
        q1r, q2r = _rotate(q1f, q2f, c, s)
        tl.store(q_base, q1r.to(q1.dtype), mask=qmask)
        tl.store(q_base + HALF, q2r.to(q1.dtype), mask=qmask)

        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:
            kmask = (heads < NKV) & dmask
            k_base = k_ptr + tok * sk_n + heads * sk_h + d
            k1 = tl.load(k_base, mask=kmask, other=0.0).to(tl.float32)
            k2 = tl.load(k_base + HALF, mask=kmask, other=0.0).to(tl.float32)
            c_base = slot * sc_slot + heads * sc_h + d
            kc = kc_ptr + c_base
            k1r, k2r = _rotate(k1, k2, c, s)
            tl.store(kc, k1r.to(kc_ptr.dtype.element_ty), mask=kmask)
            tl.store(kc + HALF, k2r.to(kc_ptr.dtype.element_ty), mask=kmask)
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
    _check_rows_and_tables(positions, slot_mapping, cos, sin, k_cache, v_cache, N, hd)
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


def _check_rows_and_tables(
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: int,
    hd: int,
) -> None:
    """The checks ``rope_write_kv`` and ``RopeKV`` share: a position and a slot a row, the tables, matching caches."""
    check(v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype, "k_cache and v_cache must match")
    check(positions.shape == (rows,) and slot_mapping.shape == (rows,), f"positions and slot_mapping must be ({rows},)")
    check(cos.shape == sin.shape and cos.dim() == 2 and cos.shape[1] >= hd // 2, "cos/sin must be (P, >= hd/2)")
    check_dtype("cos", cos, torch.float32)
    check_dtype("sin", sin, torch.float32)
    check_dtype("positions", positions, torch.int32, torch.int64)
    check_dtype("slot_mapping", slot_mapping, torch.int32, torch.int64)
