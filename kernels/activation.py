# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""SiLU-and-mul: ``silu(gate) * up`` over a fused ``[gate | up]`` projection, in one pass.

Owns the Triton kernel and its launcher; semantics are ``kernels.reference.silu_and_mul``, which
the launcher falls back to where no kernel can run.
"""

from __future__ import annotations

import torch

from kernels import reference
from kernels._common import can_launch, check, check_dtype, check_last_contiguous, pdl_args, tl, triton

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _silu_and_mul_kernel(
        x_ptr,  # (M, 2I) input: gate columns then up columns
        out_ptr,  # (M, I) output
        stride_x,  # row stride of x
        stride_out,  # row stride of out
        n_cols,  # columns of the output
        BLOCK: tl.constexpr,  # columns per program
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        pdl_enter(PDL)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``(M, 2I) -> (M, I)``: ``silu(x[:, :I]) * x[:, I:]`` in fp32, rounded once.

    Raises:
        ValueError: x is not 2-D with an even number of columns, or has an unsupported dtype.
    """
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be (M, 2I), got {tuple(x.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)
    if not can_launch(x):
        return reference.silu_and_mul(x)
    check_last_contiguous("x", x)
    M, n_cols = x.shape[0], x.shape[1] // 2
    out = torch.empty((M, n_cols), dtype=x.dtype, device=x.device)
    BLOCK = 1024
    _silu_and_mul_kernel[(M, triton.cdiv(n_cols, BLOCK))](
        x, out, x.stride(0), out.stride(0), n_cols, BLOCK=BLOCK, num_warps=4, **pdl_args(x)
    )
    return out
