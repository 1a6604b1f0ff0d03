# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Paged attention for prefill and chunked prefill: multi-token query chunks over their paged context.

The batch is flattened: sequence ``b`` runs ``query_lens[b]`` new tokens at rows
``query_starts[b]...`` of ``q``, the last of its ``seq_lens[b]`` context tokens; the first
``seq_lens[b] - query_lens[b]`` are its cached prefix (earlier chunks or a prefix-cache hit). Each
new token attends causally to the prefix and to the new tokens up to itself.

NOTE(h7): every key and value, the new tokens' included, is read from the paged cache through the
block table, instead of passing the chunk's K/V separately as vLLM's prefix-prefill and SGLang's
extend kernels do. The rotary write (``kernels.rope_kv``) has already put the rotated keys there
and hands no rotated copy back, so the cache is the only place they exist; one addressing path also
means one loop for prefix and chunk, split only where the causal mask starts to bite.

Work split (vLLM's unified-attention layout): a program owns one KV head and a tile of
``BLOCK_M`` rows of the chunk's ``(token, head of the group)`` pairs, flattened token-major: row
``R`` is query token ``R // G`` and query head ``R % G`` of the group, so each K/V tile is loaded
once for all ``G`` heads that share it. The rows are cut without regard to tokens, so a token's
heads may straddle two tiles and a GQA ratio of 3 pads nothing: SmolLM2's 128-token chunk is 384
rows, three tiles of 128, where whole tokens a tile (42) would need a fourth for its last two
tokens, walking the whole context for them. Keys below the tile's first position are visible to
every row and run without a mask; the diagonal tiles after them carry the causal mask. Softmax is
online (base 2, running max and sum in fp32), accumulation is fp32, the output is rounded once to
``q``'s dtype.

Split-KV: a tile's keys can be cut into ``splits`` runs, each reduced by its own program to a
partial output and log-sum-exp that a second kernel merges, as the decode kernel does. A chunk or a
prefix hit's tail behind a long context is one sequence with a few query tiles; unsplit, those few
programs would walk the whole context while the rest of the GPU idles.

Owns the Triton kernel and its launcher; semantics are ``kernels.reference.paged_prefill_attention``,
which the launcher falls back to where no kernel can run. Does not own one-token decode rows
(``kernels.paged_attention``), the cache write (``kernels.rope_kv``) nor block tables.
"""

from __future__ import annotations

import math

import torch

from kernels import reference
from kernels._common import (
    MAX_SPLITS,
    can_launch,
    check,
    check_dtype,
    check_last_contiguous,
    dot_in_fp32,
    next_pow2,
    num_sms,
    pdl_args,
    tl,
    triton,
)

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _prefill_tile(
        acc,  # (BLOCK_M, HD) fp32 running numerator
        m,  # (BLOCK_M,) fp32 running max (log2 domain)
        lsum,  # (BLOCK_M,) fp32 running denominator
        q,  # (BLOCK_M, HD) query tile
        pos,  # (BLOCK_M,) each row's position in its sequence
        kc_ptr,  # key cache base
        vc_ptr,  # value cache base
        table_row_ptr,  # this sequence's block-table row
        kvh,  # KV head of the program
        sc_blk,  # cache strides: block, token-in-block, head
        sc_tok,
        sc_h,
        lo,  # first key of the range (a multiple of BLOCK_N)
        hi,  # one past the last key of the range
        scale_log2,  # softmax scale * log2(e)
        HD: tl.constexpr,
        BS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,  # mask keys past each row's position (and past hi)
        DOT_F32: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        d = tl.arange(0, HD)
        for t0 in range(lo, hi, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
            if CAUSAL:
                tmask = t < hi
                blk = tl.load(table_row_ptr + t // BS, mask=tmask, other=0).to(tl.int64)
            else:
                blk = tl.load(table_row_ptr + t // BS).to(tl.int64)
            tok_off = blk * sc_blk + (t % BS) * sc_tok + kvh * sc_h  # (BLOCK_N,)
            if CAUSAL:
                kt = tl.load(kc_ptr + tok_off[None, :] + d[:, None], mask=tmask[None, :], other=0.0)  # (HD, BLOCK_N)
                v = tl.load(vc_ptr + tok_off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)  # (BLOCK_N, HD)
            else:
                kt = tl.load(kc_ptr + tok_off[None, :] + d[:, None])
                v = tl.load(vc_ptr + tok_off[:, None] + d[None, :])
            if DOT_F32:
                kt = kt.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, kt, input_precision=PRECISION) * scale_log2  # (BLOCK_M, BLOCK_N)
            if CAUSAL:
                s = tl.where(t[None, :] <= pos[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            # a row with no visible key yet (only in a split's causal range) keeps -inf - -inf out
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_use)
            p = tl.exp2(s - m_use[:, None])
            lsum = lsum * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m = m_new
        return acc, m, lsum

    @triton.jit
    def _prefill_kernel(
        q_ptr,  # (N, NH, HD) queries of all new tokens
        kc_ptr,  # (num_blocks, BS, NKV, HD) key cache, the new tokens' keys already written
        vc_ptr,  # (num_blocks, BS, NKV, HD) value cache
        out_ptr,  # (N, NH, HD) output; only the rows of the listed sequences are written
        part_out_ptr,  # (S, N, NH, HD) fp32 per-split outputs, normalised within the split (SPLIT only)
        part_lse_ptr,  # (S, N, NH) fp32 per-split log2-sum-exp2, -inf where a row saw no key (SPLIT only)
        table_ptr,  # (B, max_blocks) block ids
        qstart_ptr,  # (B,) first row of each sequence's queries
        qlen_ptr,  # (B,) new tokens of each sequence
        slen_ptr,  # (B,) context length of each sequence, new tokens included
        sq_n,  # q strides: token, head
        sq_h,
        so_n,  # out strides: token, head
        so_h,
        sc_blk,  # cache strides: block, token-in-block, head
        sc_tok,
        sc_h,
        st_b,  # block table row stride
        scale_log2,  # softmax scale * log2(e)
        N_ROWS,  # rows of q (the partials' second dim)
        S,  # key splits per query tile
        G: tl.constexpr,  # query heads per KV head
        HD: tl.constexpr,  # head dim (a power of two)
        BS: tl.constexpr,  # tokens per cache block
        SPLIT: tl.constexpr,  # S > 1: write partials for _prefill_merge_kernel instead of out
        BLOCK_M: tl.constexpr,  # (token, head) rows per program, a power of two
        BLOCK_N: tl.constexpr,  # keys per loop step
        DOT_F32: tl.constexpr,  # widen tl.dot operands to fp32 (the CPU interpreter needs it)
        PRECISION: tl.constexpr,  # tl.dot input precision: "ieee" keeps fp32 inputs off tf32
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        pdl_enter(PDL)
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        if SPLIT:
            row0 = (tl.program_id(2) // S) * BLOCK_M  # the tile's first (token, head) row, within the chunk
            sp = tl.program_id(2) % S
        else:
            row0 = tl.program_id(2) * BLOCK_M
        m0 = row0 // G  # the tile's first query token (its heads may start in the tile before)
        q_len = tl.load(qlen_ptr + b)
        if m0 < q_len:
            q_start = tl.load(qstart_ptr + b).to(tl.int64)
            prefix = tl.load(slen_ptr + b) - q_len
            r = row0 + tl.arange(0, BLOCK_M)
            tok = r // G  # (BLOCK_M,) query token of each row, within the chunk
            head = kvh * G + r % G  # (BLOCK_M,) query head of each row
            rmask = tok < q_len
            d = tl.arange(0, HD)
            q = tl.load(
                q_ptr + ((q_start + tok) * sq_n + head * sq_h)[:, None] + d[None, :], mask=rmask[:, None], other=0.0
            )
            if DOT_F32:
                q = q.to(tl.float32)
            pos = prefix + tok  # padding rows sit past the last token: never below a real key
            acc = tl.zeros((BLOCK_M, HD), tl.float32)
            m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            lsum = tl.zeros((BLOCK_M,), tl.float32)
            table_row = table_ptr + b * st_b
            # keys up to the tile's first position are seen by every row: whole tiles of them need no mask
            full_end = ((prefix + m0 + 1) // BLOCK_N) * BLOCK_N
            kv_end = prefix + tl.minimum((row0 + BLOCK_M - 1) // G + 1, q_len)
            # this program's keys [lo, hi): with SPLIT, one of S equal runs of whole key tiles, sized by
            # the tile's own context on the device (so a captured graph splits every context evenly)
            if SPLIT:
                part = tl.cdiv(tl.cdiv(kv_end, S), BLOCK_N) * BLOCK_N
                lo = sp * part
                hi = tl.minimum(lo + part, kv_end)
            else:
                lo = 0
                hi = kv_end
            mid = tl.maximum(lo, tl.minimum(full_end, hi))  # [lo, mid) unmasked, [mid, hi) causal
            acc, m, lsum = _prefill_tile(
                acc,
                m,
                lsum,
                q,
                pos,
                kc_ptr,
                vc_ptr,
                table_row,
                kvh,
                sc_blk,
                sc_tok,
                sc_h,
                lo,
                mid,
                scale_log2,
                HD,
                BS,
                BLOCK_N,
                False,
                DOT_F32,
                PRECISION,
            )
            acc, m, lsum = _prefill_tile(
                acc,
                m,
                lsum,
                q,
                pos,
                kc_ptr,
                vc_ptr,
                table_row,
                kvh,
                sc_blk,
                sc_tok,
                sc_h,
                mid,
                hi,
                scale_log2,
                HD,
                BS,
                BLOCK_N,
                True,
                DOT_F32,
                PRECISION,
            )
            if SPLIT:
                seen = lsum > 0.0
                lsafe = tl.where(seen, lsum, 1.0)
                prow = (sp * N_ROWS + q_start + tok) * (G * tl.num_programs(1)) + head  # (BLOCK_M,)
                tl.store(part_out_ptr + prow[:, None] * HD + d[None, :], acc / lsafe[:, None], mask=rmask[:, None])
                tl.store(part_lse_ptr + prow, tl.where(seen, m + tl.log2(lsafe), float("-inf")), mask=rmask)
            else:
                out = acc / lsum[:, None]
                o_ptrs = out_ptr + ((q_start + tok) * so_n + head * so_h)[:, None] + d[None, :]
                tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=rmask[:, None])

    @triton.jit
    def _prefill_merge_kernel(
        part_out_ptr,  # (S, N, NH, HD) fp32 per-split outputs
        part_lse_ptr,  # (S, N, NH) fp32 per-split log2-sum-exp2
        out_ptr,  # (N, NH, HD) output
        qstart_ptr,  # (B,) first row of each sequence's queries
        qlen_ptr,  # (B,) new tokens of each sequence
        so_n,  # out strides: token, head
        so_h,
        N_ROWS,  # rows of q
        S,  # splits
        B,  # sequences
        NH: tl.constexpr,  # query heads
        HD: tl.constexpr,  # head dim
        BLOCK_S: tl.constexpr,  # power of two >= S
        BLOCK_H: tl.constexpr,  # heads per program (a power of two)
        BLOCK_B: tl.constexpr,  # power of two >= B
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        """One row of q, BLOCK_H heads: the splits' outputs weighted by their sum-exp, all splits in one load.

        NOTE(h7): a loop over the splits (an L2 round trip a turn, twice over) took 10.7 us a launch
        on the H100 for a 16-row step with 32 splits (SmolLM2, a prefix hit's tail), and the largest
        share of that step's device time in a profile: more than the attention itself. Rows that
        are no sequence's (decode rows, padding) are left alone.
        """
        pdl_enter(PDL)
        row = tl.program_id(0).to(tl.int64)
        bs = tl.arange(0, BLOCK_B)
        qs = tl.load(qstart_ptr + bs, mask=bs < B, other=0)
        ql = tl.load(qlen_ptr + bs, mask=bs < B, other=0)
        if tl.sum(((row >= qs) & (row < qs + ql)).to(tl.int32), axis=0) > 0:
            h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
            sp = tl.arange(0, BLOCK_S)
            d = tl.arange(0, HD)
            m2 = (sp < S)[:, None] & (h < NH)[None, :]  # (BLOCK_S, BLOCK_H)
            off = (sp[:, None] * N_ROWS + row) * NH + h[None, :]  # (BLOCK_S, BLOCK_H)
            lse = tl.load(part_lse_ptr + off, mask=m2, other=float("-inf"))
            gmax = tl.max(lse, axis=0)  # (BLOCK_H,)
            gmax = tl.where(gmax == float("-inf"), 0.0, gmax)  # no key seen: keep -inf - -inf (NaN) out
            w = tl.exp2(lse - gmax[None, :])  # (BLOCK_S, BLOCK_H); zero for empty splits
            o = tl.load(part_out_ptr + off[:, :, None] * HD + d[None, None, :], mask=m2[:, :, None], other=0.0)
            acc = tl.sum(o * w[:, :, None], axis=0)  # (BLOCK_H, HD)
            out = acc / tl.maximum(tl.sum(w, axis=0), 1e-30)[:, None]
            o_ptrs = out_ptr + row * so_n + (h * so_h)[:, None] + d[None, :]
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=(h < NH)[:, None])


def prefill_kernel_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel can run on these tensors here (device, interpreter, head dim); else use SDPA."""
    hd = q.shape[-1]
    return can_launch(q, k_cache) and hd >= 16 and hd == next_pow2(hd)


def _default_blocks(row_bytes: int, device: torch.device) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` for one head's row of ``row_bytes`` (head dim x element size)."""
    if device.type == "cpu":  # the interpreter: small tiles keep it quick and cut tokens' heads across tiles
        return 16, 16, 1, 1
    # NOTE(h7): 128 rows x 64 keys at 8 warps and 5 stages: the key loop waits on its block-table
    # load before each tile's keys, and below 5 stages Triton's pipeliner then issues a tile's
    # keys only one iteration ahead and waits on all of them at the top of the next; at 4 warps
    # 5 stages spill. A 128-token chunk behind 7,552 keys, its caches out of L2 as a step's layers
    # are (us a launch, ``bench.probe_prefill_splits``, H100, 2026-12-07): SmolLM2 16.4 against
    # 21.0 for 4 warps and 3 stages with whole tokens a tile, the 8B 54.6 against 66.2 (64 x 64,
    # 4 warps, 3 stages); a 4,096-token prompt 2-4 % faster. One such program fills a
    # multiprocessor's registers (~160-200 a thread), which ``default_splits`` counts on.
    if row_bytes <= 256:  # bf16 up to head dim 128: 132 KB of shared memory at 128
        return 128, 64, 8, 5
    # NOTE(h7): wider rows (bf16 head dim 256, fp32 128) would take 263 KB of shared memory at 5
    # stages, past sm_90's 227 KB: 64 rows and 3 stages take 165 KB for bf16 256, 115 KB for fp32
    # 128 (``tests.kernels.sm90_build``). Built and tested, not timed.
    return 64, 64, 8, 3


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    splits: int | None = None,
    split_query_len: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context (prefix, then the chunk).

    Args:
        q: ``(N, nh, hd)`` queries of the flattened batch (may be a strided view, last dim contiguous).
        k_cache: ``(num_blocks, block_size, nkv, hd)``, already holding the new tokens' keys.
        v_cache: same shape and dtype as ``k_cache``.
        block_tables: ``(B, max_blocks)`` int32/int64 block ids.
        query_starts: ``(B,)`` int first row in ``q`` of each sequence's new tokens (rows of
            different sequences need not be adjacent: decode rows may sit between them).
        query_lens: ``(B,)`` int new tokens per sequence, each >= 1.
        seq_lens: ``(B,)`` int context lengths (cached prefix + new tokens), each >= ``query_lens``.
        max_query_len: a bound on ``query_lens`` (sizes the grid; a host int, so no device sync).
        scale: softmax scale.
        out: ``(N, nh, hd)`` tensor to write the sequences' rows into; other rows are left alone.
            Default: a new zero tensor.
        block_m: rows (query tokens x group heads) per program; default by head dim and device.
        block_n: keys per loop step; default 64 on the GPU, 16 in the interpreter.
        splits: programs that share one query tile's keys (split-KV, merged by a second kernel);
            default as many as keep one sequence of ``split_query_len`` tokens within two programs
            per multiprocessor (``default_splits``).
        split_query_len: the chunk the default split count is sized for; default
            ``max_query_len``. A captured graph sizes its grid for any chunk of its T tokens; the
            one replayed by steps whose prompt tokens fit the engine's chunk cap passes that cap,
            so such a chunk's keys are split as if the grid were its own.

    Returns:
        ``out``.

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take.
    """
    check(q.dim() == 3 and k_cache.dim() == 4, "q must be (N, nh, hd), caches (num_blocks, block_size, nkv, hd)")
    N, nh, hd = q.shape
    _, bs, nkv, hd_c = k_cache.shape
    B = query_starts.shape[0]
    check(hd_c == hd, f"cache head dim {hd_c} != query head dim {hd}")
    check(nh % nkv == 0, f"query heads {nh} must be a multiple of KV heads {nkv}")
    check(v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype, "k_cache and v_cache must match")
    check(q.dtype == k_cache.dtype, f"q dtype {q.dtype} must match the cache's {k_cache.dtype}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == B, f"block_tables must be ({B}, max_blocks)")
    check(query_starts.shape == (B,) and query_lens.shape == (B,), f"query_starts and query_lens must be ({B},)")
    check(seq_lens.shape == (B,), f"seq_lens must be ({B},)")
    for name, t in (("block_tables", block_tables), ("query_starts", query_starts), ("query_lens", query_lens)):
        check_dtype(name, t, torch.int32, torch.int64)
    check_dtype("seq_lens", seq_lens, torch.int32, torch.int64)
    check_dtype("q", q, torch.float32, torch.float16, torch.bfloat16)
    if out is None:
        out = torch.zeros((N, nh, hd), dtype=q.dtype, device=q.device)
    check(out.shape == q.shape and out.dtype == q.dtype, f"out must be {tuple(q.shape)} {q.dtype}")
    if not can_launch(q, k_cache, v_cache, block_tables, query_starts, query_lens, seq_lens, out):
        return reference.paged_prefill_attention(
            q, k_cache, v_cache, block_tables, query_starts, query_lens, seq_lens, scale, out=out
        )
    check(hd >= 16 and hd == next_pow2(hd), f"head dim {hd} must be a power of two >= 16")
    check_last_contiguous("q", q)
    check_last_contiguous("out", out)
    check_last_contiguous("block_tables", block_tables)
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    if B == 0 or max_query_len <= 0:
        return out
    G = nh // nkv
    BLOCK_M, BLOCK_N, num_warps, num_stages = _default_blocks(hd * q.element_size(), q.device)
    if block_m is not None:
        BLOCK_M = max(16, next_pow2(block_m))
    if block_n is not None:
        BLOCK_N = next_pow2(max(16, block_n))
    tiles = -(-max_query_len * G // BLOCK_M)
    if splits is None:
        # the partials hold every row of q per split: a few decode rows beside a short chunk
        # (an eager mixed step) must not make them large
        split_len = max_query_len if split_query_len is None else min(split_query_len, max_query_len)
        split_tiles = -(-split_len * G // BLOCK_M)
        S = min(default_splits(nkv, split_tiles, q.device), max(1, MAX_PARTIAL_BYTES // (N * nh * hd * 4)))
    else:
        S = max(1, splits)
    part_out = part_lse = out  # placeholders without splits: never touched
    if S > 1:
        part_out = torch.empty((S, N, nh, hd), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((S, N, nh), dtype=torch.float32, device=q.device)
    _prefill_kernel[(B, nkv, tiles * S)](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        block_tables,
        query_starts,
        query_lens,
        seq_lens,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        scale * math.log2(math.e),
        N,
        S,
        G=G,
        HD=hd,
        BS=bs,
        SPLIT=S > 1,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        DOT_F32=dot_in_fp32(),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_args(q),
    )
    if S > 1:
        block_s = next_pow2(S)
        # NOTE(h7): one warp and a (BLOCK_S, BLOCK_H, HD) tile of ~2,048 fp32 values (64 a thread) won
        # on the H100 over SmolLM2's and the 8B's heads at 16-512 rows and 3-32 splits: 1.9-3.2 us,
        # against 2.8-15.1 us with 4 warps and 4,096 values, and 5.1-20.7 us for the loop it replaced
        block_h = max(1, min(next_pow2(nh), 2048 // (block_s * hd)))
        _prefill_merge_kernel[(N, -(-nh // block_h))](
            part_out,
            part_lse,
            out,
            query_starts,
            query_lens,
            out.stride(0),
            out.stride(1),
            N,
            S,
            B,
            NH=nh,
            HD=hd,
            BLOCK_S=block_s,
            BLOCK_H=block_h,
            BLOCK_B=next_pow2(B),
            num_warps=1,
            **pdl_args(q),
        )
    return out


MAX_PARTIAL_BYTES = 64 << 20
"""The default split count keeps the fp32 partial outputs under this."""


def default_splits(num_kv_heads: int, query_tiles: int, device: torch.device) -> int:
    """Key splits per query tile: as many as keep one sequence's tiles within one program per multiprocessor.

    NOTE(h7): counted for one sequence although the grid has a column per sequence slot: the step
    graphs size the grid for 8 slots that are mostly idle, and a chunk or a prefix hit's tail
    behind a long context is one sequence whose few tiles would each walk the whole context (a
    16-token tail over 4k cached tokens: one program per KV head). A long prompt has tiles enough
    and gets no split. Bounded by ``kernels._common.MAX_SPLITS``.
    NOTE(h7): one program a multiprocessor, as many as ``_default_blocks``' tile leaves room for;
    rounded down, unlike the decode kernel's ``split_count``: a split more than fits starts a
    second wave that a few programs hold. A 128-token chunk behind 7,680 tokens in a 256-row step
    (``bench.probe_prefill_splits --grid pad``, H100, 2026-12-07, 8 warps and 5 stages), us a
    launch: SmolLM2's 9 tiles 16.4 at 14 splits (126 programs), 20.1 at 9, 23.8 at 18 (and its
    12 tiles before its rows were cut across tokens 17.9 at 11, 24.0 at 22); the 8B's 32 tiles
    55.3 at 4 (128 programs), 64.0 at 8.
    """
    return max(1, min(MAX_SPLITS, num_sms(device) // max(1, num_kv_heads * query_tiles)))
