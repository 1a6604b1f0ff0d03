# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Dense GEMV ``y = x @ W.T`` for a few rows of ``x`` and a float (bf16, fp16, fp32) weight.

The decode step's projections at batch 1-4 on the GPU: cuBLAS would do the arithmetic as fast, but
a step of a small model is ~270 kernels of a few microseconds each, so what sets its time is the
gaps between them. This kernel takes part in programmatic dependent launch like every Triton
kernel here (``kernels._common.pdl_args``) and can write SiLU-and-mul of a ``[gate; up]`` weight's
product (``glu``) or rotary and the KV cache of a ``[q; k; v]`` one (``rope``), which removes that
op's own launch. It is the int8 kernel's GEMV path (``kernels.quant_matmul``) without the
dequantization: one row of x per program, rows adjacent in the grid so their programs share a
weight tile through L2, split-K finished inside the launch (``kernels._matmul_launch``).

Owns the kernel and its launcher. Does not own when the model uses it (``selfhost.models.linear``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels._common import can_launch, check, check_dtype, check_last_contiguous, tl, triton
from kernels._matmul_config import GEMV_MAX_ROWS, Config, config_for
from kernels._matmul_launch import check_epilogue, finish_unfused, launch

if TYPE_CHECKING:
    from kernels.rope_kv import RopeKV

__all__ = ["GEMV_MAX_ROWS", "MODEL_ROWS", "dense_gemv"]

MODEL_ROWS = 1
"""Rows of x up to which a model's float linear takes this kernel on the GPU rather than cuBLAS.

NOTE(h7): one row per program, so each row streams the weight again where L2 does not catch it.
On the H100 over a Llama-3-8B shape, every layer's config tuned (``bench.engine_gpu``): batch 1
162.5 tok/s against 155.1 for cuBLAS, but batch 2 286.6 and batch 4 398.4 tok/s against 308.8
and 612.9 for cuBLAS."""

if triton is not None:
    from kernels._common import WEIGHT_EVICTION, pdl_enter
    from kernels._matmul_launch import _program_tile, _store_tile
    from kernels.rope_kv import _rope_rows

    @triton.jit
    def _dense_step(acc2, w, x_row, rk, K):
        """One K step: ``acc2 + w * x[rk]`` with x's columns ``rk`` (masked at K) widened to fp32."""
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)  # (BLOCK_K,)
        return acc2 + w.to(tl.float32) * x[None, :]

    @triton.jit
    def _dense_gemv_kernel(
        x_ptr,  # (M, K) activations
        w_ptr,  # (N, K) float weight
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
        GEMV: tl.constexpr,  # always True here (``launch`` passes it to every matmul kernel)
        GLU: tl.constexpr,  # w is [gate; up]: write silu(x @ gate.T) * (x @ up.T) (_tile_rows)
        ROPE: tl.constexpr,  # half the head dim: w is [q; k; v], write rotary q and the caches; 0: no rotary
        BLOCK_M: tl.constexpr,  # unused (the tiled path's rows per program)
        BLOCK_N: tl.constexpr,  # output columns per program
        BLOCK_K: tl.constexpr,  # K per loop step
        DOT_F32: tl.constexpr,  # unused (no tl.dot)
        PREFETCH: tl.constexpr = False,  # load the first weight tile before the PDL wait (Config.prefetch)
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        rm, mmask, rn, nmask = _program_tile(M, N, BLOCK_M, BLOCK_N, GEMV, GLU, ROPE)
        pos, slot = _rope_rows(pos_ptr, slot_ptr, rm, mmask, ROPE)  # before the PDL wait
        k_lo = tl.program_id(2) * K_SPLIT
        w_ptrs = w_ptr + rn[:, None] * sw_n
        # per-column partial sums, reduced once after the loop: the same order for every row and batch
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        if PREFETCH:
            # NOTE(h7): no earlier kernel writes the weight, so its first tile may load before the PDL
            # wait and be in flight while that kernel finishes (kernels._common.pdl_enter)
            rk = k_lo + tl.arange(0, BLOCK_K)
            w = tl.load(
                w_ptrs + rk[None, :],
                mask=nmask[:, None] & (rk < K)[None, :],
                other=0.0,
                eviction_policy=WEIGHT_EVICTION,
            )
        pdl_enter(PDL)
        if PREFETCH:
            acc2 = _dense_step(acc2, w, x_ptr + rm * sx_m, rk, K)
        # NOTE(h7): a constexpr offset, not a value out of an if / else: such a loop bound doubled the
        # int4 GEMV's registers even without the prefetch (127 -> 255, twice the weight loads in its PTX)
        k_first = k_lo + BLOCK_K * PREFETCH
        for k0 in range(k_first, k_lo + K_SPLIT, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(
                w_ptrs + rk[None, :],
                mask=nmask[:, None] & (rk < K)[None, :],
                other=0.0,
                eviction_policy=WEIGHT_EVICTION,
            )
            acc2 = _dense_step(acc2, w, x_ptr + rm * sx_m, rk, K)
        acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
        _store_tile(
            acc, rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, M * N, cnt_ptr, N, NSPLIT, GLU,
            pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE,
        )  # fmt: skip


def dense_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: Config | None = None,
    *,
    glu: bool = False,
    rope: RopeKV | None = None,
) -> torch.Tensor:
    """``(M, K) @ (N, K).T -> (M, N)`` in x's dtype, one program row per row of x (meant for M <= 4).

    With ``glu``, W is ``[gate; up]`` and the result ``silu_and_mul(x @ W.T)``, ``(M, N/2)``, the
    product rounded to x's dtype before the activation as the two launches would. With ``rope``, W
    is ``[q; k; v]`` and the result the rotated queries (``RopeKV``).

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take, or a tiled ``config``.
    """
    check(weight.dim() == 2, f"weight must be (N, K), got {tuple(weight.shape)}")
    n, k = weight.shape
    check(x.dim() == 2 and x.shape[1] == k, f"x must be (M, {k}), got {tuple(x.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)
    check_dtype("weight", weight, torch.float32, torch.float16, torch.bfloat16)
    check_epilogue(n, glu, rope)
    if not can_launch(x, weight):
        return finish_unfused((x.float() @ weight.float().T).to(x.dtype), glu, rope)
    check_last_contiguous("x", x)
    check_last_contiguous("weight", weight)
    cfg = config or config_for("dense", x.shape[0], n, k, k, 0, x.device)
    check(cfg.path == "gemv", f"dense_gemv has only the GEMV path, got {cfg.path}")
    return launch(_dense_gemv_kernel, x, n, k, cfg, (weight,), (x.stride(0), weight.stride(0)), glu, rope)
