# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Paged attention for decode: one new query per sequence over its block-table context.

GQA-aware: a program owns one KV head and all the query heads that share it, so each key and value
tile is read once for the whole group. Split-KV: each context is cut into ``splits`` equal runs of
whole key tiles, sized on the device from the sequence's own length, each reduced by its own
program to a partial output and log-sum-exp, and a second kernel merges them; this keeps the GPU
busy at small batches, over short contexts as over long ones. A batch that fills the GPU unsplit
(one partition) writes its output directly, with no merge.

Owns the two Triton kernels and the launcher; semantics are
``kernels.reference.paged_decode_attention``, which the launcher falls back to where no kernel can
run. Does not own prefill attention (multi-token queries), nor the block tables themselves.
"""

from __future__ import annotations

import math

import torch

from kernels import reference
from kernels._common import (
    can_launch,
    check,
    check_dtype,
    check_last_contiguous,
    dot_in_fp32,
    next_pow2,
    pdl_args,
    split_count,
    tl,
    triton,
)

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _kv_offsets(table_ptr, b, st_b, kvh, t, tmask, d, dmask, sc_blk, sc_tok, sc_h, BS: tl.constexpr):
        """Cache offsets and mask of the ``(BLOCK_N, BLOCK_D)`` key (and value) tile of context positions ``t``."""
        blk = tl.load(table_ptr + b * st_b + t // BS, mask=tmask, other=0).to(tl.int64)
        kv_off = (blk * sc_blk + (t % BS) * sc_tok + kvh * sc_h)[:, None] + d[None, :]  # (BLOCK_N, BLOCK_D)
        return kv_off, tmask[:, None] & dmask[None, :]

    @triton.jit
    def _attend(q, k, v, tmask, m, lsum, acc, scale_log2, DOT_F32: tl.constexpr, PRECISION: tl.constexpr):
        """One key tile of online softmax: the running max ``m``, sum ``lsum`` and output ``acc``, updated."""
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # (BLOCK_G, BLOCK_N)
        scores = tl.where(tmask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, lsum, acc

    @triton.jit
    def _decode_split_kernel(
        q_ptr,  # (B, NH, HD) queries
        kc_ptr,  # (num_blocks, BS, NKV, HD) key cache
        vc_ptr,  # (num_blocks, BS, NKV, HD) value cache
        table_ptr,  # (B, max_blocks) block ids
        lens_ptr,  # (B,) context lengths
        part_out_ptr,  # (B, NH, S, HD) fp32 partial outputs, normalised within the partition
        part_lse_ptr,  # (B, NH, S) fp32 partial log2-sum-exp2, -inf for an empty partition
        out_ptr,  # (B, NH, HD) output (ONE only)
        sq_b,  # q strides: batch, head
        sq_h,
        so_b,  # out strides: batch, head (ONE only)
        so_h,
        sc_blk,  # cache strides: block, token-in-block, head
        sc_tok,
        sc_h,
        st_b,  # block table row stride
        scale_log2,  # softmax scale * log2(e)
        S,  # partitions per sequence
        G: tl.constexpr,  # query heads per KV head
        HD: tl.constexpr,  # head dim
        BS: tl.constexpr,  # tokens per cache block
        BLOCK_G: tl.constexpr,  # power of two >= max(G, 16): rows of the tl.dot
        BLOCK_D: tl.constexpr,  # power of two >= HD
        BLOCK_N: tl.constexpr,  # context tokens per loop step
        DOT_F32: tl.constexpr,  # widen tl.dot operands to fp32 (the CPU interpreter needs it)
        PRECISION: tl.constexpr,  # tl.dot input precision: "ieee" keeps fp32 inputs off tf32
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
        ONE: tl.constexpr = False,  # S is 1: write the output itself, no partials to merge
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        sp = tl.program_id(2)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gmask = g < G
        dmask = d < HD
        heads = kvh * G + g  # (BLOCK_G,) query heads of this group
        # NOTE(h7): the kernel this one waits for (the qkv GEMV's epilogue or rope_write_kv) writes q
        # and each row's newest key; lengths and block tables are staged by the host and older keys
        # were written by earlier steps, so no kernel of this step writes them (``kernels._common.pdl_enter``). They load before the
        # wait, their round trips to memory overlapping the kernels still running.
        seq_len = tl.load(lens_ptr + b)
        # this program's keys: one of S equal runs of whole tiles of this context (so a captured graph
        # splits a short context as finely as a long one, and no program walks it alone)
        part = tl.cdiv(tl.cdiv(seq_len, S), BLOCK_N) * BLOCK_N
        start = sp * part
        end = tl.minimum(start + part, seq_len)
        t = start + tl.arange(0, BLOCK_N)
        tmask = t < end
        # the first tile loads before the wait unless it holds the newest key (position seq_len - 1)
        early = start + BLOCK_N < seq_len
        kv_off, kvmask = _kv_offsets(table_ptr, b, st_b, kvh, t, tmask, d, dmask, sc_blk, sc_tok, sc_h, BS)
        k = tl.load(kc_ptr + kv_off, mask=kvmask & early, other=0.0)
        v = tl.load(vc_ptr + kv_off, mask=kvmask & early, other=0.0)
        pdl_enter(PDL)
        out_off = ((b * (S * G * tl.num_programs(1)) + heads * S + sp) * HD)[:, None] + d[None, :]
        lse_off = b * (S * G * tl.num_programs(1)) + heads * S + sp
        final_off = b * so_b + heads[:, None] * so_h + d[None, :]  # ONE: (BLOCK_G, BLOCK_D) into out
        if start >= end:
            if ONE:  # an empty context (a padding row): zeros, as the merge gives it
                empty = tl.zeros((BLOCK_G, BLOCK_D), out_ptr.dtype.element_ty)
                tl.store(out_ptr + final_off, empty, mask=gmask[:, None] & dmask)
            else:
                tl.store(part_out_ptr + out_off, tl.zeros((BLOCK_G, BLOCK_D), tl.float32), mask=gmask[:, None] & dmask)
                tl.store(part_lse_ptr + lse_off, tl.full((BLOCK_G,), float("-inf"), tl.float32), mask=gmask)
        else:
            if start + BLOCK_N >= seq_len:
                k = tl.load(kc_ptr + kv_off, mask=kvmask, other=0.0)
                v = tl.load(vc_ptr + kv_off, mask=kvmask, other=0.0)
            q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None] & dmask, other=0.0)
            if DOT_F32:
                q = q.to(tl.float32)
            m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
            lsum = tl.zeros((BLOCK_G,), tl.float32)
            acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
            m, lsum, acc = _attend(q, k, v, tmask, m, lsum, acc, scale_log2, DOT_F32, PRECISION)
            for t0 in range(start + BLOCK_N, end, BLOCK_N):
                t = t0 + tl.arange(0, BLOCK_N)
                tmask = t < end
                kv_off, kvmask = _kv_offsets(table_ptr, b, st_b, kvh, t, tmask, d, dmask, sc_blk, sc_tok, sc_h, BS)
                k = tl.load(kc_ptr + kv_off, mask=kvmask, other=0.0)
                v = tl.load(vc_ptr + kv_off, mask=kvmask, other=0.0)
                m, lsum, acc = _attend(q, k, v, tmask, m, lsum, acc, scale_log2, DOT_F32, PRECISION)
            if ONE:
                final = (acc / lsum[:, None]).to(out_ptr.dtype.element_ty)
                tl.store(out_ptr + final_off, final, mask=gmask[:, None] & dmask)
            else:
                tl.store(part_out_ptr + out_off, acc / lsum[:, None], mask=gmask[:, None] & dmask)
                tl.store(part_lse_ptr + lse_off, m + tl.log2(lsum), mask=gmask)

    @triton.jit
    def _decode_reduce_kernel(
        part_out_ptr,  # (B, NH, S, HD) fp32 partial outputs
        part_lse_ptr,  # (B, NH, S) fp32 partial log2-sum-exp2
        out_ptr,  # (B, NH, HD) output
        so_b,  # out strides: batch, head
        so_h,
        S,  # partitions per sequence
        NH: tl.constexpr,  # query heads
        HD: tl.constexpr,  # head dim
        BLOCK_S: tl.constexpr,  # power of two >= S
        BLOCK_D: tl.constexpr,  # power of two >= HD
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        pdl_enter(PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        smask = s < S
        base = (b * NH + h) * S
        lse = tl.load(part_lse_ptr + base + s, mask=smask, other=float("-inf"))
        gmax = tl.max(lse, axis=0)
        gmax = tl.where(gmax == float("-inf"), 0.0, gmax)  # an empty context: keep -inf - -inf (NaN) out
        w = tl.exp2(lse - gmax)  # (BLOCK_S,); zero for empty partitions
        o = tl.load(
            part_out_ptr + (base + s)[:, None] * HD + d[None, :], mask=smask[:, None] & (d < HD)[None, :], other=0.0
        )
        out = tl.sum(o * w[:, None], axis=0) / tl.maximum(tl.sum(w, axis=0), 1e-30)
        tl.store(out_ptr + b * so_b + h * so_h + d, out.to(out_ptr.dtype.element_ty), mask=d < HD)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    splits: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, nh, hd)`` attention of one query per sequence over its paged context.

    The grid depends only on tensor shapes (``block_tables`` width bounds the context), never on
    values, so the launch can be captured in a CUDA graph and replayed with new lengths and tables.

    Args:
        q: ``(B, nh, hd)`` queries.
        k_cache: ``(num_blocks, block_size, nkv, hd)``.
        v_cache: same shape and dtype as ``k_cache``.
        block_tables: ``(B, max_blocks)`` int32/int64 block ids.
        seq_lens: ``(B,)`` int32/int64 context lengths, at most ``max_blocks * block_size``.
        scale: softmax scale.
        splits: split-KV partitions per sequence and KV head; each takes an equal run of whole
            loop tiles of its sequence's context (sized on the device). By default enough for two
            programs per multiprocessor (``kernels._common.split_count``) and no more than the
            table's capacity has tiles.
        block_n: context tokens per loop step; default 64 on the GPU, 16 in the interpreter.
        out: ``(B, nh, hd)`` tensor in q's dtype to write into (a view, such as the leading rows
            of a mixed step's output, saves a copy); default a new one.

    Returns:
        ``out``, or a new ``(B, nh, hd)`` tensor in q's dtype.

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take.
    """
    check(q.dim() == 3 and k_cache.dim() == 4, "q must be (B, nh, hd), caches (num_blocks, block_size, nkv, hd)")
    B, nh, hd = q.shape
    _, bs, nkv, hd_c = k_cache.shape
    check(hd_c == hd, f"cache head dim {hd_c} != query head dim {hd}")
    check(nh % nkv == 0, f"query heads {nh} must be a multiple of KV heads {nkv}")
    check(v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype, "k_cache and v_cache must match")
    check(q.dtype == k_cache.dtype, f"q dtype {q.dtype} must match the cache's {k_cache.dtype}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == B, f"block_tables must be ({B}, max_blocks)")
    check(seq_lens.shape == (B,), f"seq_lens must be ({B},)")
    check_dtype("block_tables", block_tables, torch.int32, torch.int64)
    check_dtype("seq_lens", seq_lens, torch.int32, torch.int64)
    check_dtype("q", q, torch.float32, torch.float16, torch.bfloat16)
    if out is not None:
        check(out.shape == q.shape and out.dtype == q.dtype, f"out must be {tuple(q.shape)} {q.dtype}")
        check_last_contiguous("out", out)
    if not can_launch(q, k_cache, v_cache, block_tables, seq_lens):
        ref = reference.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
        return ref if out is None else out.copy_(ref)
    check_last_contiguous("q", q)
    check_last_contiguous("block_tables", block_tables)
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    G = nh // nkv
    BLOCK_N = block_n if block_n is not None else (16 if q.device.type == "cpu" else 64)
    max_ctx = block_tables.shape[1] * bs
    if splits is None:
        splits = min(split_count(B * nkv, q.device), -(-max_ctx // BLOCK_N))
    S = max(1, splits)
    if out is None:
        out = torch.empty_like(q)
    if B == 0:
        return out
    # NOTE(h7): one partition (a batch wide enough to fill the GPU, SmolLM2's 128 rows) needs no
    # merge: its program writes the output, and the step saves the merge kernel's launch a layer
    one = S == 1
    part_out = out if one else torch.empty((B, nh, S, hd), dtype=torch.float32, device=q.device)
    part_lse = out if one else torch.empty((B, nh, S), dtype=torch.float32, device=q.device)
    BLOCK_D = next_pow2(hd)
    _decode_split_kernel[(B, nkv, S)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        part_out,
        part_lse,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        scale * math.log2(math.e),
        S,
        G=G,
        HD=hd,
        BS=bs,
        BLOCK_G=max(16, next_pow2(G)),
        BLOCK_D=BLOCK_D,
        BLOCK_N=BLOCK_N,
        DOT_F32=dot_in_fp32() or q.dtype == torch.float32,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ONE=one,
        num_warps=4,
        **pdl_args(q),
    )
    if one:
        return out
    _decode_reduce_kernel[(B, nh)](
        part_out,
        part_lse,
        out,
        out.stride(0),
        out.stride(1),
        S,
        NH=nh,
        HD=hd,
        BLOCK_S=next_pow2(S),
        BLOCK_D=BLOCK_D,
        num_warps=4,
        **pdl_args(q),
    )
    return out
