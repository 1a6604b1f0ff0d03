"""A linear layer whose weight is either a float parameter or a weight-only quantized tensor.

Owns the switch between ``F.linear`` and ``quant.quantized_linear``. Does not own the quantization
formats (``quant``) nor which layers a model has (``llama``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)
from torch import nn

from selfhost.models import kernel_quant, quant

if TYPE_CHECKING:
    from kernels.int4_gemv import XPairs
    from kernels.rope_kv import RopeKV
    from selfhost.config import Quantization


def param(*shape: int) -> nn.Parameter:
    """An uninitialised frozen parameter (weights are loaded afterwards)."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    """``y = x W^T + b`` over ``(M, in_features)`` inputs; ``quantize`` swaps W for int8 or int4 in place."""

    weight: nn.Parameter | None
    bias: nn.Parameter | None

    def __init__(self, in_features: int, out_features: int, bias: bool, weight: nn.Parameter | None = None) -> None:
        """Args: ``weight`` shares an existing ``(out, in)`` parameter (a tied LM head) instead of a new one."""
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = weight if weight is not None else param(out_features, in_features)
        self.bias = param(out_features) if bias else None
        # NOTE(crossway): a plain attribute, not buffers: ``.to(device)`` does not move it, so
        # quantize after the model sits on its device (the layout depends on it).
        self.qweight: quant.QuantizedWeight | kernel_quant.KernelWeight | None = None
        self.in_dtype: torch.dtype | None = None
        """The dtype the weight's kernel reads activations in (bf16 for the CPU int8/int4 kernels); None: any."""

    def quantize(self, mode: Quantization, group_size: int = 32, kernels: bool | None = None) -> None:
        """Replace the float weight by its quantized form (a no-op for ``none`` or shapes the kernels cannot take).

        ``kernels`` picks the Triton kernels' layouts (``kernel_quant``) over the CPU ones; None
        picks them when the weight sits on a GPU.
        """
        if mode == "none" or self.weight is None:
            return
        use_kernels = self.weight.device.type == "cuda" if kernels is None else kernels
        qw: quant.QuantizedWeight | kernel_quant.KernelWeight | None
        if use_kernels:
            qw = kernel_quant.quantize(self.weight.data, mode, group_size)
        else:
            qw = quant.quantize(self.weight.data, mode, group_size)
        if qw is None:
            return
        self.qweight = qw
        self.in_dtype = quant.ACTIVATION_DTYPE if isinstance(qw, quant.Int8Weight | quant.Int4Weight) else None
        self.weight = None  # a tied embedding keeps its own reference

    @property
    def weight_bytes(self) -> int:
        """Bytes one pass over the layer reads for its weight and bias."""
        w = self.qweight.nbytes if self.qweight is not None else 0
        for p in (self.weight, self.bias):
            if p is not None:
                w += p.numel() * p.element_size()
        return w

    def x_pairs(self, m: int, dtype: torch.dtype) -> XPairs | None:
        """Room for ``m`` rows of input as this layer's int4 GEMV reads them, for the norm before it to fill; else None.

        ``kernel_quant.x_pairs``; a layer with a bias adds it after a plain product, so takes none.
        """
        qw = self.qweight
        if self.bias is not None or not isinstance(qw, kernel_quant.KernelInt4Weight):
            return None
        return kernel_quant.x_pairs(qw, m, dtype)

    def forward(
        self, x: torch.Tensor, *, glu: bool = False, rope: RopeKV | None = None, pairs: XPairs | None = None
    ) -> torch.Tensor:
        """``(M, in)`` -> ``(M, out)`` in ``x``'s dtype, with ``project``'s epilogues."""
        return self.project(x, glu=glu, rope=rope, pairs=pairs).to(x.dtype)

    def project(
        self, x: torch.Tensor, *, glu: bool = False, rope: RopeKV | None = None, pairs: XPairs | None = None
    ) -> torch.Tensor:
        """``(M, in)`` -> ``(M, out)`` in the dtype the kernel returns: bf16 for the CPU int8/int4 kernels, else ``x``'s.

        ``glu``: the weight is ``[gate; up]`` and the result ``silu_and_mul`` of the product,
        ``(M, out / 2)``. ``rope``: the weight is ``[q; k; v]`` heads, the result the rotated
        queries ``(M, q_size)``, and the keys and values are in ``rope``'s caches
        (``kernels.rope_kv.RopeKV``). The Triton GEMVs do either as they write their tiles, the
        other paths run the op after. ``pairs``: x once more as ``x_pairs`` made room for, filled by
        the norm before (the int4 GEMV reads them instead of x).

        NOTE(crossway): the decoder's CPU path calls this, not ``forward``, so that a bf16 output
        feeding a residual add or the next bf16 kernel is not widened and rounded again: each dtype
        cast is a torch op, and at batch 1 the ops' count, not their size, sets the time.
        """
        if (glu or rope is not None) and self.bias is not None:  # the bias goes in before the epilogue
            return _epilogue(self.project(x), glu, rope)
        qw = self.qweight
        if isinstance(qw, kernel_quant.KernelInt8Weight | kernel_quant.KernelInt4Weight):
            y = kernel_quant.linear(x, qw, glu=glu, rope=rope, pairs=pairs)
        elif qw is not None:
            y = _epilogue(quant.quantized_matmul(x, qw), glu, rope)
        else:
            assert self.weight is not None  # noqa: S101 (narrowing)
            if not x.is_cuda:
                return _epilogue(F.linear(x, self.weight, self.bias), glu, rope)
            from kernels.dense_gemv import MODEL_ROWS, dense_gemv  # triton: only where it runs

            if x.shape[0] > MODEL_ROWS:
                return _epilogue(F.linear(x, self.weight, self.bias), glu, rope)
            # NOTE(h7): a Triton GEMV instead of cuBLAS at batch 1: it joins the programmatic
            # dependent launch chain of the other kernels and fuses SiLU-and-mul (SmolLM2 bf16
            # batch 1 on the H100: 1.036 ms a token with cuBLAS, 0.800 with it)
            y = dense_gemv(x, self.weight, glu=glu, rope=rope)
        return y if self.bias is None else y + self.bias


def _epilogue(y: torch.Tensor, glu: bool, rope: RopeKV | None) -> torch.Tensor:
    """``project``'s epilogue as its own launches, after a product that did not apply it."""
    if not glu and rope is None:
        return y
    from kernels._matmul_launch import finish_unfused  # triton: imported only where an epilogue runs

    return finish_unfused(y, glu, rope)
