# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Weight-only quantized matmul ``y = x @ W.T``: int8 per output channel and int4 group-wise asymmetric.

Two kernel shapes per format. The GEMV path (few rows, decode) streams the weight once with
elementwise FMAs and a row reduction, the rows of ``x`` adjacent in the grid so that their programs
share the weight tile through L2. The tiled path (many rows, prefill or large batches) dequantizes
a tile to the activation dtype and feeds ``tl.dot``. Both can split K over programs when the grid
would not fill the GPU; partial sums then go through an fp32 buffer reduced by ``torch.sum``
(deterministic, unlike atomics).

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
    def _int8_kernel(
        x_ptr,  # (M, K) activations
        w_ptr,  # (N, K) int8 weight
        s_ptr,  # (N,) per-row scales
        out_ptr,  # (M, N) output, or (SPLIT_K, M, N) fp32 partials
        M,  # rows of x
        N,  # output columns
        K,  # reduction length
        K_SPLIT,  # K columns per split (a multiple of BLOCK_K)
        sx_m,  # row stride of x
        sw_n,  # row stride of w
        so_s,  # out strides: split, row
        so_m,
        GEMV: tl.constexpr,  # FMA path (one row of x per program) instead of tl.dot
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
        k_end = K
        if GEMV:
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < k_end
                x = tl.load(x_ptr + rm * sx_m + rk, mask=kmask, other=0.0).to(tl.float32)  # (BLOCK_K,)
                w = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                acc2 += w.to(tl.float32) * x[None, :]
            acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < k_end
                x = tl.load(x_ptr + rm[:, None] * sx_m + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
                w = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                if DOT_F32:
                    acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
                else:
                    acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        s = tl.load(s_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        acc = acc * s[None, :]
        o = out_ptr + ks * so_s + rm[:, None] * so_m + rn[None, :]
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])

    @triton.jit
    def _int4_kernel(
        x_ptr,  # (M, K) activations
        w_ptr,  # (N, K/2) uint8: column j low nibble, column j + K/2 high nibble
        s_ptr,  # (N, K/G) scales
        z_ptr,  # (N, K/G) zeros: w = (q - 8) * scale + zero
        out_ptr,  # (M, N) output, or (SPLIT_K, M, N) fp32 partials
        M,  # rows of x
        N,  # output columns
        K2,  # K / 2: packed bytes per row
        K_SPLIT,  # bytes per split (a multiple of BLOCK_K)
        sx_m,  # row stride of x
        sw_n,  # row stride of w
        ss_n,  # row stride of scales and zeros
        so_s,  # out strides: split, row
        so_m,
        G: tl.constexpr,  # group size (columns per scale)
        GEMV: tl.constexpr,  # FMA path (one row of x per program) instead of tl.dot
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
        k_end = K2
        HI_GROUPS = K2 // G  # group index offset of the high half
        if GEMV and BLOCK_K == G:
            # one group per step and half: per-row scales, dequantize and FMA into a 2-D accumulator
            acc1 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < k_end
                b = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                b = b.to(tl.int32)
                gm = nmask & (k0 < k_end)
                g_off = rn * ss_n + k0 // G
                s_lo = tl.load(s_ptr + g_off, mask=gm, other=0.0).to(tl.float32)[:, None]
                z_lo = tl.load(z_ptr + g_off, mask=gm, other=0.0).to(tl.float32)[:, None]
                s_hi = tl.load(s_ptr + g_off + HI_GROUPS, mask=gm, other=0.0).to(tl.float32)[:, None]
                z_hi = tl.load(z_ptr + g_off + HI_GROUPS, mask=gm, other=0.0).to(tl.float32)[:, None]
                x_lo = tl.load(x_ptr + rm * sx_m + rk, mask=kmask, other=0.0).to(tl.float32)[None, :]
                x_hi = tl.load(x_ptr + rm * sx_m + K2 + rk, mask=kmask, other=0.0).to(tl.float32)[None, :]
                w_lo = ((b & 0xF).to(tl.float32) - 8.0) * s_lo + z_lo  # (BLOCK_N, BLOCK_K)
                w_hi = ((b >> 4).to(tl.float32) - 8.0) * s_hi + z_hi
                acc1 += w_lo * x_lo + w_hi * x_hi
            acc = tl.sum(acc1, axis=1)[None, :]  # (1, BLOCK_N)
        elif GEMV:
            NG: tl.constexpr = BLOCK_K // G  # groups per step and half
            acc2 = tl.zeros((BLOCK_N, NG), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < k_end
                rg = k0 // G + tl.arange(0, NG)
                gmask = nmask[:, None] & (rg < K2 // G)[None, :]
                b = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                b = b.to(tl.int32)
                x_lo = tl.load(x_ptr + rm * sx_m + rk, mask=kmask, other=0.0).to(tl.float32)  # (BLOCK_K,)
                x_hi = tl.load(x_ptr + rm * sx_m + K2 + rk, mask=kmask, other=0.0).to(tl.float32)
                # per group: scale * sum(q x) + (zero - 8 scale) * sum(x)
                qx_lo = tl.sum(tl.reshape((b & 0xF).to(tl.float32) * x_lo[None, :], (BLOCK_N, NG, G)), axis=2)
                qx_hi = tl.sum(tl.reshape((b >> 4).to(tl.float32) * x_hi[None, :], (BLOCK_N, NG, G)), axis=2)
                xs_lo = tl.sum(tl.reshape(x_lo, (NG, G)), axis=1)[None, :]  # (1, NG)
                xs_hi = tl.sum(tl.reshape(x_hi, (NG, G)), axis=1)[None, :]
                s_off = rn[:, None] * ss_n + rg[None, :]
                s_lo = tl.load(s_ptr + s_off, mask=gmask, other=0.0).to(tl.float32)
                z_lo = tl.load(z_ptr + s_off, mask=gmask, other=0.0).to(tl.float32)
                s_hi = tl.load(s_ptr + s_off + HI_GROUPS, mask=gmask, other=0.0).to(tl.float32)
                z_hi = tl.load(z_ptr + s_off + HI_GROUPS, mask=gmask, other=0.0).to(tl.float32)
                acc2 += s_lo * qx_lo + (z_lo - 8.0 * s_lo) * xs_lo + s_hi * qx_hi + (z_hi - 8.0 * s_hi) * xs_hi
            acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                kmask = rk < k_end
                b = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
                b = b.to(tl.int32)
                g_off = rn * ss_n + k0 // G  # one group per step and half: BLOCK_K divides G
                s_lo = tl.load(s_ptr + g_off, mask=nmask, other=0.0).to(tl.float32)[:, None]
                z_lo = tl.load(z_ptr + g_off, mask=nmask, other=0.0).to(tl.float32)[:, None]
                s_hi = tl.load(s_ptr + g_off + HI_GROUPS, mask=nmask, other=0.0).to(tl.float32)[:, None]
                z_hi = tl.load(z_ptr + g_off + HI_GROUPS, mask=nmask, other=0.0).to(tl.float32)[:, None]
                xmask = mmask[:, None] & kmask[None, :]
                x_lo = tl.load(x_ptr + rm[:, None] * sx_m + rk[None, :], mask=xmask, other=0.0)
                x_hi = tl.load(x_ptr + rm[:, None] * sx_m + K2 + rk[None, :], mask=xmask, other=0.0)
                w_lo = ((b & 0xF).to(tl.float32) - 8.0) * s_lo + z_lo  # (BLOCK_N, BLOCK_K)
                w_hi = ((b >> 4).to(tl.float32) - 8.0) * s_hi + z_hi
                if DOT_F32:
                    acc += tl.dot(x_lo.to(tl.float32), tl.trans(w_lo))
                    acc += tl.dot(x_hi.to(tl.float32), tl.trans(w_hi))
                else:
                    acc += tl.dot(x_lo, tl.trans(w_lo.to(x_lo.dtype)))
                    acc += tl.dot(x_hi, tl.trans(w_hi.to(x_hi.dtype)))
        o = out_ptr + ks * so_s + rm[:, None] * so_m + rn[None, :]
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def _launch(
    kernel: object,
    x: torch.Tensor,
    n: int,
    k_cols: int,
    cfg: Config,
    tensors: tuple[torch.Tensor, ...],
    strides: tuple[int, ...],
    **constexprs: int,
) -> torch.Tensor:
    """Run ``kernel`` over the grid ``cfg`` asks for and reduce split-K partials.

    ``k_cols`` is the K extent the kernel iterates (packed bytes per half for int4).
    """
    m = x.shape[0]
    per_split = -(-k_cols // cfg.split_k)
    k_split = -(-per_split // cfg.block_k) * cfg.block_k  # a multiple of the loop step
    split = -(-k_cols // k_split)
    gemv = cfg.path == "gemv"
    grid = (m if gemv else -(-m // cfg.block_m), -(-n // cfg.block_n), split)
    if split == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        so_s = 0
    else:
        out = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        so_s = out.stride(0)
    kernel[grid](  # type: ignore[index]
        x,
        *tensors,
        out,
        m,
        n,
        k_cols,
        k_split,
        *strides,
        so_s,
        out.stride(-2),
        **constexprs,
        GEMV=gemv,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        DOT_F32=dot_in_fp32() or x.dtype == torch.float32,
        num_warps=cfg.num_warps,
    )
    return out if split == 1 else out.sum(0).to(x.dtype)


def _check_x(x: torch.Tensor, k: int) -> None:
    check(x.dim() == 2 and x.shape[1] == k, f"x must be (M, {k}), got {tuple(x.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)


def int8_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, config: Config | None = None
) -> torch.Tensor:
    """``(M, K) @ (N, K).T -> (M, N)`` with an int8 per-channel weight (``reference.quantize_int8``).

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take.
    """
    check(qweight.dim() == 2, f"qweight must be (N, K), got {tuple(qweight.shape)}")
    n, k = qweight.shape
    _check_x(x, k)
    check_dtype("qweight", qweight, torch.int8)
    check(scales.shape == (n,), f"scales must be ({n},), got {tuple(scales.shape)}")
    if not can_launch(x, qweight, scales):
        return reference.int8_matmul(x, qweight, scales)
    check_last_contiguous("x", x)
    check_last_contiguous("qweight", qweight)
    check(scales.is_contiguous(), "scales must be contiguous")
    cfg = config or _CONFIGS.get(("int8", x.shape[0], n, k)) or _default_config("int8", x.shape[0], n, k, 1, x.device)
    return _launch(_int8_kernel, x, n, k, cfg, (qweight, scales), (x.stride(0), qweight.stride(0)))


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    config: Config | None = None,
) -> torch.Tensor:
    """``(M, K) @ W.T -> (M, N)`` with a group-wise int4 weight in the ``reference.quantize_int4`` layout.

    Raises:
        ValueError: shapes, dtypes, strides or a group size the kernel cannot take.
    """
    check(packed.dim() == 2, f"packed must be (N, K/2), got {tuple(packed.shape)}")
    n, k2 = packed.shape
    k = 2 * k2
    _check_x(x, k)
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
        return reference.int4_matmul(x, packed, scales, zeros, group_size)
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
        G=group_size,
    )
