"""Plain-torch definitions of every kernel in this package: the CPU path and the tests' oracle.

Owns the exact semantics of each op (what is computed in fp32, where results are rounded to the
activation dtype) and the GPU layout of weight-only quantized weights (``quantize_int8``,
``quantize_int4``, ``dequantize_int4``). Does not own launching Triton kernels (one file per op
beside this one) nor which model layers use them (``selfhost.models``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)


def rms_norm_residual(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (rounded to x's dtype), then ``weight * rmsnorm(h)`` as Hugging Face Llama does.

    Args:
        x: ``(M, C)`` activations.
        residual: ``(M, C)`` running residual, or None for the first norm of the stack.
        weight: ``(C,)`` norm weight.
        eps: variance epsilon.

    Returns:
        ``(out, h)``: the normed ``(M, C)`` output and the new residual ``h``, both in x's dtype.
    """
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)  # (M, C)
    out = (weight.float() * normed.float()).to(x.dtype)
    return out, h


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]`` of shape ``(M, 2I)``, computed in fp32, rounded once."""
    gate, up = x.float().chunk(2, dim=-1)  # 2 x (M, I)
    return (F.silu(gate) * up).to(x.dtype)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``(B, V) -> (B,)`` int64: each row's first index of its maximum, a NaN counting as the maximum (torch's)."""
    return x.argmax(dim=-1)


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate ``q`` in place and write rotated ``k`` and plain ``v`` into the paged caches.

    Rotation is the ``rotate_half`` (GPT-NeoX) form: ``x1' = x1 cos - x2 sin``, ``x2' = x2 cos + x1 sin``
    over the two halves of each head, computed in fp32 and rounded once.

    Args:
        q: ``(N, nh, hd)`` queries, rotated in place.
        k: ``(N, nkv, hd)`` new keys (left unchanged).
        v: ``(N, nkv, hd)`` new values.
        positions: ``(N,)`` int positions.
        cos: ``(P, >= hd/2)`` fp32 table; column i is ``cos(pos * inv_freq[i])``.
        sin: same layout as ``cos``.
        k_cache: ``(num_blocks, block_size, nkv, hd)``.
        v_cache: same shape as ``k_cache``.
        slot_mapping: ``(N,)`` int flat slots ``block * block_size + offset``; a negative slot skips the token.
    """
    half = q.shape[-1] // 2
    c = cos[positions.long(), :half].float().unsqueeze(1)  # (N, 1, hd/2)
    s = sin[positions.long(), :half].float().unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float()[..., :half], x.float()[..., half:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

    q.copy_(rotate(q))
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    nkv, hd = k.shape[1], k.shape[2]
    k_cache.view(-1, nkv, hd)[slots] = rotate(k)[keep].to(k_cache.dtype)
    v_cache.view(-1, nkv, hd)[slots] = v[keep].to(v_cache.dtype)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new query per sequence attending over its whole paged context, softmax in fp32.

    Args:
        q: ``(B, nh, hd)``.
        k_cache: ``(num_blocks, block_size, nkv, hd)``; ``nh`` must be a multiple of ``nkv`` (GQA).
        v_cache: same shape as ``k_cache``.
        block_tables: ``(B, max_blocks)`` int block ids; entries past a sequence's length are ignored.
        seq_lens: ``(B,)`` int context lengths (the new token included); 0 gives a zero output row.
        scale: softmax scale.

    Returns:
        ``(B, nh, hd)`` in q's dtype.
    """
    B, nh, hd = q.shape
    block_size, nkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        blocks = block_tables[b, : -(-n // block_size)].long()
        k = k_cache[blocks].reshape(-1, nkv, hd)[:n].float()  # (n, nkv, hd)
        v = v_cache[blocks].reshape(-1, nkv, hd)[:n].float()
        k = k.repeat_interleave(nh // nkv, dim=1)  # (n, nh, hd)
        v = v.repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale  # (nh, n)
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8, the layout of ``selfhost.models.quant.Int8Weight``.

    Returns:
        ``(qweight (N, K) int8, scales (N,) bf16)`` with ``w ~= qweight * scales[:, None]``.
    """
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-8).to(torch.bfloat16)  # (N,)
    q = torch.round(w / scales.float().unsqueeze(1)).clamp(-127, 127).to(torch.int8)  # (N, K)
    return q.contiguous(), scales.contiguous()


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 ``(N, K)`` weight ``qweight * scale``: ``scales (N,)`` per row, or ``(N, K/G)`` per group of G columns.

    Per-group int8 with ``G = 32`` and fp16 scales is GGUF Q8_0 (``kernels.gguf_blocks``).
    """
    s = scales.float()
    if s.dim() == 1:
        return qweight.float() * s.unsqueeze(1)
    return qweight.float() * s.repeat_interleave(qweight.shape[1] // s.shape[1], dim=1)


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x @ (qweight * scales).T`` for ``(M, K)`` x, accumulated in fp32; returns ``(M, N)`` in x's dtype.

    ``scales`` is ``(N,)`` per row or ``(N, K/G)`` per group (``dequantize_int8``).
    """
    if scales.dim() == 1:
        return (x.float() @ qweight.float().t() * scales.float()).to(x.dtype)
    return (x.float() @ dequantize_int8(qweight, scales).t()).to(x.dtype)


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per row and group of ``group_size`` columns, packed for the GPU kernels.

    The values, scales and zeros are those of ``selfhost.models.quant.quantize_int4``
    (``w ~= (q - 8) * scale + zero``, ``zero = min + 8 * scale``, both bf16); only the packing differs.
    GGUF Q4_1 blocks map onto it with ``group_size=32``, ``scale = d`` and ``zero = m + 8 d``, kept in
    fp16 and fp32 (``kernels.gguf_blocks``: bf16 would round GGUF's fp16 ``d``).

    NOTE(h7): byte ``j`` of a row holds column ``j`` in its low nibble and column ``j + K/2`` in its
    high nibble, so a kernel reads both halves of K with one coalesced load and no interleaving.
    That needs K to be a multiple of ``2 * group_size`` (true of Llama-3-8B and SmolLM2 shapes).

    Returns:
        ``(packed (N, K/2) uint8, scales (N, K/G) bf16, zeros (N, K/G) bf16)``.

    Raises:
        ValueError: K is not a multiple of ``2 * group_size``.
    """
    w = weight.detach().float()
    n, k = w.shape
    if k % (2 * group_size):
        raise ValueError(f"int4 needs K ({k}) to be a multiple of 2 * group_size ({2 * group_size})")
    groups = w.reshape(n, k // group_size, group_size)  # (N, K/G, G)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # (N, K/G)
    scales = ((hi - lo) / 15.0).clamp(min=1e-6).to(torch.bfloat16)
    zeros = (lo + 8.0 * scales.float()).to(torch.bfloat16)
    s, z = scales.float().unsqueeze(-1), zeros.float().unsqueeze(-1)  # (N, K/G, 1)
    q = torch.round((groups - z) / s + 8.0).clamp(0, 15).to(torch.uint8).reshape(n, k)  # (N, K)
    packed = q[:, : k // 2] | (q[:, k // 2 :] << 4)  # (N, K/2)
    return packed.contiguous(), scales.contiguous(), zeros.contiguous()


def x_pairs(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(M, K)`` activations as the int4 half2 GEMV reads them (``kernels.int4_gemv.XPairs``).

    Word ``q`` of a row covers columns ``4q .. 4q + 3``: ``pa[q]`` holds ``(x[4q], x[4q+2]) * s`` and
    ``pb[q]`` ``(x[4q+1], x[4q+3]) * s`` as two fp16 in an int32 (the first in the low 16 bits), with
    ``s = 1/4`` in the low half of K and ``1/64`` in the high half (whose weights the kernel reads as
    16 q). ``sums`` are x's sums over each group of ``group_size`` columns, in fp32.

    Returns:
        ``(pa (M, K/4) int32, pb (M, K/4) int32, sums (M, K/G) fp32)``.
    """
    m, k = x.shape
    xf = x.float()
    scale = torch.full((k // 4,), 0.25, device=x.device)
    scale[k // 8 :] = 0.25 / 16.0
    quads = xf.view(m, k // 4, 4)  # (M, K/4, 4): word q's columns

    def pair(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        a = (first * scale).half().view(torch.int16).to(torch.int32) & 0xFFFF
        b = (second * scale).half().view(torch.int16).to(torch.int32)
        return (a | (b << 16)).contiguous()

    sums = xf.view(m, k // group_size, group_size).sum(-1)  # (M, K/G)
    return pair(quads[..., 0], quads[..., 2]), pair(quads[..., 1], quads[..., 3]), sums.contiguous()


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """The fp32 ``(N, K)`` weight that a ``quantize_int4`` triple stands for."""
    q = torch.cat((packed & 0xF, packed >> 4), dim=1).float()  # (N, K)
    s = scales.float().repeat_interleave(group_size, dim=1)  # (N, K)
    z = zeros.float().repeat_interleave(group_size, dim=1)
    return (q - 8.0) * s + z


def int4_matmul(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``x @ dequantize_int4(...).T`` for ``(M, K)`` x in fp32; returns ``(M, N)`` in x's dtype."""
    return (x.float() @ dequantize_int4(packed, scales, zeros, group_size).t()).to(x.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each sequence's new tokens attending causally over its paged context, softmax in fp32.

    Sequence ``b`` has ``query_lens[b]`` new tokens at rows ``query_starts[b]...`` of ``q``, the last
    of its ``seq_lens[b]`` context tokens; new token ``i`` sits at position
    ``seq_lens[b] - query_lens[b] + i`` and sees keys ``0`` to that position. The context's keys
    and values (new tokens' included) are read from the caches through ``block_tables``.

    Args:
        q: ``(N, nh, hd)``.
        k_cache: ``(num_blocks, block_size, nkv, hd)``; ``nh`` must be a multiple of ``nkv`` (GQA).
        v_cache: same shape as ``k_cache``.
        block_tables: ``(B, max_blocks)`` int block ids; entries past a sequence's length are ignored.
        query_starts: ``(B,)`` int first row of each sequence's queries.
        query_lens: ``(B,)`` int new tokens per sequence.
        seq_lens: ``(B,)`` int context lengths, new tokens included.
        scale: softmax scale.
        out: ``(N, nh, hd)`` to write the sequences' rows into (other rows untouched); default zeros.

    Returns:
        ``out``, in q's dtype.
    """
    nh, hd = q.shape[1], q.shape[2]
    block_size, nkv = k_cache.shape[1], k_cache.shape[2]
    if out is None:
        out = torch.zeros_like(q)
    for b in range(query_starts.shape[0]):
        start, q_len, n = int(query_starts[b]), int(query_lens[b]), int(seq_lens[b])
        blocks = block_tables[b, : -(-n // block_size)].long()
        k = k_cache[blocks].reshape(-1, nkv, hd)[:n].float().repeat_interleave(nh // nkv, dim=1)  # (n, nh, hd)
        v = v_cache[blocks].reshape(-1, nkv, hd)[:n].float().repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("qhd,nhd->hqn", q[start : start + q_len].float(), k) * scale  # (nh, q_len, n)
        rows = torch.arange(q_len, device=q.device).unsqueeze(1) + (n - q_len)  # (q_len, 1) positions
        visible = torch.arange(n, device=q.device).unsqueeze(0) <= rows  # (q_len, n)
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[start : start + q_len] = torch.einsum("hqn,nhd->qhd", probs, v).to(q.dtype)
    return out
