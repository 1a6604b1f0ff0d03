"""The model's tensor ops as small functions, so Triton kernels can replace them one at a time.

Owns RMSNorm, rotary embedding, writing new K/V into the paged cache and paged attention, each in
plain PyTorch (the CPU path and the reference). Does not own the model's weights or shapes
(``models.llama``) nor which blocks a sequence has (``kv_cache``); it reads block tables it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(slots=True)
class PrefillSeq:
    """One sequence that runs more than one new token this step."""

    rows: slice
    """Its new tokens' rows in the flattened batch."""
    context_slots: torch.Tensor
    """(L,) int64: cache slots of its whole context (cached tokens, then the new ones)."""
    mask: torch.Tensor | None
    """(q_len, L) bool causal mask when some context is cached; None when the new tokens are the whole context."""


@dataclass(slots=True)
class PrefillBatch:
    """The multi-token sequences of a step as the paged prefill kernel reads them (int32, one upload)."""

    query_starts: torch.Tensor
    """(P,): first row of each sequence's new tokens in the flattened batch."""
    query_lens: torch.Tensor
    """(P,): new tokens per sequence."""
    seq_lens: torch.Tensor
    """(P,): context length per sequence, new tokens included."""
    block_tables: torch.Tensor
    """(P, Bmax): each sequence's block ids, padded with block 0 to the longest."""
    max_query_len: int
    """The largest of ``query_lens`` (sizes the kernel's grid without a device sync)."""
    split_query_len: int | None = None
    """The chunk the kernel's key splits are sized for; None: ``max_query_len`` (``paged_prefill_attention``)."""


@dataclass(slots=True)
class AttentionMetadata:
    """Where each sequence's tokens sit in the flattened batch and in the paged KV cache.

    Built once per step by the model runner (``build_attention_metadata``) and shared by every
    layer, so index arithmetic is paid once per step. Layers must not mutate it.
    """

    slot_mapping: torch.Tensor
    """(N,) int64: flat cache slot (``block_id * block_size + offset``) of each new token; -1 where
    the cache holds its key and value already (a full prefix hit's last token, in a shared block)."""
    decode_rows: torch.Tensor
    """(D,) int64: rows of the sequences that run exactly one new token."""
    decode_blocks: torch.Tensor
    """(D * Bmax,) int64: each decode sequence's block table, padded with block 0 to the longest."""
    decode_mask: torch.Tensor
    """(D, 1, 1, Bmax * block_size) fp32: 0 on real context, -inf on padding (added to the scores)."""
    prefills: list[PrefillSeq]
    """The other sequences."""
    all_decode: bool
    """Every row is a decode row in order (``decode_rows == arange(N)``): no gather or scatter of rows needed."""
    decode_lens: torch.Tensor | None = None
    """(D,) int64: each decode sequence's context length (the kernel path reads it instead of ``decode_mask``)."""
    prefill_batch: PrefillBatch | None = None
    """``prefills`` again, for the kernel path's paged prefill attention; None when there are none."""
    written_rows: torch.Tensor | None = None
    """(W,) int64: the rows whose slot is not -1, when some are (``write_kv`` takes only these); else None."""


