# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Weight-only int4 matmul ``y = x @ W.T``, group-wise asymmetric: the kernel and its launcher.

The int8 formats' kernel (``kernels.quant_matmul``) has the same two paths: a GEMV for few rows
(decode), whose inner loop is ``kernels.int4_gemv``'s (fp32 or half2 FMAs), and a tiled path
that dequantizes a tile into ``tl.dot``. Both split K when the grid would not fill the GPU and
take the same epilogues (``glu``, ``rope``; ``kernels._matmul_launch``). The half2 GEMV can read x
as the pairs a kernel before it wrote (``int4_gemv.XPairs``, ``pairs_for``). Group 32 is what GGUF
Q4_1 blocks repack into (``kernels.gguf_blocks``). The layout and the semantics are
``kernels.reference``'s (``quantize_int4``, ``int4_matmul``); the launcher falls back to those
where no kernel can run. Launch configs live in ``kernels._matmul_config``. Does not own which
layers are quantized (``selfhost.models``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels import int4_gemv, reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, interpreting, tl, triton
from kernels._matmul_config import GEMV_MAX_ROWS, Config, config_for
from kernels._matmul_launch import check_epilogue, check_group, check_step, check_x, finish_unfused, launch

if TYPE_CHECKING:
    from kernels.int4_gemv import XPairs
    from kernels.rope_kv import RopeKV

__all__ = ["int4_matmul", "pairs_for"]

if triton is not None:
    from kernels._common import pdl_enter_after_wait
    from kernels._matmul_launch import _program_tile, _store_tile
    from kernels.int4_gemv import (
        _byte_tile,
        _group_scales,
        _h2_fold,
        _h2_sums,
        _int4_gemv_step,
        _int4_h2_step,
        _pair_products,
        _pair_words,
        _word_tile,
        _x_quads,
    )
    from kernels.rope_kv import _rope_rows

    @triton.jit
    def _int4_kernel(
        x_ptr,  # (M, K) activations
        w_ptr,  # (N, K/2) uint8: column j low nibble, column j + K/2 high nibble
        s_ptr,  # (N, K/G) scales
        z_ptr,  # (N, K/G) zeros: w = (q - 8) * scale + zero
        pa_ptr,  # XP: x as int4_gemv.XPairs, (M, K/4) int32 (unused without XP)
        pb_ptr,  # (M, K/4) int32
        xs_ptr,  # (M, K/G) fp32 group sums
        out_ptr,  # (M, N) output; (M, N / 2) with GLU, (M, QN) with ROPE
        part_ptr,  # (NSPLIT, M, N) fp32 split-K partials (unused without split-K)
        cnt_ptr,  # per-tile arrival counters, zero between launches
        M,  # rows of x
        N,  # output columns
        K2,  # K / 2: packed bytes per row
        K_SPLIT,  # bytes per split (a multiple of BLOCK_K)
        NSPLIT,  # programs along K per tile
        sx_m,  # row stride of x
        sw_n,  # row stride of w
        ss_n,  # row stride of scales and zeros
        so_m,  # row stride of out
        pos_ptr,  # rotary epilogue (kernels._matmul_launch; unused without ROPE): (M,) positions
        slot_ptr,  # (M,) cache slots, negative: no write
        cos_ptr,  # (P, >= ROPE) fp32 tables
        sin_ptr,
        kc_ptr,  # (num_blocks, block_size, nkv, hd) caches
        vc_ptr,
        s_cos,  # row stride of the tables
        QN,  # query columns of [q; k; v]
        KVN,  # key columns (= value columns)
        G: tl.constexpr,  # group size (columns per scale)
        GEMV: tl.constexpr,  # FMA path (one row of x per program) instead of tl.dot
        GLU: tl.constexpr,  # w is [gate; up]: write silu(x @ gate.T) * (x @ up.T) (_tile_rows)
        ROPE: tl.constexpr,  # half the head dim: w is [q; k; v], write rotary q and the caches; 0: no rotary
        BLOCK_M: tl.constexpr,  # rows per program on the tiled path
        BLOCK_N: tl.constexpr,  # output columns per program
        BLOCK_K: tl.constexpr,  # bytes per loop step: GEMV a multiple of G, tiled a divisor of G
        DOT_F32: tl.constexpr,  # widen tl.dot operands to fp32
        EXACT: tl.constexpr = False,  # GEMV: fp32 activations, keep every bit of sum(q x)
        ASM: tl.constexpr = False,  # GEMV: unpack the nibbles with inline PTX (compiled kernels only)
        H2: tl.constexpr = False,  # GEMV: products on half2 FMAs (_h2_dot; compiled kernels only, not EXACT)
        PREFETCH: tl.constexpr = False,  # GEMV: load the first weight tile before the PDL wait (Config.prefetch)
        AHEAD: tl.constexpr = False,  # half2 GEMV: scales and x a step ahead (Config.ahead)
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
        R: tl.constexpr = 1,  # half2 GEMV: runs of a group a thread holds (kernels.int4_gemv._word_cols)
        XP: tl.constexpr = False,  # half2 GEMV: x from pa, pb, xs (int4_gemv.XPairs) instead of x_ptr
    ):
        rm, mmask, rn, nmask = _program_tile(M, N, BLOCK_M, BLOCK_N, GEMV, GLU, ROPE)
        pos, slot = _rope_rows(pos_ptr, slot_ptr, rm, mmask, ROPE)  # before the PDL wait
        ks = tl.program_id(2)
        HI_GROUPS = K2 // G  # group index offset of the high half
        if GEMV:
            NG: tl.constexpr = BLOCK_K // G  # groups per step and half
            x_row = x_ptr + rm * sx_m
            k_lo = ks * K_SPLIT
            k_end = k_lo + K_SPLIT
            acc2 = tl.zeros((BLOCK_N, NG), tl.float32)
            if H2:
                # NOTE(h7): PREFETCH here keeps one tile in flight: the first loads before the PDL wait,
                # and each step loads the next before its products (one more tile of registers, no
                # peeled step). On the H100's 8B shapes, each with its best tile: qkv 9.7 -> 8.8 us,
                # o 7.7 -> 6.8, down 17.4 -> 16.6; gate_up 25.3 -> 26.1 and the LM head 102.3 -> 104.8
                # NOTE(h7): AHEAD does for the step's scales and x what PREFETCH does for its weights:
                # each was a round trip inside its step (scales from DRAM, x from L2). On the H100's
                # 8B qkv at its tile, alone, 8.5 -> 6.8 us (254 registers a thread against 127);
                # the step's gain is in kernels._matmul_config's int4 NOTE
                w32 = w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None] * (sw_n // 4)
                BLOCK_W: tl.constexpr = BLOCK_K // 4
                pa_row = pa_ptr + tl.program_id(0) * (K2 // 2)  # XP: this row's words and sums
                pb_row = pb_ptr + tl.program_id(0) * (K2 // 2)
                xs_row = xs_ptr + tl.program_id(0) * (2 * K2 // G)
                # weights and scales are no kernel's output: the first step's load before the wait
                if PREFETCH:
                    wq = _word_tile(w32, k_lo, k_end, K2, nmask, BLOCK_K, G // 4, R)
                if AHEAD:
                    s0, z0, s1, z1 = _group_scales(s_ptr, z_ptr, rn, ss_n, k_lo, nmask, K2, NG, G)
                pdl_enter_after_wait(PDL)
                if AHEAD:
                    if XP:
                        xa, xb, xc, xd, xl, xh = _pair_words(pa_row, pb_row, xs_row, k_lo, k_end, K2, BLOCK_W, G)
                    else:
                        a0, a1, a2, a3 = _x_quads(x_row, k_lo, k_end, K2, BLOCK_W)
                        b0, b1, b2, b3 = _x_quads(x_row + K2, k_lo, k_end, K2, BLOCK_W)
                for k0 in range(k_lo, k_end, BLOCK_K):
                    if PREFETCH:
                        cw = wq
                        wq = _word_tile(w32, k0 + BLOCK_K, k_end, K2, nmask, BLOCK_K, G // 4, R)
                    else:
                        cw = _word_tile(w32, k0, k_end, K2, nmask, BLOCK_K, G // 4, R)
                    if XP:  # x's words and sums as loaded (int4_gemv.XPairs), a step ahead with AHEAD
                        if AHEAD:
                            cs0, cz0, cs1, cz1 = s0, z0, s1, z1
                            ca, cb, cc, cd, cl, ch = xa, xb, xc, xd, xl, xh
                            nxt = k0 + BLOCK_K
                            s0, z0, s1, z1 = _group_scales(
                                s_ptr, z_ptr, rn, ss_n, nxt, nmask & (nxt < k_end), K2, NG, G
                            )
                            xa, xb, xc, xd, xl, xh = _pair_words(pa_row, pb_row, xs_row, nxt, k_end, K2, BLOCK_W, G)
                        else:
                            ca, cb, cc, cd, cl, ch = _pair_words(pa_row, pb_row, xs_row, k0, k_end, K2, BLOCK_W, G)
                            cs0, cz0, cs1, cz1 = _group_scales(s_ptr, z_ptr, rn, ss_n, k0, nmask, K2, NG, G)
                        t_lo, t_hi = _pair_products(cw, ca, cb, cc, cd, G, R)
                        acc2 = _h2_fold(acc2, t_lo, t_hi, cl, ch, cs0, cz0, cs1, cz1)
                    elif AHEAD:  # this step's scales and x were loaded a step ago; load the next step's
                        cs0, cz0, cs1, cz1 = s0, z0, s1, z1
                        ca0, ca1, ca2, ca3, cb0, cb1, cb2, cb3 = a0, a1, a2, a3, b0, b1, b2, b3
                        nxt = k0 + BLOCK_K
                        s0, z0, s1, z1 = _group_scales(s_ptr, z_ptr, rn, ss_n, nxt, nmask & (nxt < k_end), K2, NG, G)
                        a0, a1, a2, a3 = _x_quads(x_row, nxt, k_end, K2, BLOCK_W)
                        b0, b1, b2, b3 = _x_quads(x_row + K2, nxt, k_end, K2, BLOCK_W)
                        t_lo, t_hi, xs_lo, xs_hi = _h2_sums(cw, ca0, ca1, ca2, ca3, cb0, cb1, cb2, cb3, G, R)
                        acc2 = _h2_fold(acc2, t_lo, t_hi, xs_lo, xs_hi, cs0, cz0, cs1, cz1)
                    else:
                        acc2 = _int4_h2_step(acc2, cw, k0, k_end, x_row, K2, s_ptr, z_ptr, rn, ss_n, nmask, G, R)
            else:
                # NOTE(h7): PREFETCH peels the first step, which doubled this loop's registers (16 x 512
                # bytes, 2 warps: 127 -> 254 a thread, 168 -> 255 with SiLU-and-mul on the loads; ptxas):
                # on the H100's 8B shapes qkv 10.2 -> 9.2 us and
                # o 7.5 -> 7.1, but gate_up 27.0 -> 30.0, down 19.7 -> 20.6, LM head 104.8 -> 120.2
                w_ptrs = w_ptr + rn[:, None] * sw_n
                if PREFETCH:  # see _dense_gemv_kernel
                    b = _byte_tile(w_ptrs, k_lo, K2, nmask, BLOCK_K)
                pdl_enter_after_wait(PDL)
                if PREFETCH:
                    acc2 = _int4_gemv_step(acc2, b, k_lo, x_row, K2, s_ptr, z_ptr, rn, ss_n, nmask, G, EXACT, ASM)
                for k0 in range(k_lo + BLOCK_K * PREFETCH, k_end, BLOCK_K):
                    b = _byte_tile(w_ptrs, k0, K2, nmask, BLOCK_K)
                    acc2 = _int4_gemv_step(acc2, b, k0, x_row, K2, s_ptr, z_ptr, rn, ss_n, nmask, G, EXACT, ASM)
            acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
        else:
            pdl_enter_after_wait(PDL)
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < K2
                b = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                b = b.to(tl.int32)
                g_off = rn * ss_n + k0 // G  # one group per step and half: BLOCK_K divides G
                # NOTE(h7): a last split's steps past K read no scale: one out of bounds may hold a
                # NaN, and NaN * (x = 0) poisons the whole row (seen on the H100 with GGUF weights)
                gmask = nmask & (k0 < K2)
                s_lo = tl.load(s_ptr + g_off, mask=gmask, other=0.0).to(tl.float32)[:, None]
                z_lo = tl.load(z_ptr + g_off, mask=gmask, other=0.0).to(tl.float32)[:, None]
                s_hi = tl.load(s_ptr + g_off + HI_GROUPS, mask=gmask, other=0.0).to(tl.float32)[:, None]
                z_hi = tl.load(z_ptr + g_off + HI_GROUPS, mask=gmask, other=0.0).to(tl.float32)[:, None]
                xmask = mmask[:, None] & kmask[None, :]
                x_lo = tl.load(x_ptr + rm[:, None] * sx_m + rk[None, :], mask=xmask, other=0.0)
                x_hi = tl.load(x_ptr + rm[:, None] * sx_m + K2 + rk[None, :], mask=xmask, other=0.0)
                # the nibble in mantissa bits 19-22 of 1.0: f = 1 + q / 16, so w = 16 s f + z - 24 s (no I2F)
                f_lo = (((b << 19) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
                f_hi = (((b << 15) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
                w_lo = f_lo * (16.0 * s_lo) + (z_lo - 24.0 * s_lo)  # (BLOCK_N, BLOCK_K)
                w_hi = f_hi * (16.0 * s_hi) + (z_hi - 24.0 * s_hi)
                if DOT_F32:
                    acc += tl.dot(x_lo.to(tl.float32), tl.trans(w_lo), input_precision="ieee")  # not tf32
                    acc += tl.dot(x_hi.to(tl.float32), tl.trans(w_hi), input_precision="ieee")
                else:
                    acc += tl.dot(x_lo, tl.trans(w_lo.to(x_lo.dtype)))
                    acc += tl.dot(x_hi, tl.trans(w_hi.to(x_hi.dtype)))
        _store_tile(
            acc, rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, M * N, cnt_ptr, N, NSPLIT, GLU,
            pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE,
        )  # fmt: skip


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    config: Config | None = None,
    *,
    glu: bool = False,
    rope: RopeKV | None = None,
    pairs: XPairs | None = None,
) -> torch.Tensor:
    """``(M, K) @ W.T -> (M, N)`` with a group-wise int4 weight in the ``reference.quantize_int4`` layout.

    Scales and zeros may be any float dtype (bf16 from ``quantize_int4``; fp16 scales and fp32
    zeros from GGUF Q4_1 blocks). With ``glu``, W is ``[gate; up]`` and the result
    ``silu_and_mul(x @ W.T)``, ``(M, N/2)``; with ``rope``, W is ``[q; k; v]`` and the result the
    rotated queries (``RopeKV``). ``pairs``: x once more, as ``int4_gemv.XPairs`` (same values), which
    the half2 GEMV reads instead of x (``pairs_for``); other paths read x.

    Raises:
        ValueError: shapes, dtypes, strides or a group size the kernel cannot take.
    """
    check(packed.dim() == 2, f"packed must be (N, K/2), got {tuple(packed.shape)}")
    n, k2 = packed.shape
    k = 2 * k2
    check_x(x, k)
    check_dtype("packed", packed, torch.uint8)
    check_group(group_size)
    check(k2 % group_size == 0, f"K ({k}) must be a multiple of 2 * group_size ({2 * group_size})")
    check(
        scales.shape == (n, k // group_size) and zeros.shape == scales.shape,
        f"scales and zeros must be ({n}, {k // group_size})",
    )
    check_epilogue(n, glu, rope)
    if pairs is not None:
        m = x.shape[0]
        check(
            pairs.pa.shape == pairs.pb.shape == (m, k // 4)
            and pairs.sums.shape == (m, k // group_size)
            and pairs.group_size == group_size,
            f"pairs must be ({m}, {k // 4}) words and ({m}, {k // group_size}) sums of group {group_size}",
        )
    if not can_launch(x, packed, scales, zeros):
        return finish_unfused(reference.int4_matmul(x, packed, scales, zeros, group_size), glu, rope)
    check_last_contiguous("x", x)
    check(
        packed.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous(),
        "packed, scales, zeros must be contiguous",
    )
    cfg = config or config_for("int4", x.shape[0], n, k, k2, group_size, x.device)
    check_step(group_size, cfg)
    # Config.runs is the half2 loop's alone: each run whole 4-word vectors (16 columns of a half)
    check(group_size % (16 * cfg.runs) == 0, f"runs {cfg.runs} must cut group_size {group_size} into 16-column runs")
    strides = (x.stride(0), packed.stride(0), scales.stride(0))
    exact = x.dtype == torch.float32
    asm = x.is_cuda and not interpreting()
    h2 = asm and not exact and int4_gemv.takes_half2(cfg, k2, packed.data_ptr())
    xp = h2 and pairs is not None
    # without pairs the kernel never reads its pairs' arguments: any pointer stands in
    words = (pairs.pa, pairs.pb, pairs.sums) if xp and pairs is not None else (packed, packed, packed)
    tensors = (packed, scales, zeros, *words)
    ahead = h2 and cfg.ahead
    runs = cfg.runs if h2 else 1
    cap = {"maxnreg": cfg.pairs_registers} if xp and cfg.pairs_registers else {}
    return launch(
        _int4_kernel, x, n, k2, cfg, tensors, strides, glu, rope,
        G=group_size, EXACT=exact, ASM=asm, H2=h2, AHEAD=ahead, R=runs, XP=xp, **cap,
    )  # fmt: skip


def pairs_for(m: int, packed: torch.Tensor, group_size: int, dtype: torch.dtype) -> XPairs | None:
    """Room for ``m`` rows of ``dtype`` x as ``int4_matmul`` over this weight reads them, for the kernel before it to fill; None where it reads x."""
    n, k2 = packed.shape
    # NOTE(h7): the engine asks this of every int4 layer in each step it runs eagerly, so what needs
    # no launch config is refused first: rows the tiled path takes, rows too short for the half2
    # loop (SmolLM2's, all of them), the interpreter, fp32 x
    if (
        m > GEMV_MAX_ROWS
        or k2 < int4_gemv.HALF2_MIN_BYTES
        or not packed.is_cuda
        or interpreting()
        or dtype not in (torch.bfloat16, torch.float16)
    ):
        return None
    cfg = config_for("int4", m, n, 2 * k2, k2, group_size, packed.device)
    if not int4_gemv.takes_half2(cfg, k2, packed.data_ptr()):
        return None
    return int4_gemv.XPairs.empty(m, 2 * k2, group_size, packed.device)
