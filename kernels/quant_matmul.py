# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Weight-only int8 matmul ``y = x @ W.T``, one scale per output channel or per group: the kernel and its launcher.

Two kernel shapes. The GEMV path (few rows, decode) streams the weight once with elementwise FMAs
and a row reduction, the rows of ``x`` adjacent in the grid so that their programs share the
weight tile through L2. The tiled path (many rows, prefill or large batches) dequantizes a tile to
the activation dtype and feeds ``tl.dot``. Both can split K over programs when the grid would not
fill the GPU (``kernels._matmul_launch`` finishes the split in the same launch). The GEMV path can
take a ``[gate; up]`` weight and write ``silu(gate) * up`` (``glu``), or a ``[q; k; v]`` weight and
write rotary and the KV cache (``rope``), which saves the activation's or the rotary's own launch;
the tiled path runs that kernel after instead. The int4 formats' kernel is shaped the same way
(``kernels.int4_matmul``).

Owns the int8 kernel and ``int8_matmul``. Per-group int8 with group 32 is what GGUF Q8_0 blocks
repack into (``kernels.gguf_blocks``). The weight layout and the semantics are in
``kernels.reference`` (``quantize_int8``, ``int8_matmul``); the launcher falls back to those where
no kernel can run. Launch configs live in ``kernels._matmul_config`` (re-exported here). Does not
own which layers are quantized (``selfhost.models``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, interpreting, tl, triton
from kernels._matmul_config import GEMV_MAX_ROWS, Config, Kind, config_for, set_config
from kernels._matmul_launch import check_epilogue, check_group, check_step, check_x, finish_unfused, launch

if TYPE_CHECKING:
    from kernels.rope_kv import RopeKV

__all__ = ["GEMV_MAX_ROWS", "Config", "Kind", "int8_matmul", "set_config"]

if triton is not None:
    from kernels._common import WEIGHT_EVICTION, pdl_enter
    from kernels._matmul_launch import _program_tile, _store_tile
    from kernels.rope_kv import _rope_rows

    @triton.jit
    def _int8_to_f32(w, ASM: tl.constexpr):
        """``float(w)`` of an int8 tensor, exactly.

        NOTE(h7): int -> float conversions run at a quarter of the FP32 rate on Hopper, and the mantissa
        trick used before took a shift and two or three logic ops a byte. With ASM, one byte permute
        per element places the byte (sign bit flipped: q + 128) in the low mantissa of 2^23, and one
        FP add takes 2^23 + 128 off again: 4 bytes per register, one XOR per 4. On the H100 over the
        Llama-3-8B shapes at batch 1 (graphs of 32 layers' weights, PDL on), each with its best config,
        that GEMV took 8.5-188 us where the mantissa trick it replaced took 10.1-197 us (5-16 % less).
        """
        if ASM:
            bits = tl.inline_asm_elementwise(
                asm="""{
                .reg .b32 t, m;
                xor.b32 t, $4, 0x80808080;
                mov.b32 m, 0x4B000000;
                prmt.b32 $0, t, m, 0x7440;
                prmt.b32 $1, t, m, 0x7441;
                prmt.b32 $2, t, m, 0x7442;
                prmt.b32 $3, t, m, 0x7443;
                }""",
                constraints="=r,=r,=r,=r,r",
                args=[w],
                dtype=tl.int32,
                is_pure=True,
                pack=4,
            )
            return bits.to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + 128
        else:
            return w.to(tl.float32)

    @triton.jit
    def _int8_gemv_step(acc2, w, k0, x_row, K, s_ptr, rn, ss_n, nmask, G: tl.constexpr, ASM: tl.constexpr):
        """One K step of the int8 GEMV at ``k0``: ``w`` is its ``(BLOCK_N, BLOCK_K)`` weight tile.

        ``acc2`` is ``(BLOCK_N, BLOCK_K)`` products (per-row scale, applied after the loop) or, with
        groups, ``(BLOCK_N, BLOCK_K / G)`` scaled group sums.
        """
        BLOCK_N: tl.constexpr = w.shape[0]
        BLOCK_K: tl.constexpr = w.shape[1]
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        x = tl.load(x_row + rk, mask=kmask, other=0.0).to(tl.float32)  # (BLOCK_K,)
        qx = _int8_to_f32(w, ASM) * x[None, :]  # (BLOCK_N, BLOCK_K), exact products
        # NOTE(h7): one return at the end: the compiler visits code after an early one (the interpreter does not)
        if G == 0:
            acc2 += qx
        else:
            NG: tl.constexpr = BLOCK_K // G
            t = tl.sum(tl.reshape(qx, (BLOCK_N, NG, G)), axis=2)  # (BLOCK_N, NG)
            rg = k0 // G + tl.arange(0, NG)
            gmask = nmask[:, None] & (rg < K // G)[None, :]
            sg = tl.load(s_ptr + rn[:, None] * ss_n + rg[None, :], mask=gmask, other=0.0).to(tl.float32)
            acc2 += sg * t
        return acc2

    @triton.jit
    def _int8_kernel(
        x_ptr,  # (M, K) activations
        w_ptr,  # (N, K) int8 weight
        s_ptr,  # (N,) per-row scales, or (N, K/G) per-group scales when G > 0
        out_ptr,  # (M, N) output; (M, N / 2) with GLU, (M, QN) with ROPE
        part_ptr,  # (NSPLIT, M, N) fp32 split-K partials (unused without split-K)
        cnt_ptr,  # per-tile arrival counters, zero between launches
        M,  # rows of x
        N,  # output columns
        K,  # reduction length
        K_SPLIT,  # K columns per split (a multiple of BLOCK_K)
        NSPLIT,  # programs along K per tile
        sx_m,  # row stride of x
        sw_n,  # row stride of w
        ss_n,  # row stride of per-group scales (unused when G == 0)
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
        G: tl.constexpr,  # columns per scale; 0: one scale per row
        GEMV: tl.constexpr,  # FMA path (one row of x per program) instead of tl.dot
        GLU: tl.constexpr,  # w is [gate; up]: write silu(x @ gate.T) * (x @ up.T) (_tile_rows)
        ROPE: tl.constexpr,  # half the head dim: w is [q; k; v], write rotary q and the caches; 0: no rotary
        BLOCK_M: tl.constexpr,  # rows per program on the tiled path
        BLOCK_N: tl.constexpr,  # output columns per program
        BLOCK_K: tl.constexpr,  # K per loop step: with G, GEMV a multiple of G, tiled a divisor of G
        DOT_F32: tl.constexpr,  # widen tl.dot operands to fp32
        ASM: tl.constexpr = False,  # GEMV: convert the weight bytes with inline PTX (compiled kernels only)
        PREFETCH: tl.constexpr = False,  # GEMV: load the first weight tile before the PDL wait (Config.prefetch)
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        rm, mmask, rn, nmask = _program_tile(M, N, BLOCK_M, BLOCK_N, GEMV, GLU, ROPE)
        pos, slot = _rope_rows(pos_ptr, slot_ptr, rm, mmask, ROPE)  # before the PDL wait
        ks = tl.program_id(2)
        if G == 0:
            # NOTE(h7): per-row scales are weights, which no earlier kernel writes: loaded here, before
            # the PDL wait, and not after the loop, where their DRAM round trip stood between each
            # program's last FMA and its store
            s = tl.load(s_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        # NOTE(h7): the loop runs to the split's end and masks against K (a tl.minimum bound breaks
        # triton 3.6's interpreter); K_SPLIT is a multiple of BLOCK_K, so only the last split masks.
        if GEMV:
            NG: tl.constexpr = BLOCK_K // G if G > 0 else 1  # groups per step
            w_ptrs = w_ptr + rn[:, None] * sw_n
            k_lo = ks * K_SPLIT
            acc2 = tl.zeros((BLOCK_N, BLOCK_K if G == 0 else NG), tl.float32)
            if PREFETCH:  # see _dense_gemv_kernel
                rk = k_lo + tl.arange(0, BLOCK_K)
                w = tl.load(
                    w_ptrs + rk[None, :],
                    mask=nmask[:, None] & (rk < K)[None, :],
                    other=0,
                    eviction_policy=WEIGHT_EVICTION,
                )
            pdl_enter(PDL)
            if PREFETCH:
                acc2 = _int8_gemv_step(acc2, w, k_lo, x_ptr + rm * sx_m, K, s_ptr, rn, ss_n, nmask, G, ASM)
            k_first = k_lo + BLOCK_K * PREFETCH
            for k0 in range(k_first, k_lo + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                w = tl.load(
                    w_ptrs + rk[None, :],
                    mask=nmask[:, None] & (rk < K)[None, :],
                    other=0,
                    eviction_policy=WEIGHT_EVICTION,
                )
                acc2 = _int8_gemv_step(acc2, w, k0, x_ptr + rm * sx_m, K, s_ptr, rn, ss_n, nmask, G, ASM)
            acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
        else:
            pdl_enter(PDL)
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < K
                x = tl.load(x_ptr + rm[:, None] * sx_m + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
                w = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                if G == 0:
                    wd = w.to(tl.float32) if DOT_F32 else w.to(x.dtype)
                else:
                    # one group per step (BLOCK_K divides G)
                    sg = tl.load(s_ptr + rn * ss_n + k0 // G, mask=nmask & (k0 < K), other=0.0).to(tl.float32)[:, None]
                    wd = _int8_to_f32(w, ASM) * sg
                    wd = wd if DOT_F32 else wd.to(x.dtype)
                if DOT_F32:
                    acc += tl.dot(x.to(tl.float32), tl.trans(wd), input_precision="ieee")  # not tf32
                else:
                    acc += tl.dot(x, tl.trans(wd))
        if G == 0:
            acc = acc * s[None, :]
        _store_tile(
            acc, rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, M * N, cnt_ptr, N, NSPLIT, GLU,
            pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE,
        )  # fmt: skip


def int8_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    config: Config | None = None,
    *,
    glu: bool = False,
    rope: RopeKV | None = None,
    group_size: int = 0,
) -> torch.Tensor:
    """``(M, K) @ (N, K).T -> (M, N)`` with an int8 weight, ``w = qweight * scale``.

    ``group_size`` 0: one scale per output row, ``scales (N,)`` (``reference.quantize_int8``);
    otherwise one per row and group of ``group_size`` columns, ``scales (N, K/G)`` (GGUF Q8_0 with
    32). With ``glu``, W is ``[gate; up]`` and the result ``silu_and_mul(x @ W.T)``, ``(M, N/2)``;
    with ``rope``, W is ``[q; k; v]`` and the result the rotated queries (``RopeKV``).

    Raises:
        ValueError: shapes, dtypes, strides or a group size the kernel cannot take.
    """
    check(qweight.dim() == 2, f"qweight must be (N, K), got {tuple(qweight.shape)}")
    n, k = qweight.shape
    check_x(x, k)
    check_dtype("qweight", qweight, torch.int8)
    if group_size:
        check_group(group_size)
    want = (n,) if group_size == 0 else (n, k // group_size)
    check(group_size == 0 or k % group_size == 0, f"K ({k}) must be a multiple of group_size ({group_size})")
    check(scales.shape == want, f"scales must be {want}, got {tuple(scales.shape)}")
    check_epilogue(n, glu, rope)
    if not can_launch(x, qweight, scales):
        return finish_unfused(reference.int8_matmul(x, qweight, scales), glu, rope)
    check_last_contiguous("x", x)
    check_last_contiguous("qweight", qweight)
    check(scales.is_contiguous(), "scales must be contiguous")
    kind: Kind = "int8g" if group_size else "int8"
    cfg = config or config_for(kind, x.shape[0], n, k, k, group_size, x.device)
    if group_size:
        check_step(group_size, cfg)
    strides = (x.stride(0), qweight.stride(0), scales.stride(0) if group_size else 0)
    asm = x.is_cuda and not interpreting()
    return launch(_int8_kernel, x, n, k, cfg, (qweight, scales), strides, glu, rope, G=group_size, ASM=asm)
