"""The decoder's forward pass on the Triton kernels: every device-specific model op in one place.

Owns the kernel-backed pass of ``LlamaForCausalLM``: the residual add fused into each RMSNorm,
rotary embedding fused with the KV-cache write (into the qkv GEMV, ``kernels.rope_kv.RopeKV``, or
its own launch after the qkv matmul), paged split-KV decode attention for one-token
rows, paged prefill attention for multi-token rows (prefill and chunked prefill over cached
prefix blocks; in a mixed batch each kind of row goes to its own kernel), and the matmuls through
``Linear``, whose GEMV kernels apply SiLU-and-mul as they write gate_up's output (``glu``) and
whose int4 GEMVs read x as the pairs the norm before them wrote (``Linear.x_pairs``). Where
the prefill kernel cannot launch (a head dim that is not a power of two), multi-token rows fall
back to ``ops.prefill_attention`` (SDPA over the gathered context). Runs on CUDA, or on the CPU
under ``TRITON_INTERPRET=1`` (tests). Does not own the weights or their names (``llama``), the
plain-torch path (``ops``) nor CUDA graphs (``selfhost.graphs``).

Rounding follows the torch path: the residual sum is rounded to the activation dtype before the
norm, the norm is computed in fp32 and rounded before the weight multiply, rotary in fp32 rounded
once. In fp32 the two paths agree to float rounding (the kernels may contract into FMAs); they are
not bit-equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)

from kernels.paged_attention import paged_decode_attention
from kernels.paged_prefill import paged_prefill_attention, prefill_kernel_fits
from kernels.rmsnorm import rms_norm_residual
from kernels.rope_kv import RopeKV
from selfhost.models import ops

if TYPE_CHECKING:
    from kernels.int4_gemv import XPairs
    from selfhost.models.llama import Attention, DecoderLayer, LlamaForCausalLM


def forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    meta: ops.AttentionMetadata,
    *,
    decode_prefix: int | None = None,
    head_pairs: XPairs | None = None,
) -> torch.Tensor:
    """``LlamaForCausalLM.forward`` on the kernels: ``(N,)`` ids at ``(N,)`` positions -> normed hidden ``(N, C)``.

    Only tensor shapes steer the launches for an all-decode ``meta``, so the pass can be captured in
    a CUDA graph and replayed with new ids, positions, slots (negative: skip the write), block
    tables and lengths (0: a padding row with a zero attention output).

    ``decode_prefix`` (the padded mixed steps of ``selfhost.step_graphs``) takes the static mixed
    path instead: the decode kernel over rows ``[0, decode_prefix)`` (``meta.decode_lens`` 0 on
    rows that are not decode rows), then the prefill kernel over ``meta.prefill_batch`` with its
    grid sized by ``max_query_len`` alone; again only shapes steer the launches.

    ``head_pairs``: room the final norm fills with its output as the LM head's int4 GEMV reads it
    (``LlamaForCausalLM.forward_logits``, where every row's logits are wanted).
    """
    eps = model.cfg.rms_norm_eps
    half = model.cfg.head_dim // 2
    # the kernel wants (P, hd/2) tables of cos and +sin; the model keeps rotate_half layouts
    cos = model.rope_cos[:, :half]
    sin = model.rope_sin_signed[:, half:]
    x = F.embedding(input_ids, model.embed)  # (N, C)
    residual: torch.Tensor | None = None
    layers = cast("list[DecoderLayer]", list(model.layers))
    N = x.shape[0]
    for layer, (k_cache, v_cache) in zip(layers, kv_caches, strict=True):
        # each norm also writes its output as the int4 GEMV after it reads x, where one does
        pairs = layer.attn.qkv.x_pairs(N, x.dtype)
        h, residual = rms_norm_residual(x, residual, layer.attn_norm, eps, pairs=pairs)
        x = _attention(layer.attn, h, positions, cos, sin, k_cache, v_cache, meta, decode_prefix, pairs)
        pairs = layer.mlp.gate_up.x_pairs(N, x.dtype)
        h, residual = rms_norm_residual(x, residual, layer.mlp_norm, eps, pairs=pairs)
        x = layer.mlp.down(layer.mlp.gate_up(h, glu=True, pairs=pairs))
    out, _ = rms_norm_residual(x, residual, model.norm, eps, pairs=head_pairs)
    return out


def _attention(
    attn: Attention,
    x: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: ops.AttentionMetadata,
    decode_prefix: int | None = None,
    pairs: XPairs | None = None,
) -> torch.Tensor:
    N = x.shape[0]
    rope = RopeKV(positions, cos, sin, k_cache, v_cache, meta.slot_mapping)
    q = attn.qkv(x, rope=rope, pairs=pairs).view(N, attn.nh, attn.hd)  # rotated; new keys and values in the caches
    if meta.all_decode:
        o = _decode(q, k_cache, v_cache, meta, attn.scale)
    elif decode_prefix is not None:
        o = _static_mixed(q, k_cache, v_cache, meta, attn.scale, decode_prefix)
    else:
        o = torch.empty((N, attn.nh, attn.hd), dtype=x.dtype, device=x.device)
        if meta.decode_rows.numel():
            o[meta.decode_rows] = _decode(q[meta.decode_rows], k_cache, v_cache, meta, attn.scale)
        _prefill(q, k_cache, v_cache, meta, o, attn.scale)
    out: torch.Tensor = attn.o(o.reshape(N, attn.q_size))  # (N, C)
    return out


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: ops.AttentionMetadata,
    o: torch.Tensor,
    scale: float,
) -> None:
    """Write the multi-token rows of ``o``: on the paged prefill kernel, else SDPA over the gathered context."""
    pb = meta.prefill_batch
    if pb is not None and prefill_kernel_fits(q, k_cache):
        _prefill_kernel(q, k_cache, v_cache, pb, o, scale)
        return
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    ops.prefill_attention(q, k_cache.view(-1, nkv, hd), v_cache.view(-1, nkv, hd), meta.prefills, o, scale)


def _static_mixed(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: ops.AttentionMetadata,
    scale: float,
    decode_prefix: int,
) -> torch.Tensor:
    """Attention of a padded mixed step: decode kernel over the leading rows, prefill kernel over the sequences.

    NOTE(crossway): the decode kernel runs over rows ``[0, decode_prefix)`` whatever they hold; its
    length-0 rows (multi-token or padding rows) come out zero, and the prefill kernel, launched
    after it, overwrites the multi-token rows, so launch order gives every real row its kernel's
    output without a gather or scatter. Rows past ``decode_prefix`` may be padding, which neither
    kernel writes: they start at zero, since uninitialised memory there could overflow in the
    later row-wise ops (harmless to real rows, but the interpreter raises on it); when
    ``decode_prefix`` covers every row, ``empty`` is enough.
    """
    pb = meta.prefill_batch
    if pb is None:
        raise ValueError("the static mixed path needs AttentionMetadata.prefill_batch")
    new = torch.zeros if q.shape[0] > decode_prefix else torch.empty
    o = new(q.shape, dtype=q.dtype, device=q.device)  # (N, nh, hd)
    if decode_prefix:
        _decode(q[:decode_prefix], k_cache, v_cache, meta, scale, out=o[:decode_prefix])
    _prefill_kernel(q, k_cache, v_cache, pb, o, scale)
    return o


def _prefill_kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pb: ops.PrefillBatch,
    o: torch.Tensor,
    scale: float,
) -> None:
    """The paged prefill kernel over ``pb``'s sequences, writing their rows of ``o``."""
    paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        pb.block_tables,
        pb.query_starts,
        pb.query_lens,
        pb.seq_lens,
        pb.max_query_len,
        scale,
        out=o,
        split_query_len=pb.split_query_len,
    )


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: ops.AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    if meta.decode_lens is None:
        raise ValueError("the kernel path needs AttentionMetadata.decode_lens")
    D = q.shape[0]
    tables = meta.decode_blocks.view(D, -1)  # (D, Bmax)
    return paged_decode_attention(q, k_cache, v_cache, tables, meta.decode_lens, scale, out=out)
