"""GGUF Q4_1 and Q8_0 blocks repacked, without rounding, into the quantized matmuls' layouts.

A GGUF tensor of an ``(N, K)`` weight is ``N`` rows of ``K / 32`` blocks (``gguf.GGUFReader`` hands
them over as an ``(N, bytes per row)`` uint8 array). One block of 32 columns is:

- Q4_1, 20 bytes: fp16 ``d``, fp16 ``m``, then 16 bytes whose low nibbles hold columns 0-15 and
  high nibbles columns 16-31; ``w = d * q + m`` with ``q`` in 0..15.
- Q8_0, 34 bytes: fp16 ``d``, then 32 int8 ``q``; ``w = d * q``.

Q4_1 becomes the int4 layout of ``kernels.reference.quantize_int4`` with group 32: the same
nibbles, ``scale = d`` (fp16, as stored) and ``zero = m + 8 d`` in fp32, so ``(q - 8) * scale +
zero`` is GGUF's weight up to one fp32 rounding. Q8_0 becomes per-group int8 (``int8_matmul`` with
``group_size=32``) with its fp16 ``d`` as scales. Every step is a whole-tensor torch op on the
weight's device.

Owns the byte layouts and the repacking. Does not own reading GGUF files (``selfhost.loader``),
which model tensors are loaded this way (``selfhost.models.gguf_native``) nor the kernels.
"""

from __future__ import annotations

import torch

BLOCK = 32
"""Columns per GGUF block (Q4_0, Q4_1, Q5_x, Q8_0)."""
Q4_1_BYTES = 20
"""Bytes per Q4_1 block: fp16 d, fp16 m, 16 bytes of nibbles."""
Q8_0_BYTES = 34
"""Bytes per Q8_0 block: fp16 d, 32 int8."""


class BlockLayoutError(ValueError):
    """The bytes do not form whole blocks of the claimed type, or K does not fit the kernel layout."""


def _blocks(raw: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """``(N, K/32 * block_bytes)`` uint8 -> ``(N, K/32, block_bytes)``."""
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise BlockLayoutError(f"raw blocks must be 2-D uint8, got {raw.dtype} {tuple(raw.shape)}")
    if raw.shape[1] % block_bytes:
        raise BlockLayoutError(f"a row of {raw.shape[1]} bytes is not whole {block_bytes}-byte blocks")
    return raw.reshape(raw.shape[0], raw.shape[1] // block_bytes, block_bytes)


def _fp16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian fp16 at byte ``start`` of every block: ``(N, K/32)``."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16).squeeze(-1)


def q4_1_values(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpack Q4_1 rows: ``(q (N, K) uint8 in 0..15, d (N, K/32) fp16, m (N, K/32) fp16)``."""
    blocks = _blocks(raw, Q4_1_BYTES)
    nibbles = blocks[..., 4:]  # (N, K/32, 16)
    q = torch.cat((nibbles & 0xF, nibbles >> 4), dim=-1)  # (N, K/32, 32): columns 0-15, then 16-31
    return q.reshape(raw.shape[0], -1), _fp16(blocks, 0), _fp16(blocks, 2)


def q8_0_values(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack Q8_0 rows: ``(q (N, K) int8, d (N, K/32) fp16)``."""
    blocks = _blocks(raw, Q8_0_BYTES)
    q = blocks[..., 2:].contiguous().view(torch.int8)  # (N, K/32, 32)
    return q.reshape(raw.shape[0], -1), _fp16(blocks, 0)


def q4_1_to_int4(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1 rows -> ``(packed (N, K/2) uint8, scales (N, K/32) fp16, zeros (N, K/32) fp32)`` for ``int4_matmul``.

    Raises:
        BlockLayoutError: the bytes are not Q4_1 rows, or K is not a multiple of 64 (the int4
            layout pairs column j with j + K/2 inside whole groups).
    """
    q, d, m = q4_1_values(raw)
    k = q.shape[1]
    if k % (2 * BLOCK):
        raise BlockLayoutError(f"the int4 layout needs K ({k}) to be a multiple of {2 * BLOCK}")
    packed = q[:, : k // 2] | (q[:, k // 2 :] << 4)  # (N, K/2)
    # NOTE(gguf_native): fp32, not bf16, for m + 8 d: both are fp16 of similar magnitude, so the
    # fp32 sum is exact for all but far-apart exponents, and bf16 would drop 3 bits of d.
    zeros = m.float() + 8.0 * d.float()
    return packed.contiguous(), d.contiguous(), zeros.contiguous()


def q8_0_to_int8(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 rows -> ``(qweight (N, K) int8, scales (N, K/32) fp16)`` for ``int8_matmul(..., group_size=32)``.

    Raises:
        BlockLayoutError: the bytes are not Q8_0 rows.
    """
    q, d = q8_0_values(raw)
    return q.contiguous(), d.contiguous()


def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """GGUF's own fp32 ``(N, K)`` weight of Q4_1 rows, ``d * q + m`` (the tests' oracle beside gguf-py)."""
    q, d, m = q4_1_values(raw)
    n, k = q.shape
    w = d.float().unsqueeze(-1) * q.reshape(n, k // BLOCK, BLOCK).float() + m.float().unsqueeze(-1)
    return w.reshape(n, k)


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """GGUF's own fp32 ``(N, K)`` weight of Q8_0 rows, ``d * q``."""
    q, d = q8_0_values(raw)
    n, k = q.shape
    return (q.reshape(n, k // BLOCK, BLOCK).float() * d.float().unsqueeze(-1)).reshape(n, k)
