"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) over a flattened batch with a paged KV cache.

Owns the module tree, the mapping from Hugging Face parameter names to our fused parameters
(``load_weights``) and the forward pass. Does not own reading files (``loader``), choosing which
tokens run (``scheduler``) or the KV block bookkeeping (``kv_cache``): the forward receives token
ids, their positions, the per-layer cache tensors and an ``AttentionMetadata``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)
from torch import nn

from selfhost.models import ops
from selfhost.models.linear import Linear, param

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from selfhost.config import ModelConfig, Quantization


class Attention(nn.Module):
    """Grouped-query self-attention with a fused QKV projection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.nh * self.hd, self.nkv * self.hd
        self.qkv = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.qkv_bias)
        self.o = Linear(self.q_size, cfg.hidden_size, cfg.o_bias)
        self.scale = self.hd**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: ops.AttentionMetadata,
    ) -> torch.Tensor:
        """Attend ``(N, C)`` inputs over their sequences' cached context (after writing this step's K/V).

        Returns ``(N, C)`` in the output projection's dtype (``Linear.project``); attention itself
        runs in the cache's dtype.
        """
        N = x.shape[0]
        qkv = self.qkv.project(x)  # (N, (nh + 2 nkv) hd)
        if qkv.dtype != k_cache.dtype:  # the CPU kernels' bf16
            qkv = qkv.float() if k_cache.dtype == torch.float32 else qkv.to(k_cache.dtype)
        heads = qkv.view(N, self.nh + 2 * self.nkv, self.hd)  # (N, nh + 2 nkv, hd)
        qk, v = heads[:, : self.nh + self.nkv], heads[:, self.nh + self.nkv :]  # (N, nh + nkv, hd), (N, nkv, hd)
        qk = ops.apply_rope(qk, cos, sin)  # queries and keys rotated together
        q, k = qk[:, : self.nh], qk[:, self.nh :]  # (N, nh, hd), (N, nkv, hd)
        ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, meta.written_rows)
        o = ops.paged_attention(q, k_cache, v_cache, meta, self.scale)  # (N, nh, hd)
        return self.o.project(o.reshape(N, self.q_size))  # (N, C)


class MLP(nn.Module):
    """SiLU-gated MLP with the gate and up projections fused into one matmul."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up = Linear(cfg.hidden_size, 2 * self.inter, cfg.mlp_bias)
        self.down = Linear(self.inter, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``down(silu(gate(x)) * up(x))`` for ``(N, C)`` inputs, in the down projection's dtype (``Linear.project``)."""
        gate_up = self.gate_up.project(x)  # (N, 2I)
        if self.gate_up.in_dtype is not None and gate_up.dtype != torch.float32:
            gate_up = gate_up.float()  # the CPU kernels' bf16: SiLU and product in fp32, rounded once
        gate, up = gate_up[:, : self.inter], gate_up[:, self.inter :]  # 2 x (N, I)
        return self.down.project(F.silu(gate).mul_(up))  # (N, C)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.attn_norm = param(cfg.hidden_size)
        self.attn = Attention(cfg)
        self.mlp_norm = param(cfg.hidden_size)
        self.mlp = MLP(cfg)
        # set by ``use_rounded_norms`` once the projections read bf16 (quantized on the CPU)
        self.attn_in: ops.RoundedRMSNorm | None = None
        self.mlp_in: ops.RoundedRMSNorm | None = None

    def use_rounded_norms(self) -> None:
        """Compute each norm straight into the dtype its projection reads, when that is not the weights' own.

        Call after the weights are loaded and quantized (the norms copy their weights).
        """
        for norm, linear, attr in (
            (self.attn_norm, self.attn.qkv, "attn_in"),
            (self.mlp_norm, self.mlp.gate_up, "mlp_in"),
        ):
            rounded = None
            if linear.in_dtype is not None and linear.in_dtype != norm.dtype and norm.dtype == torch.float32:
                rounded = ops.RoundedRMSNorm(norm, self.eps, linear.in_dtype)
            setattr(self, attr, rounded)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: ops.AttentionMetadata,
    ) -> torch.Tensor:
        """One block over ``(N, C)`` hidden states, which it updates in place and returns."""
        # NOTE(crossway): the submodules' ``forward`` is called directly, skipping ``nn.Module``'s
        # hook machinery, and the residual adds are in place: at batch 1 on a CPU each layer is
        # dozens of microsecond-sized ops, where per-call overhead is a visible share of a step.
        # Norm outputs come in the dtype the next kernel reads (bf16 for the CPU int8/int4 ones).
        h = ops.rms_norm(x, self.attn_norm, self.eps) if self.attn_in is None else self.attn_in(x)
        x.add_(self.attn.forward(h, cos, sin, k_cache, v_cache, meta))
        h = ops.rms_norm(x, self.mlp_norm, self.eps) if self.mlp_in is None else self.mlp_in(x)
        return x.add_(self.mlp.forward(h))


