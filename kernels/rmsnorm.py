# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Fused residual add + RMSNorm: one read of ``x`` and ``residual``, one write of each output.

Owns the Triton kernel and its launcher. The semantics (rounding points) are those of
``kernels.reference.rms_norm_residual``; the launcher falls back to it where no kernel can run.
"""

from __future__ import annotations

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, next_pow2, pdl_args, tl, triton

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _rms_norm_residual_kernel(
        x_ptr,  # (M, C) input activations
        res_ptr,  # (M, C) running residual (read only when HAS_RESIDUAL)
        w_ptr,  # (C,) norm weight
        out_ptr,  # (M, C) normed output
        h_ptr,  # (M, C) new residual x + residual (written only when HAS_RESIDUAL)
        stride_x,  # row stride of x
        stride_res,  # row stride of residual
        stride_out,  # row stride of out
        stride_h,  # row stride of h
        C,  # columns
        eps,  # variance epsilon
        HAS_RESIDUAL: tl.constexpr,  # add the residual first
        BLOCK_C: tl.constexpr,  # power of two >= C: one program holds a whole row
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
        tl.store(out_ptr + row * stride_out + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_residual(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * rmsnorm(x + residual), x + residual)`` over ``(M, C)`` rows; see the reference.

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
    tensors = [x, weight] + ([residual] if residual is not None else [])
    if not can_launch(*tensors):
        return reference.rms_norm_residual(x, residual, weight, eps)
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
        x.stride(0),
        res.stride(0),
        out.stride(0),
        h.stride(0),
        C,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_C=BLOCK_C,
        num_warps=min(16, max(1, BLOCK_C // 256)),
        **pdl_args(x),
    )
    return out, h