def upload(
    values: Sequence[int] | Sequence[float] | np.ndarray, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A host list or array as a device tensor, copied behind the work already queued (no wait for it on a GPU)."""
    host = torch.as_tensor(values, dtype=dtype) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def build_attention_metadata(
    query_start: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
    slots: list[int] | np.ndarray | None = None,
) -> AttentionMetadata:
    """Turn per-sequence offsets, context lengths and block tables into the step's index tensors.

    ``slots`` gives the new tokens' cache slots where the caller has them (-1: not written);
    without it they follow from the block tables.
    """
    # NOTE(crossway): work here is O(new tokens + blocks) per sequence, never O(context) in Python,
    # so long contexts do not slow decode steps down.
    new_slots: list[int] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lens: list[int] = []
    prefills: list[PrefillSeq] = []
    prefill_rows: list[tuple[int, int, int, list[int]]] = []  # (first row, new tokens, context, blocks)
    for i, ctx_len in enumerate(seq_lens):
        table = block_tables[i]
        start, end = query_start[i], query_start[i + 1]
        q_len = end - start
        if slots is None:
            new_slots.extend(
                table[p // block_size] * block_size + p % block_size for p in range(ctx_len - q_len, ctx_len)
            )
        if q_len == 1:
            decode_rows.append(start)
            decode_tables.append(table[: -(-ctx_len // block_size)])
            decode_lens.append(ctx_len)
            continue
        blocks = upload(table[: -(-ctx_len // block_size)], torch.long, device)
        offsets = torch.arange(block_size, device=device)
        context = (blocks.unsqueeze(1) * block_size + offsets).flatten()[:ctx_len]  # (L,)
        mask = None
        if q_len < ctx_len:  # query r sits at position ctx_len - q_len + r and sees keys 0..that position
            rows = torch.arange(q_len, device=device).unsqueeze(1) + (ctx_len - q_len)  # (q_len, 1)
            mask = torch.arange(ctx_len, device=device).unsqueeze(0) <= rows  # (q_len, L)
        prefills.append(PrefillSeq(slice(start, end), context, mask))
        prefill_rows.append((start, q_len, ctx_len, table[: -(-ctx_len // block_size)]))
    bmax = max((len(t) for t in decode_tables), default=0)
    padded = [b for t in decode_tables for b in t + [0] * (bmax - len(t))]
    lens = upload(decode_lens, torch.long, device)
    pad = torch.arange(bmax * block_size, device=device).unsqueeze(0) >= lens.unsqueeze(1)  # (D, Bmax * bs)
    # NOTE(crossway): an additive float mask, built once per step: SDPA would turn a bool mask
    # into this in every layer.
    mask = torch.zeros(pad.shape, device=device).masked_fill_(pad, float("-inf"))
    slot_array = np.asarray(new_slots if slots is None else slots, dtype=np.int64)  # (N,)
    written = None
    if slot_array.size and slot_array.min() < 0:
        written = upload(np.flatnonzero(slot_array >= 0), torch.long, device)
    return AttentionMetadata(
        slot_mapping=upload(slot_array, torch.long, device),
        decode_rows=upload(decode_rows, torch.long, device),
        decode_blocks=upload(padded, torch.long, device),
        decode_mask=mask[:, None, None, :],  # (D, 1, 1, Bmax * bs)
        prefills=prefills,
        all_decode=not prefills,
        decode_lens=lens,
        prefill_batch=_prefill_batch(prefill_rows, device) if prefill_rows else None,
        written_rows=written,
    )


def _prefill_batch(rows: list[tuple[int, int, int, list[int]]], device: torch.device) -> PrefillBatch:
    """Pack the multi-token sequences' starts, lengths and padded block tables into one int32 upload."""
    P = len(rows)
    bmax = max(len(r[3]) for r in rows)
    flat = [r[0] for r in rows] + [r[1] for r in rows] + [r[2] for r in rows]
    flat += [b for r in rows for b in r[3] + [0] * (bmax - len(r[3]))]
    packed = upload(flat, torch.int32, device)  # (3P + P * bmax,)
    return PrefillBatch(
        query_starts=packed[:P],
        query_lens=packed[P : 2 * P],
        seq_lens=packed[2 * P : 3 * P],
        block_tables=packed[3 * P :].view(P, bmax),
        max_query_len=max(r[1] for r in rows),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm over the last dim, computed in fp32 as Hugging Face Llama does."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        # NOTE(crossway): one fused op instead of seven; same math in fp32 (bit-equal in our checks).
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


class RoundedRMSNorm:
    """RMSNorm of fp32 rows whose result is rounded to a lower dtype at once (bf16 for the CPU int8/int4 kernels).

    NOTE(crossway): computed as ``x / sqrt(sum(x^2) + C eps) * (w sqrt(C))``, the same function as
    ``w * x * rsqrt(mean(x^2) + eps)`` in four ops plus the cast, where ``F.rms_norm`` runs about ten
    on the CPU: at batch 1 each op costs a few microseconds whatever its size, and the layers call
    this 60 times a step. The fp32 results differ from Hugging Face's order of operations in the last
    bits (relative 5e-7), below the bf16 rounding that follows: about 1 element in 10^5 rounds to
    the neighbouring bf16 value. Row by row, so a row's result does not depend on its batch.
    """

    def __init__(self, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> None:
        """Args: ``weight`` the fp32 ``(C,)`` norm weight (copied, scaled); ``out_dtype`` the rounded result's."""
        C = weight.shape[-1]
        self.weight_sqrt_c = weight.detach() * math.sqrt(C)  # (C,)
        self.eps_c_sqrt = torch.tensor(math.sqrt(C * eps), dtype=weight.dtype, device=weight.device)  # 0-dim
        self.out_dtype = out_dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` fp32 -> ``(N, C)`` in ``out_dtype``."""
        norm = torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), self.eps_c_sqrt)  # (N, 1)
        out = torch.div(x, norm).mul_(self.weight_sqrt_c)
        return (
            out.bfloat16() if self.out_dtype == torch.bfloat16 else out.to(self.out_dtype)
        )  # .bfloat16() parses faster


def rope_cos_sin(
    head_dim: int, max_positions: int, theta: float, inv_freq: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Precompute the rotary tables for positions ``0..max_positions-1``.

    Returns:
        ``(cos, sin)``, each ``(max_positions, head_dim)`` fp32, halves duplicated (``rotate_half`` layout).
    """
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (P, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, hd)
    return emb.cos(), emb.sin()


def llama3_inv_freq(
    head_dim: int, theta: float, factor: float, low_freq_factor: float, high_freq_factor: float, original_max: int
) -> torch.Tensor:
    """Inverse frequencies with Llama 3.1 scaling: long wavelengths slowed by ``factor``, a smooth band between."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    low_wavelen = original_max / low_freq_factor
    high_wavelen = original_max / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_sin_signed(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated, so that ``rotate_half(x) * sin == roll(x, hd/2) * sin_signed``."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate heads ``(N, H, hd)`` (queries and keys together) by per-token tables ``(N, 1, hd)``.

    NOTE(crossway): ``rotate_half(x) = cat(-x2, x1)``; ``roll`` gives ``cat(x2, x1)`` and the sign
    lives in ``sin_signed``, so this is bit-equal to Hugging Face's ``x * cos + rotate_half(x) * sin``
    (negating a factor is exact) in three kernels instead of seven.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> None:
    """Scatter new keys and values ``(N, nkv, hd)`` into caches ``(num_blocks, block_size, nkv, hd)`` by slot.

    ``rows`` (``AttentionMetadata.written_rows``) picks the rows to write when some have slot -1.
    """
    if rows is not None:
        k, v, slot_mapping = k[rows], v[rows], slot_mapping[rows]  # (W, nkv, hd), (W, nkv, hd), (W,)
    nkv, hd = k.shape[1], k.shape[2]
    k_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, k)  # (num_blocks * block_size, nkv, hd)
    v_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, v)


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context.

    Args:
        q: ``(N, nh, hd)`` queries of all new tokens of the step, sequence after sequence.
        k_cache: ``(num_blocks, block_size, nkv, hd)``, already holding this step's keys.
        v_cache: same shape as ``k_cache``.
        meta: the step's layout.
        scale: softmax scale, usually ``hd ** -0.5``.

    Returns:
        ``(N, nh, hd)`` attention outputs.
    """
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    if meta.all_decode:  # the common decode step: no rows to pick or scatter
        return _decode_attention(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    k_flat = k_cache.view(-1, nkv, hd)  # (num_blocks * block_size, nkv, hd)
    v_flat = v_cache.view(-1, nkv, hd)
    if meta.decode_rows.numel():
        out[meta.decode_rows] = _decode_attention(q[meta.decode_rows], k_cache, v_cache, meta, scale)
    prefill_attention(q, k_flat, v_flat, meta.prefills, out, scale)
    return out


def prefill_attention(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    prefills: list[PrefillSeq],
    out: torch.Tensor,
    scale: float,
) -> None:
    """Write into ``out`` the causal attention of each multi-token sequence over its gathered context.

    ``k_flat`` and ``v_flat`` are the caches viewed as ``(num_blocks * block_size, nkv, hd)``.
    """
    # NOTE(crossway): multi-token sequences (prefill chunks) get one SDPA call each over their
    # gathered context (the kernel path too, where ``kernels.paged_prefill`` cannot launch).
    for seq in prefills:
        k = k_flat.index_select(0, seq.context_slots).transpose(0, 1)  # (nkv, L, hd)
        v = v_flat.index_select(0, seq.context_slots).transpose(0, 1)
        qi = q[seq.rows].transpose(0, 1)  # (nh, q_len, hd)
        o = F.scaled_dot_product_attention(
            qi, k, v, attn_mask=seq.mask, is_causal=seq.mask is None, scale=scale, enable_gqa=True
        )  # (nh, q_len, hd)
        out[seq.rows] = o.transpose(0, 1)


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    # NOTE(crossway): all one-token sequences attend in one SDPA call over their block tables
    # padded to the longest; padding is masked out, so it adds exact zeros to each softmax. Whole
    # blocks are gathered with ``index_select`` (advanced indexing ``t[idx]`` can stall for ms on
    # some small shapes with 2 OpenMP threads), and query heads are grouped under their KV head
    # (``enable_gqa``) instead of repeating K and V.
    D, nh, hd = q.shape
    nkv = k_cache.shape[2]
    k = k_cache.index_select(0, meta.decode_blocks).view(D, -1, nkv, hd).transpose(1, 2)  # (D, nkv, Lmax, hd)
    v = v_cache.index_select(0, meta.decode_blocks).view(D, -1, nkv, hd).transpose(1, 2)
    mask = meta.decode_mask if meta.decode_mask.dtype == q.dtype else meta.decode_mask.to(q.dtype)
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )  # (D, nh, 1, hd)
    return o.reshape(D, nh, hd)
