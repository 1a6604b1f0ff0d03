"""Weight-only quantized linear layers on the Triton kernels (the GPU path): int8 per channel, int4 per group.

Owns the quantize-on-load of one float weight into the layouts of ``kernels.reference``
(``quantize_int8``, ``quantize_int4``) and the matmuls over them (``kernels.quant_matmul``,
``kernels.int4_matmul``); GGUF blocks loaded as they are (``models.gguf_native``) use the same
weight classes. Does not own the CPU formats (``models.quant``), which layers are quantized
(``models.llama``) nor the kernels themselves (``kernels/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kernels.int4_gemv import XPairs
    from kernels.rope_kv import RopeKV
    from selfhost.config import Quantization


@dataclass(frozen=True, slots=True)
class KernelInt8Weight:
    """Symmetric int8: ``w[n, k] ~= qweight[n, k] * scales[n]``, or ``scales[n, k // group_size]`` per group."""

    qweight: torch.Tensor
    """(N, K) int8."""
    scales: torch.Tensor
    """(N,) bf16 per output channel, or (N, K/G) per group (fp16 from GGUF Q8_0 blocks)."""
    group_size: int = 0
    """Input columns per scale; 0: one scale per row."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight occupies."""
        return _nbytes(self.qweight, self.scales)


@dataclass(frozen=True, slots=True)
class KernelInt4Weight:
    """Asymmetric int4 per group of ``group_size`` input columns: ``w ~= (q - 8) * scale + zero``."""

    packed: torch.Tensor
    """(N, K/2) uint8: column j in the low nibble of byte j, column j + K/2 in its high nibble."""
    scales: torch.Tensor
    """(N, K/G) bf16."""
    zeros: torch.Tensor
    """(N, K/G) bf16."""
    group_size: int
    """Input columns per group G."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight occupies."""
        return _nbytes(self.packed, self.scales, self.zeros)


KernelWeight = KernelInt8Weight | KernelInt4Weight


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def quantize(weight: torch.Tensor, mode: Quantization, group_size: int) -> KernelWeight | None:
    """Quantize a float ``(N, K)`` weight on its own device; None for ``none`` or a K the int4 layout cannot pack."""
    from kernels import reference

    if mode == "int8":
        q, s = reference.quantize_int8(weight)
        return KernelInt8Weight(q, s)
    if mode == "int4":
        if weight.shape[1] % (2 * group_size):
            return None  # the packed layout pairs column j with j + K/2 inside whole groups
        packed, scales, zeros = reference.quantize_int4(weight, group_size)
        return KernelInt4Weight(packed, scales, zeros, group_size)
    return None


def x_pairs(qw: KernelInt4Weight, m: int, dtype: torch.dtype) -> XPairs | None:
    """Room for ``m`` rows of x as ``qw``'s int4 GEMV reads them (``kernels.int4_gemv.XPairs``), or None where it reads x."""
    from kernels.int4_matmul import pairs_for

    return pairs_for(m, qw.packed, qw.group_size, dtype)


def linear(
    x: torch.Tensor,
    qw: KernelWeight,
    *,
    glu: bool = False,
    rope: RopeKV | None = None,
    pairs: XPairs | None = None,
) -> torch.Tensor:
    """``(M, K) @ W.T -> (M, N)`` in x's dtype, through the kernel (or its reference off CUDA without the interpreter).

    ``glu``: W is ``[gate; up]`` and the result ``silu_and_mul(x @ W.T)``, ``(M, N / 2)``; ``rope``:
    W is ``[q; k; v]`` and the result the rotated queries (``kernels.rope_kv.RopeKV``). ``pairs``: x
    as ``x_pairs`` made room for, filled by the kernel before (an int4 weight reads them instead of x).
    """
    from kernels.int4_matmul import int4_matmul
    from kernels.quant_matmul import int8_matmul

    if isinstance(qw, KernelInt8Weight):
        return int8_matmul(x, qw.qweight, qw.scales, group_size=qw.group_size, glu=glu, rope=rope)
    return int4_matmul(x, qw.packed, qw.scales, qw.zeros, qw.group_size, glu=glu, rope=rope, pairs=pairs)
