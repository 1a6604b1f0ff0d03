# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Fused residual add + RMSNorm: one read of ``x`` and ``residual``, one write of each output.

Owns the Triton kernel and its launcher. The semantics (rounding points) are those of
``kernels.reference.rms_norm_residual``; the launcher falls back to it where no kernel can run.
The normed output can also be written as the int4 half2 GEMV reads it (``kernels.int4_gemv.XPairs``,
``kernels.reference.x_pairs``), beside its plain form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, next_pow2, pdl_args, tl, triton

if TYPE_CHECKING:
    from kernels.int4_gemv import XPairs

if triton is not None:
    from kernels._common import pdl_enter
    from kernels.int4_gemv import _write_pairs

    @triton.jit
    def _rms_norm_residual_kernel(
        x_ptr,  # (M, C) input activations
        res_ptr,  # (M, C) running residual (read only when HAS_RESIDUAL)
        w_ptr,  # (C,) norm weight
        out_ptr,  # (M, C) normed output
        h_ptr,  # (M, C) new residual x + residual (written only when HAS_RESIDUAL)
        pa_ptr,  # PAIRS: (M, C/4) int32 words of the output (int4_gemv.XPairs)
        pb_ptr,  # (M, C/4) int32
        xs_ptr,  # (M, C/G) fp32 group sums of the output
        stride_x,  # row stride of x
        stride_res,  # row stride of residual
        stride_out,  # row stride of out
        stride_h,  # row stride of h
        C,  # columns
        eps,  # variance epsilon
        HAS_RESIDUAL: tl.constexpr,  # add the residual first
        BLOCK_C: tl.constexpr,  # power of two >= C: one program holds a whole row
        PAIRS: tl.constexpr = False,  # also write the output as XPairs
        G: tl.constexpr = 0,  # PAIRS: the columns of a group sum
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        mask = cols < C
        # NOTE(h7): the norm weight is no earlier kernel's output: read before the PDL wait, not after
        # the row's reduction, where its round trip to memory stood between the sum and the store
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        pdl_enter(PDL)
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
            # round the sum to the activation dtype first, as a torch add in that dtype does
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            tl.store(h_ptr + row * stride_h + cols, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / C + eps)
        normed = (xf * rstd).to(x.dtype).to(tl.float32)
        y = (w * normed).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_out + cols, y, mask=mask)
        if PAIRS:
            _write_pairs(y.to(tl.float32), row, C, pa_ptr, pb_ptr, xs_ptr, G)


def rms_norm_residual(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    pairs: XPairs | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * rmsnorm(x + residual), x + residual)`` over ``(M, C)`` rows; see the reference.

    ``pairs``: also fill these with the normed output (bf16 or fp16), as the int4 GEMV after the norm
    reads it (``kernels.int4_matmul.pairs_for``).

    Raises:
        ValueError: shapes, dtypes or strides the kernel cannot take.
    """
    check(x.dim() == 2, f"x must be (M, C), got {tuple(x.shape)}")
    M, C = x.shape
    check(weight.shape == (C,), f"weight must be ({C},), got {tuple(weight.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)
    if residual is not None:
        check(residual.shape == x.shape, f"residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
        check(residual.dtype == x.dtype, f"residual dtype {residual.dtype} must match x {x.dtype}")
    if pairs is not None:
        check(x.dtype in (torch.float16, torch.bfloat16), f"pairs need bf16 or fp16 x, got {x.dtype}")
        check(
            pairs.pa.shape == pairs.pb.shape == (M, C // 4) and pairs.sums.shape == (M, C // pairs.group_size),
            f"pairs must be ({M}, {C // 4}) words and ({M}, {C // pairs.group_size}) sums",
        )
        check(C % (2 * pairs.group_size) == 0, f"C ({C}) must be a multiple of 2 * group_size ({pairs.group_size})")
    tensors = [x, weight] + ([residual] if residual is not None else [])
    if not can_launch(*tensors):
        out, h = reference.rms_norm_residual(x, residual, weight, eps)
        if pairs is not None:
            for buf, value in zip(
                (pairs.pa, pairs.pb, pairs.sums), reference.x_pairs(out, pairs.group_size), strict=True
            ):
                buf.copy_(value)
        return out, h
    for name, t in (("x", x), ("weight", weight), ("residual", residual)):
        if t is not None:
            check_last_contiguous(name, t)
    out = torch.empty_like(x)
    h = torch.empty_like(x) if residual is not None else x
    res = residual if residual is not None else x
    BLOCK_C = next_pow2(C)
    _rms_norm_residual_kernel[(M,)](
        x,
        res,
        weight,
        out,
        h,
        *((pairs.pa, pairs.pb, pairs.sums) if pairs is not None else (out, out, out)),  # else never read
        x.stride(0),
        res.stride(0),
        out.stride(0),
        h.stride(0),
        C,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_C=BLOCK_C,
        PAIRS=pairs is not None,
        G=pairs.group_size if pairs is not None else 0,
        num_warps=min(16, max(1, BLOCK_C // 256)),
        **pdl_args(x),
    )
    return out, h
