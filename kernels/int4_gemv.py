# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""The int4 GEMV's inner loop: one K step of ``kernels.int4_matmul._int4_kernel``'s GEMV path, two ways.

On fp32 FMAs (``_int4_gemv_step``: fp32 activations, the interpreter, short rows), and on half2
FMAs (``_int4_h2_step``: compiled kernels, bf16 or fp16 activations, rows of ``HALF2_MIN_BYTES``
and more, tiles ``takes_half2`` lets in; with ``Config.runs``, several runs of a group a thread,
``_word_cols``). Both read the ``reference.quantize_int4`` layout and return the step's per-group
sums. Owns those steps and the rule that picks one, and the layout in which a kernel before the
GEMV can hand it x already as the half2 loop's pairs (``XPairs``); does not own the kernel, its
tiles (``kernels._matmul_config``) nor its launch (``kernels.int4_matmul``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels._common import tl, triton

if TYPE_CHECKING:
    from kernels._matmul_config import Config

HALF2_MIN_BYTES = 1024
"""Packed bytes a row (K / 2) from which the int4 GEMV takes bf16 and fp16 activations on half2 FMAs.

NOTE(h7): on the H100, over the 8B shapes (K 4,096 and 14,336) at the same tiles without prefetch,
the half2 loop's best ran within 1.5 % of the fp32 loop's (its 14 % fewer instructions bought no
time: the loop waits on memory, not on issue). What it adds is a cheap tile in flight
(``Config.prefetch``: one more tile of registers, where the fp32 loop peels a step and doubles
them): qkv 8.8, o 6.8, down 16.6 us against the fp32 loop's best 8.8, 7.2, 17.5; gate_up and the LM
head took an 8 x 1,024-byte tile (25.3, 102.3 against 27.4, 104.7 at 512 bytes), which the fp32
loop was not timed at. On SmolLM2's rows (K 576 and 1,536, GGUF's group of 32) it was slower:
7.47 against 7.31 us a layer over its four GEMVs at their best tiles
(``bench/probe_int4_loops.py``), each step building its x pairs for fewer weights.
"""


@dataclass(frozen=True, slots=True)
class XPairs:
    """An ``(M, K)`` activation as the half2 loop reads it, written by the kernel that makes x (``kernels.rmsnorm``).

    The layout is ``kernels.reference.x_pairs``': ``pa`` and ``pb`` hold each word's four columns of x
    as two fp16 pairs, ``sums`` x's sums per group of ``group_size`` columns; kernels write it with
    ``_write_pairs``. The GEMV loads them at its own word columns, in the weights' register layout,
    where from plain x it loads 2-byte columns, builds the pairs and sums and moves them into that
    layout through shared memory every step. NOTE(h7): on the H200, the 8B shapes at batch 1 with
    their default tiles (``bench/probe_int4_xpack.py``, 2026-11-28): gate_up 23.0 -> 17.8 us (at
    most 72 registers a thread), qkv 6.3 -> 5.4, LM head 92 -> 69; the step 538 -> 603 tok/s.
    """

    pa: torch.Tensor
    """(M, K/4) int32: ``(x[4q], x[4q+2]) * s``, fp16 each (s: 1/4 in the low half of K, 1/64 in the high)."""
    pb: torch.Tensor
    """(M, K/4) int32: ``(x[4q+1], x[4q+3]) * s``."""
    sums: torch.Tensor
    """(M, K/G) fp32."""
    group_size: int

    @staticmethod
    def empty(m: int, k: int, group_size: int, device: torch.device) -> XPairs:
        """Room for ``m`` rows of ``k`` columns, for a kernel to fill."""
        pa = torch.empty((m, k // 4), dtype=torch.int32, device=device)
        sums = torch.empty((m, k // group_size), dtype=torch.float32, device=device)
        return XPairs(pa, torch.empty_like(pa), sums, group_size)


def takes_half2(cfg: Config, row_bytes: int, weight_ptr: int) -> bool:
    """Whether a GEMV launched with ``cfg`` over packed rows of ``row_bytes`` at ``weight_ptr`` can take the half2 loop.

    Rows of ``HALF2_MIN_BYTES`` and more, and a tile that gives each thread whole 16-byte vectors of
    4 words, as ``_h2_dot`` reads them. NOTE(h7): ``_h2_dot`` takes 4 elements a call (``pack=4``)
    in a thread's register order, which are 4 consecutive words of one row only if the tile's layout
    holds 4 a thread: Triton's coalescer gives a thread 4 words (one 16-byte load, the weight
    16-byte aligned) from 4 words a thread on, and 2 below (a 16 x 64-byte tile over 4 warps mixed
    rows and read garbage on the H100). ``tests/kernels/sm90_build.py`` checks the layouts built.
    The caller adds what it alone knows (compiled kernels, bf16 or fp16 activations).
    """
    return (
        row_bytes >= HALF2_MIN_BYTES
        and cfg.path == "gemv"
        and cfg.block_n * cfg.block_k >= 512 * cfg.num_warps
        and weight_ptr % 16 == 0
    )


def _h2_asm() -> str:
    """``_h2_dot``'s PTX: operands ``$0-$3`` the fp32 sums, ``$4-$7`` the words, ``$8-$23`` x's pairs (a, b, c, d)."""
    lines = [
        ".reg .b32 t, a, b, c, d, ml, mh, mg, kl, kh, la, lb, ha, hb;",
        ".reg .b16 h0, h1;",
        "mov.b32 ml, 0x000F000F;",  # the low nibbles of bytes 0 and 2 (after the shift, 1 and 3)
        "mov.b32 mh, 0x00F000F0;",  # their high nibbles, 16 times their value
        "mov.b32 mg, 0x64006400;",  # 1024 in each half
        "mov.b32 kl, 0x64086408;",  # 1024 + 8
        "mov.b32 kh, 0x64806480;",  # 1024 + 16 * 8
    ]
    for i in range(4):  # words 0 and 1 sum into la / ha, 2 and 3 into lb / hb
        lo, hi = ("la", "ha") if i < 2 else ("lb", "hb")
        first = i % 2 == 0
        w, xa, xb, xc, xd = (f"${4 + i + 4 * j}" for j in range(5))
        lines += [
            f"lop3.b32 a, {w}, ml, mg, 0xEA;",  # (w & m) | 1024
            f"lop3.b32 c, {w}, mh, mg, 0xEA;",
            f"shr.u32 t, {w}, 8;",
            "lop3.b32 b, t, ml, mg, 0xEA;",
            "lop3.b32 d, t, mh, mg, 0xEA;",
            "sub.f16x2 a, a, kl;",
            "sub.f16x2 b, b, kl;",
            "sub.f16x2 c, c, kh;",
            "sub.f16x2 d, d, kh;",
            f"mul.rn.f16x2 {lo}, a, {xa};" if first else f"fma.rn.f16x2 {lo}, a, {xa}, {lo};",
            f"fma.rn.f16x2 {lo}, b, {xb}, {lo};",
            f"mul.rn.f16x2 {hi}, c, {xc};" if first else f"fma.rn.f16x2 {hi}, c, {xc}, {hi};",
            f"fma.rn.f16x2 {hi}, d, {xd}, {hi};",
        ]
    lines += [
        "add.rn.f16x2 la, la, lb;",
        "add.rn.f16x2 ha, ha, hb;",
        "mov.b32 {h0, h1}, la;",
        "cvt.f32.f16 $0, h0;",
        "cvt.f32.f16 $1, h1;",
        "mov.b32 {h0, h1}, ha;",
        "cvt.f32.f16 $2, h0;",
        "cvt.f32.f16 $3, h1;",
    ]
    return "{\n" + "\n".join(lines) + "\n}"


if triton is not None:
    from kernels._common import WEIGHT_EVICTION

    _H2_ASM = tl.constexpr(_h2_asm())

    @triton.jit
    def _nibbles_f32(b, ASM: tl.constexpr):
        """``(1 + lo / 2048, 1 + hi / 128)`` of each byte of a uint8 tensor, exactly, with no int -> float conversion.

        The low nibble goes to mantissa bits 12-15 of 1.0, the high one to bits 16-19. With ASM, one
        shift serves a pair of nibbles of four bytes held in one register (a 32-bit word: byte i
        shifted by 12 - 8 i), then one AND-OR each: 3 integer ops a byte, where the elementwise form
        also widens each byte to 32 bits first. NOTE(h7): ncu on the LM-head GEMV before this change:
        the ALU pipe 75.5 % busy at 61 % of DRAM bandwidth; after it the kernels ran 6-22 % faster.
        """
        if ASM:
            lo, hi = tl.inline_asm_elementwise(
                asm="""{
                .reg .b32 a, b, c, d, ml, mh, one;
                mov.b32 ml, 0xF000;
                mov.b32 mh, 0xF0000;
                mov.b32 one, 0x3F800000;
                shl.b32 a, $8, 12;
                shl.b32 b, $8, 4;
                shr.u32 c, $8, 4;
                shr.u32 d, $8, 12;
                lop3.b32 $0, a, ml, one, 0xEA;
                lop3.b32 $1, b, ml, one, 0xEA;
                lop3.b32 $2, c, ml, one, 0xEA;
                lop3.b32 $3, d, ml, one, 0xEA;
                lop3.b32 $4, a, mh, one, 0xEA;
                lop3.b32 $5, b, mh, one, 0xEA;
                lop3.b32 $6, c, mh, one, 0xEA;
                lop3.b32 $7, d, mh, one, 0xEA;
                }""",
                constraints="=r,=r,=r,=r,=r,=r,=r,=r,r",
                args=[b],
                dtype=(tl.int32, tl.int32),
                is_pure=True,
                pack=4,
            )
        else:
            w = b.to(tl.int32) << 12
            lo = (w & 0xF000) | 0x3F800000
            hi = (w & 0xF0000) | 0x3F800000
        return lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)

    @triton.jit
    def _int4_gemv_step(
        acc2,
        b,
        k0,
        x_row,
        K2,
        s_ptr,
        z_ptr,
        rn,
        ss_n,
        nmask,
        G: tl.constexpr,
        EXACT: tl.constexpr,
        ASM: tl.constexpr,
    ):
        """One K step of the int4 GEMV at byte ``k0`` on fp32 FMAs: ``b`` is its ``(BLOCK_N, BLOCK_K)`` packed tile.

        ``acc2`` is ``(BLOCK_N, BLOCK_K / G)`` group sums, both halves'. The path of fp32 activations
        and of the interpreter; compiled kernels take bf16 and fp16 ones through ``_int4_h2_step``.

        NOTE(h7): no int -> float conversion (a quarter of the FP32 rate on Hopper; two a byte capped
        this loop at ~1.9 TB/s). The nibbles go into the mantissa of 1.0 (``_nibbles_f32``):
        f = 1 + q / c exactly (c = 2048 low, 128 high). Per group, sum((q - 8) s x + z x) =
        c s sum(f x) + (z - (c + 8) s) sum(x).
        NOTE(gguf_native): f x carries q in its low bits, which costs log2(c) bits (~1e-4 relative at
        c = 2048): nothing against bf16, but fp32 activations (EXACT) take f - 1 = q / c exactly first,
        one more FP op, and then c s sum((f - 1) x) + (z - 8 s) sum(x).
        """
        BLOCK_N: tl.constexpr = b.shape[0]
        BLOCK_K: tl.constexpr = b.shape[1]
        NG: tl.constexpr = BLOCK_K // G  # groups per step and half
        OFF: tl.constexpr = 1.0 if EXACT else 0.0
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K2
        f_lo, f_hi = _nibbles_f32(b, ASM)
        x_lo = tl.load(x_row + rk, mask=kmask, other=0.0).to(tl.float32)  # (BLOCK_K,)
        x_hi = tl.load(x_row + K2 + rk, mask=kmask, other=0.0).to(tl.float32)
        if EXACT:
            f_lo, f_hi = f_lo - 1.0, f_hi - 1.0
        t_lo = tl.sum(tl.reshape(f_lo * x_lo[None, :], (BLOCK_N, NG, G)), axis=2)  # (BLOCK_N, NG)
        t_hi = tl.sum(tl.reshape(f_hi * x_hi[None, :], (BLOCK_N, NG, G)), axis=2)
        xs_lo = tl.sum(tl.reshape(x_lo, (NG, G)), axis=1)[None, :]  # (1, NG)
        xs_hi = tl.sum(tl.reshape(x_hi, (NG, G)), axis=1)[None, :]
        s_lo, z_lo, s_hi, z_hi = _group_scales(s_ptr, z_ptr, rn, ss_n, k0, nmask, K2, NG, G)
        s_lo = s_lo.to(tl.float32)
        z_lo = z_lo.to(tl.float32)
        s_hi = s_hi.to(tl.float32)
        z_hi = z_hi.to(tl.float32)
        acc2 += (2048.0 * s_lo) * t_lo + (z_lo - (2056.0 - 2048.0 * OFF) * s_lo) * xs_lo
        acc2 += (128.0 * s_hi) * t_hi + (z_hi - (136.0 - 128.0 * OFF) * s_hi) * xs_hi
        return acc2

    @triton.jit
    def _h2_dot(w, xa, xb, xc, xd):
        """``sum((q - 8) x)`` over each 4 consecutive words of a row, low and high halves apart, on half2 FMAs.

        ``w``: int32 words of the ``quantize_int4`` layout (bytes ``j..j+3`` of a row: columns
        ``j..j+3`` in the low nibbles, ``j + K/2..`` in the high ones). ``xa`` / ``xb``: fp16 pairs of x
        at columns ``(j, j+2)`` / ``(j+1, j+3)``; ``xc`` / ``xd`` the same of the high half, divided by
        16 (``_half_pairs``). Per 4 words, fp32 ``[lo, lo, hi, hi]`` (each half2 lane's sum).

        One AND-OR puts two nibbles into the mantissas of a half2 of 1024 (low nibbles: 1024 + q;
        high: 1024 + 16 q, which x / 16 takes back), one subtraction leaves ``q - 8`` exactly (or
        ``16 (q - 8)``), one FMA adds the pair's products: 13 instructions a word, 8 weights, with one
        shift. NOTE(h7): fp16 is the price. Each lane sums 8 products of ``|q - 8| <= 8`` and x / 4
        before fp32 takes over: finite while 8 * 8 * |x| / 4 < 65504, so up to |x| = 4,094 even where
        all of a lane's products have the same sign and the largest weight. x keeps fp16's 11 bits
        down to |x| = 2^-12 in the low half of K and 2^-8 in the high half (x / 64 there); below that
        its error is at most 2^-25 * 4 (low) or 2^-25 * 64 (high, 1.9e-6) absolute. The relative
        error against ``reference.int4_matmul`` on the 8B shapes stayed at bf16's rounding (1.70e-3
        against 1.67e-3 for the fp32 loop). Compiled kernels only (the interpreter runs no PTX).
        """
        return tl.inline_asm_elementwise(
            asm=_H2_ASM,
            constraints="=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
            args=[w, xa, xb, xc, xd],
            dtype=tl.float32,
            is_pure=True,
            pack=4,
        )

    @triton.jit
    def _word_cols(k0, BLOCK_W: tl.constexpr, WG: tl.constexpr, R: tl.constexpr):
        """The word columns of the step at byte ``k0``: ``(BLOCK_W,)``, or ``(NG, 1, R, WG / R)`` with ``R`` > 1.

        ``WG`` words make a group (of each half). With ``R`` > 1 each group's words are cut into ``R``
        runs that one thread holds, so a group's sums take fewer steps across threads.
        NOTE(h7): the layout follows from the shape. Triton's coalescer gives a thread 4 of the
        contiguous last dimension's words (one 16-byte load) and hands the other dimensions to lanes
        and warps in index order, groups and rows before runs, which stay in registers. Put the runs
        anywhere but after the rows and they go to lanes (no gain); load x in this shape too and the
        half2 FMAs run in x's layout, 1 word a thread (wrong results under ``pack=4``).
        """
        if R == 1:
            return k0 // 4 + tl.arange(0, BLOCK_W)
        else:
            NG: tl.constexpr = BLOCK_W // WG
            J: tl.constexpr = WG // R
            g = tl.arange(0, NG)[:, None, None, None] * WG
            r = tl.arange(0, R)[None, None, :, None] * J
            j = tl.arange(0, J)[None, None, None, :]
            return k0 // 4 + r + g + j

    @triton.jit
    def _x_quads(x_row, k0, k_end, K2, BLOCK_W: tl.constexpr):
        """The x at columns ``4c .. 4c + 3`` of the step's words ``c`` (at byte ``k0``), as loaded: four ``(BLOCK_W,)``.

        Zeros for a step at or past ``k_end`` (the one a tile in flight loads after the last).
        """
        rc = k0 // 4 + tl.arange(0, BLOCK_W)
        cmask = (rc < K2 // 4) & (k0 < k_end)
        x0 = tl.load(x_row + 4 * rc, mask=cmask, other=0.0)
        x1 = tl.load(x_row + 4 * rc + 1, mask=cmask, other=0.0)
        x2 = tl.load(x_row + 4 * rc + 2, mask=cmask, other=0.0)
        x3 = tl.load(x_row + 4 * rc + 3, mask=cmask, other=0.0)
        return x0, x1, x2, x3

    @triton.jit
    def _half_pairs(x0, x1, x2, x3, scale):
        """Four columns of x (``_x_quads``) as ``_h2_dot`` takes them, times ``scale``: fp16 pairs in int32, and their fp32 sum.

        Returns ``((x[4c], x[4c+2]), (x[4c+1], x[4c+3]), x[4c] + ... + x[4c+3])`` for each word ``c``.
        """
        x0 = x0.to(tl.float32)
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        x3 = x3.to(tl.float32)
        h0 = (x0 * scale).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        h1 = (x1 * scale).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        h2 = (x2 * scale).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        h3 = (x3 * scale).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        return h0 | (h2 << 16), h1 | (h3 << 16), x0 + x1 + x2 + x3

    @triton.jit
    def _group_scales(s_ptr, z_ptr, rn, ss_n, k0, nmask, K2, NG: tl.constexpr, G: tl.constexpr):
        """Rows ``rn``'s scales and zeros of the step at byte ``k0``, as loaded: ``(s_lo, z_lo, s_hi, z_hi)``, each ``(BLOCK_N, NG)``.

        Zeros where ``nmask`` is false (a caller looking a step past its last masks every row).
        """
        HI_GROUPS = K2 // G  # group index offset of the high half
        rg = k0 // G + tl.arange(0, NG)
        gmask = nmask[:, None] & (rg < HI_GROUPS)[None, :]
        s_off = rn[:, None] * ss_n + rg[None, :]
        s_lo = tl.load(s_ptr + s_off, mask=gmask, other=0.0)
        z_lo = tl.load(z_ptr + s_off, mask=gmask, other=0.0)
        s_hi = tl.load(s_ptr + s_off + HI_GROUPS, mask=gmask, other=0.0)
        z_hi = tl.load(z_ptr + s_off + HI_GROUPS, mask=gmask, other=0.0)
        return s_lo, z_lo, s_hi, z_hi

    @triton.jit
    def _write_pairs(y, row, C, pa_ptr, pb_ptr, xs_ptr, G: tl.constexpr):
        """Write row ``row`` of an ``XPairs`` over ``C`` columns (``reference.x_pairs``) from its values ``y``.

        ``y``: ``(BLOCK,)`` fp32, as rounded to x's dtype, zeros past ``C``; ``C`` a multiple of ``2 G``.
        """
        BLOCK: tl.constexpr = y.shape[0]
        Q: tl.constexpr = BLOCK // 4
        c02, c13 = tl.split(tl.reshape(y, (Q, 2, 2)))  # (Q, 2) each: columns 4q + 2i + j, j = 0 or 1
        x0, x2 = tl.split(c02)  # (Q,) each
        x1, x3 = tl.split(c13)
        q = tl.arange(0, Q)
        scale = tl.where(q < C // 8, 0.25, 0.25 / 16.0)  # the high half of K: 1/64 (_h2_dot's 16 q)
        qmask = q < C // 4
        tl.store(pa_ptr + row * (C // 4) + q, _fp16_pair(x0 * scale, x2 * scale), mask=qmask)
        tl.store(pb_ptr + row * (C // 4) + q, _fp16_pair(x1 * scale, x3 * scale), mask=qmask)
        sums = tl.sum(tl.reshape(y, (BLOCK // G, G)), axis=1)  # (BLOCK / G,)
        g = tl.arange(0, BLOCK // G)
        tl.store(xs_ptr + row * (C // G) + g, sums, mask=g < C // G)

    @triton.jit
    def _fp16_pair(first, second):
        """Two fp32 tensors as fp16 pairs in int32: ``first`` in the low 16 bits."""
        a = first.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        b = second.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        return a | (b << 16)

    @triton.jit
    def _byte_tile(w_ptrs, k0, K2, nmask, BLOCK_K: tl.constexpr):
        """The ``(BLOCK_N, BLOCK_K)`` packed bytes of the fp32 loop's tile at byte ``k0``; ``w_ptrs`` the rows' ``(BLOCK_N, 1)`` pointers."""
        rk = k0 + tl.arange(0, BLOCK_K)
        return tl.load(
            w_ptrs + rk[None, :], mask=nmask[:, None] & (rk < K2)[None, :], other=0, eviction_policy=WEIGHT_EVICTION
        )

    @triton.jit
    def _word_tile(w32, k0, k_end, K2, nmask, BLOCK_K: tl.constexpr, WG: tl.constexpr, R: tl.constexpr):
        """The int32 words of a packed int4 tile at byte ``k0`` (zeros at or past ``k_end``).

        ``(BLOCK_N, BLOCK_K / 4)``, or ``(NG, BLOCK_N, R, WG / R)`` with ``R`` > 1 (``_word_cols``).
        ``w32`` is the rows' ``(BLOCK_N, 1)`` word pointers.
        """
        rc = _word_cols(k0, BLOCK_K // 4, WG, R)
        if R == 1:
            return tl.load(
                w32 + rc[None, :],
                mask=nmask[:, None] & ((rc < K2 // 4) & (k0 < k_end))[None, :],
                other=0,
                eviction_policy=WEIGHT_EVICTION,
            )
        else:
            return tl.load(
                w32[None, :, :, None] + rc,
                mask=nmask[None, :, None, None] & (rc < K2 // 4) & (k0 < k_end),
                other=0,
                eviction_policy=WEIGHT_EVICTION,
            )

    @triton.jit
    def _int4_h2_step(acc2, wq, k0, k_end, x_row, K2, s_ptr, z_ptr, rn, ss_n, nmask, G: tl.constexpr, R: tl.constexpr):
        """``_int4_gemv_step`` on half2 FMAs (``_h2_dot``): ``wq`` is the step's int32 words (``_word_tile``).

        Loads the step's x, then its scales and zeros (after the products: fewer registers live).
        """
        BLOCK_W: tl.constexpr = wq.shape[1] if R == 1 else wq.shape[0] * wq.shape[2] * wq.shape[3]
        NG: tl.constexpr = BLOCK_W * 4 // G  # groups per step and half
        a0, a1, a2, a3 = _x_quads(x_row, k0, k_end, K2, BLOCK_W)
        b0, b1, b2, b3 = _x_quads(x_row + K2, k0, k_end, K2, BLOCK_W)
        t_lo, t_hi, xs_lo, xs_hi = _h2_sums(wq, a0, a1, a2, a3, b0, b1, b2, b3, G, R)
        s_lo, z_lo, s_hi, z_hi = _group_scales(s_ptr, z_ptr, rn, ss_n, k0, nmask, K2, NG, G)
        return _h2_fold(acc2, t_lo, t_hi, xs_lo, xs_hi, s_lo, z_lo, s_hi, z_hi)

    @triton.jit
    def _h2_sums(wq, a0, a1, a2, a3, b0, b1, b2, b3, G: tl.constexpr, R: tl.constexpr):
        """Per row and group of a step, ``sum((q - 8) x / 4)`` of each half, and per group ``sum(x)``: ``(t_lo, t_hi, xs_lo, xs_hi)``.

        ``wq``: the step's int32 words (``_word_tile``, ``R`` runs of a group a thread); ``a*`` / ``b*``:
        x of the low and high half (``_x_quads``).
        """
        xa, xb, xs_lo = _half_pairs(a0, a1, a2, a3, 0.25)
        xc, xd, xs_hi = _half_pairs(b0, b1, b2, b3, 0.25 / 16.0)
        t_lo, t_hi = _pair_products(wq, xa, xb, xc, xd, G, R)
        NG: tl.constexpr = xa.shape[0] * 4 // G  # groups per step and half
        xs_lo = tl.sum(tl.reshape(xs_lo, (NG, G // 4)), axis=1)[None, :]  # (1, NG)
        xs_hi = tl.sum(tl.reshape(xs_hi, (NG, G // 4)), axis=1)[None, :]
        return t_lo, t_hi, xs_lo, xs_hi

    @triton.jit
    def _pair_products(wq, xa, xb, xc, xd, G: tl.constexpr, R: tl.constexpr):
        """Per row and group of a step, ``sum((q - 8) x / 4)`` of each half: ``(t_lo, t_hi)``, each ``(BLOCK_N, NG)``.

        ``xa .. xd``: the step's x pairs (``_half_pairs``, or an ``XPairs``' words), ``(BLOCK_W,)``.
        """
        BLOCK_W: tl.constexpr = xa.shape[0]
        NG: tl.constexpr = BLOCK_W * 4 // G  # groups per step and half
        if R == 1:
            BLOCK_N: tl.constexpr = wq.shape[0]
            o = _h2_dot(wq, xa[None, :], xb[None, :], xc[None, :], xd[None, :])  # (BLOCK_N, BLOCK_W)
            o4 = tl.reshape(o, (BLOCK_N, BLOCK_W // 4, 2, 2))  # [lo, lo, hi, hi] of each 4 words
            lo, hi = tl.split(tl.permute(o4, (0, 1, 3, 2)))  # (BLOCK_N, BLOCK_W / 4, 2) each
            t_lo = tl.sum(tl.reshape(lo, (BLOCK_N, NG, G // 8)), axis=2)  # (BLOCK_N, NG)
            t_hi = tl.sum(tl.reshape(hi, (BLOCK_N, NG, G // 8)), axis=2)
        else:
            BNR: tl.constexpr = wq.shape[1]  # rows (wq is (NG, BLOCK_N, R, J))
            J: tl.constexpr = wq.shape[3]  # words a run
            # back to rows of words in memory order: a change of view, each thread's words in place
            # (its 4 consecutive words still _h2_dot's pack), so x lines up as a plain row again
            w2 = tl.reshape(tl.permute(wq, (1, 0, 2, 3)), (BNR, BLOCK_W))
            o = _h2_dot(w2, xa[None, :], xb[None, :], xc[None, :], xd[None, :])  # (BLOCK_N, BLOCK_W)
            o6 = tl.reshape(o, (BNR, NG, R, J // 4, 2, 2))  # [lo, lo, hi, hi] of each 4 words
            lo, hi = tl.split(tl.permute(o6, (0, 1, 2, 3, 5, 4)))  # (BLOCK_N, NG, R, J / 4, 2) each
            # the half2 lanes and the runs (in-thread) first: (BLOCK_N, NG)
            t_lo = tl.sum(tl.sum(tl.sum(lo, axis=4), axis=2), axis=2)
            t_hi = tl.sum(tl.sum(tl.sum(hi, axis=4), axis=2), axis=2)
        return t_lo, t_hi

    @triton.jit
    def _pair_words(pa_row, pb_row, sums_row, k0, k_end, K2, BLOCK_W: tl.constexpr, G: tl.constexpr):
        """An ``XPairs`` row's x for the step at byte ``k0``: ``(xa, xb, xc, xd)``, ``(BLOCK_W,)`` each, and ``(1, NG)`` sums of each half.

        Contiguous int32 loads at the step's word columns: their layout is the weight tile's columns',
        so the products take them as they are. Zeros for a step at or past ``k_end``.
        """
        KW = K2 // 4  # words of each half
        rc = k0 // 4 + tl.arange(0, BLOCK_W)
        cmask = (rc < KW) & (k0 < k_end)
        xa = tl.load(pa_row + rc, mask=cmask, other=0)
        xb = tl.load(pb_row + rc, mask=cmask, other=0)
        xc = tl.load(pa_row + KW + rc, mask=cmask, other=0)
        xd = tl.load(pb_row + KW + rc, mask=cmask, other=0)
        NG: tl.constexpr = BLOCK_W * 4 // G
        rg = k0 // G + tl.arange(0, NG)
        gmask = (rg < K2 // G) & (k0 < k_end)
        xs_lo = tl.load(sums_row + rg, mask=gmask, other=0.0)
        xs_hi = tl.load(sums_row + K2 // G + rg, mask=gmask, other=0.0)
        return xa, xb, xc, xd, xs_lo[None, :], xs_hi[None, :]

    @triton.jit
    def _h2_fold(acc2, t_lo, t_hi, xs_lo, xs_hi, s_lo, z_lo, s_hi, z_hi):
        """``acc2`` plus a step's group sums: ``sum((q - 8) s x + z x) = 4 s sum((q - 8) x / 4) + z sum(x)``."""
        acc2 += (4.0 * s_lo.to(tl.float32)) * t_lo + z_lo.to(tl.float32) * xs_lo
        acc2 += (4.0 * s_hi.to(tl.float32)) * t_hi + z_hi.to(tl.float32) * xs_hi
        return acc2