class LlamaForCausalLM(nn.Module):
    """The decoder stack plus LM head; ``forward`` returns hidden states, ``compute_logits`` the logits."""

    rope_cos: torch.Tensor
    rope_sin_signed: torch.Tensor

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_positions = max_positions
        self.quantization: Quantization = "none"
        self.embed = param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = param(cfg.hidden_size)
        tied = self.embed if cfg.tie_word_embeddings else None
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False, weight=tied)
        inv_freq = None
        if cfg.rope_scaling is not None:
            rs = cfg.rope_scaling
            inv_freq = ops.llama3_inv_freq(
                cfg.head_dim,
                cfg.rope_theta,
                rs.factor,
                rs.low_freq_factor,
                rs.high_freq_factor,
                rs.original_max_position,
            )
        cos, sin = ops.rope_cos_sin(cfg.head_dim, max_positions, cfg.rope_theta, inv_freq)
        self.register_buffer("rope_cos", cos, persistent=False)  # (P, hd) fp32
        self.register_buffer("rope_sin_signed", ops.rope_sin_signed(sin), persistent=False)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> LlamaForCausalLM:
        """``nn.Module._apply`` (``.to``, ``.cuda``, ...), except that the rotary tables stay fp32.

        The rope kernel reads fp32 tables, and a bf16 table would round angles of far positions.
        """
        tables = (self.rope_cos, self.rope_sin_signed)
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        device = self.rope_cos.device
        self.rope_cos, self.rope_sin_signed = (t.to(device) for t in tables)
        return self

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: ops.AttentionMetadata,
        kernels: bool = False,
    ) -> torch.Tensor:
        """Run ``(N,)`` token ids at ``(N,)`` positions; return final-normed hidden states ``(N, C)``.

        ``kernels`` runs the pass on the Triton kernels (``models.fused``: CUDA, or the CPU under
        ``TRITON_INTERPRET=1``) instead of the plain torch ops.
        """
        if kernels:
            from selfhost.models import fused  # imports triton: only where kernels run

            return fused.forward(self, input_ids, positions, kv_caches, meta)
        x = F.embedding(input_ids, self.embed)  # (N, C)
        dtype = x.dtype
        cos = self.rope_cos.index_select(0, positions).unsqueeze(1).to(dtype)  # (N, 1, hd)
        sin = self.rope_sin_signed.index_select(0, positions).unsqueeze(1).to(dtype)  # (N, 1, hd), sign folded in
        for layer, (k_cache, v_cache) in zip(self.decoder_layers(), kv_caches, strict=True):
            x = layer.forward(x, cos, sin, k_cache, v_cache, meta)  # (N, C), updated in place
        return ops.rms_norm(x, self.norm, self.cfg.rms_norm_eps)

    def decoder_layers(self) -> list[DecoderLayer]:
        """The blocks, typed (``nn.ModuleList`` yields plain modules)."""
        return cast("list[DecoderLayer]", list(self.layers))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project ``(M, C)`` hidden states to ``(M, vocab)`` fp32 logits."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

    def forward_logits(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: ops.AttentionMetadata,
        kernels: bool = False,
    ) -> torch.Tensor:
        """``compute_logits(forward(...))`` of every row, ``(N, vocab)`` fp32: a step in which every row samples.

        On the kernels the final norm also writes its output as the LM head's int4 GEMV reads it
        (``Linear.x_pairs``), as each layer's norms do for qkv and gate_up; where rows are picked
        after the norm (``compute_logits`` of some rows), the LM head reads x.
        """
        if not kernels:
            return self.compute_logits(self.forward(input_ids, positions, kv_caches, meta))
        from selfhost.models import fused  # imports triton: only where kernels run

        pairs = self.lm_head.x_pairs(input_ids.shape[0], self.embed.dtype)
        hidden = fused.forward(self, input_ids, positions, kv_caches, meta, head_pairs=pairs)
        logits: torch.Tensor = self.lm_head(hidden, pairs=pairs)
        return logits.float()

    def linears(self) -> list[Linear]:
        """Every linear layer, the LM head last."""
        return [m for m in self.modules() if isinstance(m, Linear) and m is not self.lm_head] + [self.lm_head]

    def quantize(self, mode: Quantization, group_size: int = 32, kernels: bool | None = None) -> None:
        """Quantize every linear layer and the LM head in place (weight-only; the embedding stays float).

        ``kernels`` picks the Triton kernels' layouts; None picks them for a model on a GPU.

        Raises:
            ValueError: the model is already quantized.
        """
        if mode == "none":
            return
        if self.quantization != "none":
            raise ValueError(f"the model is already quantized as {self.quantization}")
        if mode == "gguf":
            raise ValueError("'gguf' weights come from the file's own blocks: models.gguf_native.load_native")
        for linear in self.linears():
            linear.quantize(mode, group_size, kernels)
        for layer in self.decoder_layers():
            layer.use_rounded_norms()
        self.quantization = mode

    def weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads (the embedding counted once: only its rows are read)."""
        norms = sum(p.numel() * p.element_size() for name, p in self.named_parameters() if name.endswith("norm"))
        linears: int = sum(m.weight_bytes for m in self.linears())
        return norms + linears

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into our (partly fused) parameters.

        Raises:
            ValueError: a name is unknown, or a parameter is left unloaded.
        """
        cfg = self.cfg
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        # HF projection -> (our parameter suffix, row offset, rows)
        fused = {
            "self_attn.q_proj": ("attn.qkv", 0, q),
            "self_attn.k_proj": ("attn.qkv", q, kv),
            "self_attn.v_proj": ("attn.qkv", q + kv, kv),
            "self_attn.o_proj": ("attn.o", 0, cfg.hidden_size),
            "mlp.gate_proj": ("mlp.gate_up", 0, cfg.intermediate_size),
            "mlp.up_proj": ("mlp.gate_up", cfg.intermediate_size, cfg.intermediate_size),
            "mlp.down_proj": ("mlp.down", 0, cfg.hidden_size),
        }
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            target, start = self._target(name, fused)
            if target is None:
                continue
            if target not in params:
                raise ValueError(f"weight {name!r} maps to unknown parameter {target!r}")
            dst = params[target].data
            dst.narrow(0, start, tensor.shape[0]).copy_(tensor) if start >= 0 else dst.copy_(tensor)
            loaded.add(f"{target}@{start}")
        expected = self._expected_keys(fused)
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")

    def _target(self, name: str, fused: dict[str, tuple[str, int, int]]) -> tuple[str | None, int]:
        name = name.removeprefix("model.")
        if name == "embed_tokens.weight":
            return "embed", -1
        if name == "norm.weight":
            return "norm", -1
        if name == "lm_head.weight":
            return (None, -1) if self.cfg.tie_word_embeddings else ("lm_head.weight", -1)
        if name.startswith("layers.") and name.endswith("rotary_emb.inv_freq"):
            return None, -1
        parts = name.split(".")  # layers.{i}.{module...}.{weight|bias}
        prefix, rest, kind = f"layers.{parts[1]}", ".".join(parts[2:-1]), parts[-1]
        if rest == "input_layernorm":
            return f"{prefix}.attn_norm", -1
        if rest == "post_attention_layernorm":
            return f"{prefix}.mlp_norm", -1
        if rest in fused:
            suffix, start, _ = fused[rest]
            return f"{prefix}.{suffix}.{kind}", start
        raise ValueError(f"unexpected weight {name!r}")

    def _expected_keys(self, fused: dict[str, tuple[str, int, int]]) -> set[str]:
        cfg = self.cfg
        keys = {"embed@-1", "norm@-1"} | (set() if cfg.tie_word_embeddings else {"lm_head.weight@-1"})
        for i in range(cfg.num_layers):
            keys |= {f"layers.{i}.attn_norm@-1", f"layers.{i}.mlp_norm@-1"}
            for hf, (suffix, start, _) in fused.items():
                keys.add(f"layers.{i}.{suffix}.weight@{start}")
                bias = (hf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj") and cfg.qkv_bias) or (
                    (hf == "self_attn.o_proj" and cfg.o_bias) or (hf.startswith("mlp.") and cfg.mlp_bias)
                )
                if bias:
                    keys.add(f"layers.{i}.{suffix}.bias@{start}")
        return keys
