"""The model's tensor ops as small functions, so Triton kernels can replace them one at a time.

Owns RMSNorm, rotary embedding, writing new K/V into the paged cache and paged attention, each in
plain PyTorch (the CPU path and the reference). Does not own the model's weights or shapes
(``models.llama``) nor which blocks a sequence has (``kv_cache``); it reads block tables it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """Where each sequence's tokens sit in the flattened batch and in the paged KV cache.

    Built once per step by the model runner; read by every layer. Owned by the runner; layers
    must not mutate it.
    """

    slot_mapping: torch.Tensor
    """(N,) int64: flat cache slot (``block_id * block_size + offset``) of each new token."""
    query_start: list[int]
    """B + 1 offsets: sequence i's new tokens are rows ``query_start[i]:query_start[i+1]``."""
    seq_lens: list[int]
    """B context lengths after this step (cached tokens + new tokens)."""
    block_tables: list[torch.Tensor]
    """B int64 tensors: the blocks holding each sequence's context, in order."""
    block_size: int
    """Tokens per KV block."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm over the last dim, computed in fp32 as Hugging Face Llama does."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries ``(N, nh, hd)`` and keys ``(N, nkv, hd)`` by per-token tables ``(N, hd)``."""
    cos = cos.unsqueeze(1).to(q.dtype)  # (N, 1, hd)
    sin = sin.unsqueeze(1).to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter new keys and values ``(N, nkv, hd)`` into caches ``(num_blocks, block_size, nkv, hd)`` by slot."""
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
    # NOTE(crossway): one SDPA call per sequence over its gathered blocks. On the CPU this keeps
    # each sequence's arithmetic independent of its batch neighbours (batch invariance) and costs
    # little next to the linear layers; a paged-attention kernel replaces the loop on the GPU.
    out = torch.empty_like(q)
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    bs = meta.block_size
    for i, ctx_len in enumerate(meta.seq_lens):
        start, end = meta.query_start[i], meta.query_start[i + 1]
        q_len = end - start
        blocks = meta.block_tables[i][: (ctx_len + bs - 1) // bs]
        k = k_cache[blocks].view(-1, nkv, hd)[:ctx_len].transpose(0, 1)  # (nkv, L, hd)
        v = v_cache[blocks].view(-1, nkv, hd)[:ctx_len].transpose(0, 1)  # (nkv, L, hd)
        qi = q[start:end].transpose(0, 1)  # (nh, q_len, hd)
        mask = None
        if 1 < q_len < ctx_len:
            # query row r sits at position ctx_len - q_len + r and sees keys 0..that position
            rows = torch.arange(q_len).unsqueeze(1) + (ctx_len - q_len)  # (q_len, 1)
            mask = torch.arange(ctx_len).unsqueeze(0) <= rows  # (q_len, L)
        o = F.scaled_dot_product_attention(
            qi, k, v, attn_mask=mask, is_causal=(q_len == ctx_len and q_len > 1), scale=scale, enable_gqa=True
        )  # (nh, q_len, hd)
        out[start:end] = o.transpose(0, 1)
    return out
