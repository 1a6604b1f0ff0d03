"""Weight-only quantization of linear layers for the CPU: int8 per output channel, int4 per group.

Owns turning a float weight ``(N, K)`` into a quantized weight, the matmul over it (torch's CPU
kernels ``_weight_int8pack_mm`` and ``_weight_int4pack_mm_for_cpu``), its dequantization and a
plain fp32 reference. Does not own which layers are quantized (``models.linear`` and
``models.llama``) nor the engine switch (``EngineConfig.quantization``).

Decode on a CPU is memory-bound: each step reads every weight once, so storing them in 8 or 4 bits
cuts the bytes read per token by 4x or ~7x against fp32. Activations stay in float.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from selfhost.config import Quantization

INT4_GROUP_SIZES = (32, 64, 128, 256)
"""Group sizes the int4 CPU kernel accepts."""

ACTIVATION_DTYPE = torch.bfloat16
"""The dtype both CPU kernels read activations in and return results in."""

# NOTE(crossway): both CPU kernels are fast only with bfloat16 activations and scales (fp32
# activations take a scalar path ~10x slower in torch 2.13), so inputs are rounded to bf16 and the
# kernel's bf16 output is widened back. Every row goes through the kernel, prefill included, though
# for many rows MKL's fp32 GEMM on a dequantized weight is 2-3x faster: the kernels give each row
# the same bits whatever the row count (checked), and a dequantized path differs from them in rare
# last bits, which flipped greedy tokens between a request alone and in a batch.


@dataclass(frozen=True, slots=True)
class Int8Weight:
    """Symmetric per-output-channel int8: ``w[n, k] ~= qweight[n, k] * scales[n]``."""

    qweight: torch.Tensor
    """(N, K) int8 in [-127, 127]."""
    scales: torch.Tensor
    """(N,) bf16."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight occupies."""
        return _nbytes(self.qweight, self.scales)


@dataclass(frozen=True, slots=True)
class Int4Weight:
    """Asymmetric int4 per group of ``group_size`` input columns: ``w ~= (q - 8) * scale + zero``."""

    packed: torch.Tensor
    """(N, K/2) uint8: the values in the CPU kernel's tiled nibble layout."""
    scales_zeros: torch.Tensor
    """(K/G, N, 2) bf16: each group's scale and zero (``zero = min + 8 * scale``)."""
    group_size: int
    """Input columns per group G."""

    @property
    def nbytes(self) -> int:
        """Bytes the weight occupies."""
        return _nbytes(self.packed, self.scales_zeros)


QuantizedWeight = Int8Weight | Int4Weight


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def int8_supported(weight: torch.Tensor) -> bool:
    """Whether the int8 kernel takes this ``(N, K)`` weight.

    NOTE(crossway): in torch 2.13 ``_weight_int8pack_mm`` returns wrong rows, or crashes, for K not a
    multiple of 32 on AVX512 hosts (multiples of 8 were enough on AVX2), so such layers stay in float.
    """
    return weight.dim() == 2 and weight.device.type == "cpu" and weight.shape[1] % 32 == 0


def int4_supported(weight: torch.Tensor, group_size: int) -> bool:
    """Whether the int4 kernel takes this ``(N, K)`` weight (N a multiple of 16, K of the group size)."""
    n, k = weight.shape
    return weight.device.type == "cpu" and group_size in INT4_GROUP_SIZES and n % 16 == 0 and k % group_size == 0


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Quantize a float ``(N, K)`` weight to int8 with one bf16 scale per output row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-8).to(torch.bfloat16)  # (N,)
    # NOTE(crossway): round with the bf16 scale the kernel will use, not the exact fp32 one.
    q = torch.round(w / scales.float().unsqueeze(1)).clamp(-127, 127).to(torch.int8)  # (N, K)
    return Int8Weight(q.contiguous(), scales.contiguous())


def quantize_int4(weight: torch.Tensor, group_size: int = 32) -> Int4Weight:
    """Quantize a float ``(N, K)`` weight to int4 with a bf16 scale and zero per row and group of columns."""
    w = weight.detach().float()
    n, k = w.shape
    groups = w.reshape(n, k // group_size, group_size)  # (N, K/G, G)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # (N, K/G)
    scales = ((hi - lo) / 15.0).clamp(min=1e-6).to(torch.bfloat16)
    zeros = (lo + 8.0 * scales.float()).to(torch.bfloat16)  # the kernel computes (q - 8) * scale + zero
    s, z = scales.float().unsqueeze(-1), zeros.float().unsqueeze(-1)  # (N, K/G, 1)
    q = torch.round((groups - z) / s + 8.0).clamp(0, 15).reshape(n, k)  # (N, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)  # (N, K/2) uint8
    scales_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()  # (K/G, N, 2)
    return Int4Weight(packed, scales_zeros, group_size)


def quantize(weight: torch.Tensor, mode: Quantization, group_size: int = 32) -> QuantizedWeight | None:
    """Quantize ``weight`` as ``mode`` asks, or return None when the kernels cannot take its shape.

    int4 falls back to int8 for shapes only the int8 kernel takes (N not a multiple of 16, or K not
    a multiple of the group size).
    """
    if mode == "int4" and int4_supported(weight, group_size):
        return quantize_int4(weight, group_size)
    if mode in ("int8", "int4") and int8_supported(weight):
        return quantize_int8(weight)
    return None


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """The fp32 ``(N, K)`` weight that ``qw`` stands for."""
    if isinstance(qw, Int8Weight):
        return qw.qweight.float() * qw.scales.float().unsqueeze(1)
    # NOTE(crossway): the packed layout is the kernel's own tiling, so unpack through the kernel:
    # the identity in fp32 (the kernel's exact but slow fp32 path) yields (q - 8) * scale + zero.
    k = qw.scales_zeros.shape[0] * qw.group_size
    eye = torch.eye(k, dtype=torch.float32)
    w_t: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
        eye, qw.packed, qw.group_size, qw.scales_zeros.float()
    )  # (K, N)
    return w_t.t().contiguous()


def quantized_linear(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """``x @ w.T`` for ``(M, K)`` float inputs; returns ``(M, N)`` in ``x``'s dtype."""
    return quantized_matmul(x, qw).to(x.dtype)


def quantized_matmul(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """``x @ w.T`` for ``(M, K)`` float inputs (rounded to bf16 unless they are); returns ``(M, N)`` bf16."""
    xb = x if x.dtype == ACTIVATION_DTYPE else x.bfloat16()  # a call less where the norm already rounded
    y: torch.Tensor
    if isinstance(qw, Int8Weight):
        y = torch.ops.aten._weight_int8pack_mm(xb, qw.qweight, qw.scales)  # (M, N) bf16
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, qw.packed, qw.group_size, qw.scales_zeros)
    return y


def quantized_linear_reference(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """The plain fp32 reference: ``x`` times the dequantized weight, no bf16 rounding anywhere."""
    return x.float() @ dequantize(qw).t()
