# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Weight-only quantized matmul ``y = x @ W.T``: int8 per output channel and int4 group-wise asymmetric.

Two kernel shapes per format. The GEMV path (few rows, decode) streams the weight once with
elementwise FMAs and a row reduction, the rows of ``x`` adjacent in the grid so that their programs
share the weight tile through L2. The tiled path (many rows, prefill or large batches) dequantizes
a tile to the activation dtype and feeds ``tl.dot``. Both can split K over programs when the grid
would not fill the GPU; the last program of a tile to finish sums the fp32 partials in split order
in the same launch (deterministic, unlike atomic adds). Either path can take ``[gate | up]`` and
apply SiLU-and-mul as it loads x (``gated``), which saves the activation's own launch.

Owns the kernels, the launchers and the per-shape launch configs (``Config``, ``set_config``).
The weight layouts and the semantics are in ``kernels.reference`` (``quantize_int8``,
``quantize_int4``, ``int8_matmul``, ``int4_matmul``); launchers fall back to those where no kernel
can run. Does not own which layers are quantized (``selfhost.models``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, dot_in_fp32, num_sms, tl, triton

GEMV_MAX_ROWS = 4
"""Rows of ``x`` up to which the GEMV path is the default."""


@dataclass(frozen=True, slots=True)
class Config:
    """How one matmul is launched."""

    path: Literal["gemv", "tiled"]
    """GEMV (elementwise FMAs) or tiled (``tl.dot``)."""
    block_n: int
    """Output columns per program."""
    block_k: int
    """K per loop step (for int4: packed bytes per half, i.e. columns of each half of K)."""
    split_k: int
    """Programs that share one output tile's K range."""
    num_warps: int = 4
    """Warps per program."""
    block_m: int = 16
    """Rows per program on the tiled path."""


_CONFIGS: dict[tuple[str, int, int, int], Config] = {}


def set_config(kind: Literal["int8", "int4"], rows: int, n: int, k: int, config: Config | None) -> None:
    """Pin (or with None, forget) the launch config of one ``(kind, rows of x, N, K)`` matmul (benchmarks tune these)."""
    key = (kind, rows, n, k)
    if config is None:
        _CONFIGS.pop(key, None)
    else:
        _CONFIGS[key] = config


def _default_config(kind: str, m: int, n: int, k_iter_cols: int, group: int, device: torch.device) -> Config:
    interp = device.type == "cpu"
    if m <= GEMV_MAX_ROWS:
        bn, bk = (16, 32) if interp else (32, 128 if kind == "int4" else 256)
        bk = max(bk, group) if kind == "int4" else bk
        path: Literal["gemv", "tiled"] = "gemv"
        tiles = m * -(-n // bn)
    else:
        bn, bk = (16, 16) if interp else (64, 64)
        bk = min(bk, group) if kind == "int4" else bk
        path = "tiled"
        tiles = -(-m // 16) * -(-n // bn)
    # NOTE(h7): split K until the grid holds ~4 waves of programs, but keep >= 4 loop steps each:
    # one wave of long programs leaves the memory system idle at the tail.
    split, sms = 1, num_sms(device)
    while tiles * split < 4 * sms and k_iter_cols // (bk * split * 2) >= 4:
        split *= 2
    return Config(path, bn, bk, split, num_warps=4)


if triton is not None:

    @triton.jit
    def _load_x(ptrs, mask, GATE_OFF, GATED: tl.constexpr):
        """``x`` at ``ptrs``; with GATED, ``silu(x[ptrs]) * x[ptrs + GATE_OFF]`` rounded to x's dtype (``silu_and_mul``)."""
        x = tl.load(ptrs, mask=mask, other=0.0)
        if GATED:
            g = x.to(tl.float32)
            u = tl.load(ptrs + GATE_OFF, mask=mask, other=0.0).to(tl.float32)
            x = (g / (1.0 + tl.exp(-g)) * u).to(x.dtype)
        return x

    @triton.jit
    def _store_tile(acc, rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, sp_s, cnt_ptr, N, NSPLIT):
        """Write a finished ``(rows, cols)`` fp32 tile, reducing split-K in the same launch.

        Without split-K the tile goes straight to ``out``. With it, each program stores an fp32 partial;
        the last of the tile's NSPLIT programs to arrive (an atomic counter per tile) sums the partials
        in split order, so the result does not depend on arrival order, writes ``out`` and resets the
        counter for the next launch (CUDA graph replays reuse it).
        """
        omask = mmask[:, None] & nmask[None, :]
        o_off = rm[:, None] * so_m + rn[None, :]
        if NSPLIT == 1:
            tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=omask)
        else:
            p_off = rm[:, None] * N + rn[None, :]
            tl.store(part_ptr + tl.program_id(2) * sp_s + p_off, acc, mask=omask)
            # NOTE(h7): every thread's partial store must precede the release of the counter increment
            tl.debug_barrier()
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if arrived == NSPLIT - 1:
                tot = tl.zeros_like(acc)
                for s in range(NSPLIT):
                    # .cg: other multiprocessors wrote these; skip this one's L1
                    tot += tl.load(part_ptr + s * sp_s + p_off, mask=omask, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + o_off, tot.to(out_ptr.dtype.element_ty), mask=omask)
                tl.atomic_xchg(cnt_ptr + tile, 0)

    @triton.jit
    def _int8_kernel(
        x_ptr,  # (M, K) activations, or (M, 2K) [gate | up] when GATED
        w_ptr,  # (N, K) int8 weight
        s_ptr,  # (N,) per-row scales
        out_ptr,  # (M, N) output
        part_ptr,  # (NSPLIT, M, N) fp32 split-K partials (unused without split-K)
        cnt_ptr,  # per-tile arrival counters, zero between launches
        M,  # rows of x
        N,  # output columns
        K,  # reduction length
        K_SPLIT,  # K columns per split (a multiple of BLOCK_K)
        NSPLIT,  # programs along K per tile
        sx_m,  # row stride of x
        sw_n,  # row stride of w
        so_m,  # row stride of out
        GEMV: tl.constexpr,  # FMA path (one row of x per program) instead of tl.dot
        GATED: tl.constexpr,  # x is [gate | up]: multiply silu(gate) * up
        BLOCK_M: tl.constexpr,  # rows per program on the tiled path
        BLOCK_N: tl.constexpr,  # output columns per program
        BLOCK_K: tl.constexpr,  # K per loop step
        DOT_F32: tl.constexpr,  # widen tl.dot operands to fp32
    ):
        # GEMV: one row per program, adjacent programs on the same weight tile (shared through L2)
        rm = tl.program_id(0) + tl.zeros((1,), tl.int32) if GEMV else tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.program_id(2)
        nmask = rn < N
        mmask = rm < M
        # NOTE(h7): the loop runs to the split's end and masks against K (a tl.minimum bound breaks
        # triton 3.6's interpreter); K_SPLIT is a multiple of BLOCK_K, so only the last split masks.
        if GEMV:
            # NOTE(h7): no int -> float conversion: those run at a quarter of the FP32 rate on Hopper.
            # The byte as unsigned u = q + 128 goes into the top mantissa bits of 1.0, giving
            # f = 1 + u / 256 exactly with one shift and one logic op; sum(q x) = 256 sum(f x) - 384 sum(x).
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            xs = tl.zeros((BLOCK_K,), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < K
                x = _load_x(x_ptr + rm * sx_m + rk, kmask, K, GATED).to(tl.float32)  # (BLOCK_K,)
                w = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                bits = (((w.to(tl.int32) << 15) ^ 0x400000) & 0x7F8000) | 0x3F800000
                acc2 += bits.to(tl.float32, bitcast=True) * x[None, :]
                xs += x
            acc = (256.0 * tl.sum(acc2, axis=1) - 384.0 * tl.sum(xs, axis=0))[None, :]  # (1, BLOCK_N)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < K
                x = _load_x(x_ptr + rm[:, None] * sx_m + rk[None, :], mmask[:, None] & kmask[None, :], K, GATED)
                w = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                if DOT_F32:
                    acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
                else:
                    acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        s = tl.load(s_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        _store_tile(acc * s[None, :], rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, M * N, cnt_ptr, N, NSPLIT)

    @triton.jit
    def _int4_kernel(
        x_ptr,  # (M, K) activations, or (M, 2K) [gate | up] when GATED
        w_ptr,  # (N, K/2) uint8: column j low nibble, column j + K/2 high nibble
        s_ptr,  # (N, K/G) scales
        z_ptr,  # (N, K/G) zeros: w = (q - 8) * scale + zero
        out_ptr,  # (M, N) output
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
        G: tl.constexpr,  # group size (columns per scale)
        GEMV: tl.constexpr,  # FMA path (one row of x per program) instead of tl.dot
        GATED: tl.constexpr,  # x is [gate | up]: multiply silu(gate) * up
        BLOCK_M: tl.constexpr,  # rows per program on the tiled path
        BLOCK_N: tl.constexpr,  # output columns per program
        BLOCK_K: tl.constexpr,  # bytes per loop step: GEMV a multiple of G, tiled a divisor of G
        DOT_F32: tl.constexpr,  # widen tl.dot operands to fp32
    ):
        rm = tl.program_id(0) + tl.zeros((1,), tl.int32) if GEMV else tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.program_id(2)
        nmask = rn < N
        mmask = rm < M
        HI_GROUPS = K2 // G  # group index offset of the high half
        if GEMV:
            # NOTE(h7): no int -> float conversion (a quarter of the FP32 rate on Hopper; two a byte
            # capped this loop at ~1.9 TB/s). After one shift the low nibble sits in mantissa bits
            # 12-15 and the high one in 16-19: or-ed into 1.0 they give f = 1 + q / c exactly (c = 2048,
            # 128). Per group, sum((q - 8) s x + z x) = c s sum(f x) + (z - (c + 8) s) sum(x).
            NG: tl.constexpr = BLOCK_K // G  # groups per step and half
            acc2 = tl.zeros((BLOCK_N, NG), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < K2
                rg = k0 // G + tl.arange(0, NG)
                gmask = nmask[:, None] & (rg < HI_GROUPS)[None, :]
                b = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                b = b.to(tl.int32) << 12
                f_lo = ((b & 0xF000) | 0x3F800000).to(tl.float32, bitcast=True)
                f_hi = ((b & 0xF0000) | 0x3F800000).to(tl.float32, bitcast=True)
                x_lo = _load_x(x_ptr + rm * sx_m + rk, kmask, 2 * K2, GATED).to(tl.float32)  # (BLOCK_K,)
                x_hi = _load_x(x_ptr + rm * sx_m + K2 + rk, kmask, 2 * K2, GATED).to(tl.float32)
                t_lo = tl.sum(tl.reshape(f_lo * x_lo[None, :], (BLOCK_N, NG, G)), axis=2)  # (BLOCK_N, NG)
                t_hi = tl.sum(tl.reshape(f_hi * x_hi[None, :], (BLOCK_N, NG, G)), axis=2)
                xs_lo = tl.sum(tl.reshape(x_lo, (NG, G)), axis=1)[None, :]  # (1, NG)
                xs_hi = tl.sum(tl.reshape(x_hi, (NG, G)), axis=1)[None, :]
                s_off = rn[:, None] * ss_n + rg[None, :]
                s_lo = tl.load(s_ptr + s_off, mask=gmask, other=0.0).to(tl.float32)
                z_lo = tl.load(z_ptr + s_off, mask=gmask, other=0.0).to(tl.float32)
                s_hi = tl.load(s_ptr + s_off + HI_GROUPS, mask=gmask, other=0.0).to(tl.float32)
                z_hi = tl.load(z_ptr + s_off + HI_GROUPS, mask=gmask, other=0.0).to(tl.float32)
                acc2 += (2048.0 * s_lo) * t_lo + (z_lo - 2056.0 * s_lo) * xs_lo
                acc2 += (128.0 * s_hi) * t_hi + (z_hi - 136.0 * s_hi) * xs_hi
            acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < K2
                b = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                b = b.to(tl.int32)
                g_off = rn * ss_n + k0 // G  # one group per step and half: BLOCK_K divides G
                s_lo = tl.load(s_ptr + g_off, mask=nmask, other=0.0).to(tl.float32)[:, None]
                z_lo = tl.load(z_ptr + g_off, mask=nmask, other=0.0).to(tl.float32)[:, None]
                s_hi = tl.load(s_ptr + g_off + HI_GROUPS, mask=nmask, other=0.0).to(tl.float32)[:, None]
                z_hi = tl.load(z_ptr + g_off + HI_GROUPS, mask=nmask, other=0.0).to(tl.float32)[:, None]
                xmask = mmask[:, None] & kmask[None, :]
                x_lo = _load_x(x_ptr + rm[:, None] * sx_m + rk[None, :], xmask, 2 * K2, GATED)
                x_hi = _load_x(x_ptr + rm[:, None] * sx_m + K2 + rk[None, :], xmask, 2 * K2, GATED)
                # the nibble in mantissa bits 19-22 of 1.0: f = 1 + q / 16, so w = 16 s f + z - 24 s (no I2F)
                f_lo = (((b << 19) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
                f_hi = (((b << 15) & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
                w_lo = f_lo * (16.0 * s_lo) + (z_lo - 24.0 * s_lo)  # (BLOCK_N, BLOCK_K)
                w_hi = f_hi * (16.0 * s_hi) + (z_hi - 24.0 * s_hi)
                if DOT_F32:
                    acc += tl.dot(x_lo.to(tl.float32), tl.trans(w_lo))
                    acc += tl.dot(x_hi.to(tl.float32), tl.trans(w_hi))
                else:
                    acc += tl.dot(x_lo, tl.trans(w_lo.to(x_lo.dtype)))
                    acc += tl.dot(x_hi, tl.trans(w_hi.to(x_hi.dtype)))
        _store_tile(acc, rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, M * N, cnt_ptr, N, NSPLIT)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_ALL_COUNTERS: list[torch.Tensor] = []


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Split-K arrival counters for ``tiles`` output tiles: zero between launches, shared by all launches.

    NOTE(h7): every launch leaves its counters at zero, so launches in one stream can share them; two
    streams running split-K matmuls at the same time could not. A buffer is never freed once made: a
    captured CUDA graph keeps its address.
    """
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 1 << 14), dtype=torch.int32, device=device)
        _ALL_COUNTERS.append(buf)
        _COUNTERS[device] = buf
    return buf


def _launch(
    kernel: object,
    x: torch.Tensor,
    n: int,
    k_cols: int,
    cfg: Config,
    tensors: tuple[torch.Tensor, ...],
    strides: tuple[int, ...],
    gated: bool,
    **constexprs: int,
) -> torch.Tensor:
    """Run ``kernel`` over the grid ``cfg`` asks for; split-K partials are reduced inside the launch.

    ``k_cols`` is the K extent the kernel iterates (packed bytes per half for int4).
    """
    m = x.shape[0]
    per_split = -(-k_cols // cfg.split_k)
    k_split = -(-per_split // cfg.block_k) * cfg.block_k  # a multiple of the loop step
    split = -(-k_cols // k_split)
    gemv = cfg.path == "gemv"
    grid = (m if gemv else -(-m // cfg.block_m), -(-n // cfg.block_n), split)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    part, counters = out, out  # placeholders without split-K: never read
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        counters = _counters(x.device, grid[0] * grid[1])
    kernel[grid](  # type: ignore[index]
        x,
        *tensors,
        out,
        part,
        counters,
        m,
        n,
        k_cols,
        k_split,
        split,
        *strides,
        out.stride(0),
        **constexprs,
        GEMV=gemv,
        GATED=gated,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        DOT_F32=dot_in_fp32() or x.dtype == torch.float32,
        num_warps=cfg.num_warps,
    )
    return out


def _check_x(x: torch.Tensor, k: int, gated: bool) -> None:
    cols = 2 * k if gated else k
    check(x.dim() == 2 and x.shape[1] == cols, f"x must be (M, {cols}), got {tuple(x.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)


def int8_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, config: Config | None = None, *, gated: bool = False
) -> torch.Tensor:
    """``(M, K) @ (N, K).T -> (M, N)`` with an int8 per-channel weight (``reference.quantize_int8``).

    With ``gated``, x is ``(M, 2K)`` ``[gate | up]`` and the product is ``silu_and_mul(x) @ W.T``,
    the activation fused into the matmul's loads.

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take.
    """
    check(qweight.dim() == 2, f"qweight must be (N, K), got {tuple(qweight.shape)}")
    n, k = qweight.shape
    _check_x(x, k, gated)
    check_dtype("qweight", qweight, torch.int8)
    check(scales.shape == (n,), f"scales must be ({n},), got {tuple(scales.shape)}")
    if not can_launch(x, qweight, scales):
        return reference.int8_matmul(reference.silu_and_mul(x) if gated else x, qweight, scales)
    check_last_contiguous("x", x)
    check_last_contiguous("qweight", qweight)
    check(scales.is_contiguous(), "scales must be contiguous")
    cfg = config or _CONFIGS.get(("int8", x.shape[0], n, k)) or _default_config("int8", x.shape[0], n, k, 1, x.device)
    return _launch(_int8_kernel, x, n, k, cfg, (qweight, scales), (x.stride(0), qweight.stride(0)), gated)


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    config: Config | None = None,
    *,
    gated: bool = False,
) -> torch.Tensor:
    """``(M, K) @ W.T -> (M, N)`` with a group-wise int4 weight in the ``reference.quantize_int4`` layout.

    With ``gated``, x is ``(M, 2K)`` ``[gate | up]`` and the product is ``silu_and_mul(x) @ W.T``.

    Raises:
        ValueError: shapes, dtypes, strides or a group size the kernel cannot take.
    """
    check(packed.dim() == 2, f"packed must be (N, K/2), got {tuple(packed.shape)}")
    n, k2 = packed.shape
    k = 2 * k2
    _check_x(x, k, gated)
    check_dtype("packed", packed, torch.uint8)
    check(
        group_size >= 16 and group_size & (group_size - 1) == 0,
        f"group_size must be a power of two >= 16, got {group_size}",
    )
    check(k2 % group_size == 0, f"K ({k}) must be a multiple of 2 * group_size ({2 * group_size})")
    check(
        scales.shape == (n, k // group_size) and zeros.shape == scales.shape,
        f"scales and zeros must be ({n}, {k // group_size})",
    )
    if not can_launch(x, packed, scales, zeros):
        return reference.int4_matmul(reference.silu_and_mul(x) if gated else x, packed, scales, zeros, group_size)
    check_last_contiguous("x", x)
    check(
        packed.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous(),
        "packed, scales, zeros must be contiguous",
    )
    cfg = (
        config
        or _CONFIGS.get(("int4", x.shape[0], n, k))
        or _default_config("int4", x.shape[0], n, k2, group_size, x.device)
    )
    if cfg.path == "gemv":
        check(
            cfg.block_k % group_size == 0, f"GEMV block_k {cfg.block_k} must be a multiple of group_size {group_size}"
        )
    else:
        check(group_size % cfg.block_k == 0, f"tiled block_k {cfg.block_k} must divide group_size {group_size}")
    return _launch(
        _int4_kernel,
        x,
        n,
        k2,
        cfg,
        (packed, scales, zeros),
        (x.stride(0), packed.stride(0), scales.stride(0)),
        gated,
        G=group_size,
    )
