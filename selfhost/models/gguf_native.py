"""A GGUF model's linear layers loaded from their native Q4_1 / Q8_0 blocks onto the Triton kernels.

``EngineConfig.quantization == "gguf"``: instead of quantizing the float weights the loader
dequantized (``int8`` / ``int4``), each linear layer takes the file's own blocks, repacked without
rounding by ``kernels.gguf_blocks`` (Q4_1 -> int4 group 32, Q8_0 -> per-group int8), so the model
computes with exactly the weights llama.cpp would. The tied LM head reads ``token_embd``'s blocks
while the embedding itself stays float.

A layer keeps the loader's float weight when its GGUF tensors are another type (F16, F32,
K-quants...), when the parts of a fused layer (``qkv``, ``gate_up``) are not all one type, or when
the int4 layout cannot pack its K (Q4_1 needs a multiple of 64); ``NativeLoad`` says which and why.

Owns which GGUF tensors make up each of our (fused) linear layers and their row order. Does not
own reading the file (``loader``), the byte layouts (``kernels.gguf_blocks``) nor the matmuls
(``kernel_quant``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from kernels import gguf_blocks
from selfhost import loader
from selfhost.models.kernel_quant import KernelInt4Weight, KernelInt8Weight, KernelWeight

if TYPE_CHECKING:
    from pathlib import Path

    from selfhost.models.linear import Linear
    from selfhost.models.llama import DecoderLayer, LlamaForCausalLM

NATIVE_TYPES = ("Q4_1", "Q8_0")
"""GGUF tensor types the kernels take as they are."""


@dataclass(slots=True)
class NativeLoad:
    """What ``load_native`` did, per linear layer (named like our modules: ``layers.0.attn.qkv``)."""

    native: dict[str, str] = field(default_factory=dict)
    """Layer -> GGUF type of the blocks it now computes from."""
    kept_float: dict[str, str] = field(default_factory=dict)
    """Layer -> why it keeps its float weight."""


def load_native(model: LlamaForCausalLM, path: Path) -> NativeLoad:
    """Swap every linear layer of ``model`` (loaded from the GGUF file ``path``) for the file's own blocks.

    The model's float weights must already be loaded (``loader.load_model``) and on their device:
    norms, the embedding and any layer that stays float keep them. Marks the model ``gguf``.

    Raises:
        ValueError: ``path`` is not a GGUF file, or the model is already quantized.
    """
    if not loader.is_gguf(path):
        raise ValueError(f"quantization 'gguf' needs a GGUF model file, got {path}")
    if model.quantization != "none":
        raise ValueError(f"the model is already quantized as {model.quantization}")
    tensors = {t.name: t for t in loader.gguf_reader(path).tensors}
    report = NativeLoad()
    for name, linear, parts in _layers(model):
        reason = _why_not_native(linear, [tensors.get(p) for p in parts])
        if reason:
            report.kept_float[name] = reason
            continue
        assert linear.weight is not None  # noqa: S101 (checked by _why_not_native)
        device = linear.weight.device
        raws = [_raw_rows(tensors[p], model) for p in parts]
        kind = tensors[parts[0]].tensor_type.name
        linear.qweight = _repack(torch.cat(raws).to(device), kind)
        linear.weight = None  # a tied embedding keeps its own reference
        report.native[name] = kind
    model.quantization = "gguf"
    return report


def _layers(model: LlamaForCausalLM) -> list[tuple[str, Linear, list[str]]]:
    """``(our name, layer, GGUF tensor names in the row order of our fused weight)`` for every linear."""
    out: list[tuple[str, Linear, list[str]]] = []
    for i, layer in enumerate(cast("list[DecoderLayer]", list(model.layers))):
        blk = f"blk.{i}"
        attn, mlp = layer.attn, layer.mlp
        out += [
            (
                f"layers.{i}.attn.qkv",
                attn.qkv,
                [f"{blk}.attn_q.weight", f"{blk}.attn_k.weight", f"{blk}.attn_v.weight"],
            ),
            (f"layers.{i}.attn.o", attn.o, [f"{blk}.attn_output.weight"]),
            (f"layers.{i}.mlp.gate_up", mlp.gate_up, [f"{blk}.ffn_gate.weight", f"{blk}.ffn_up.weight"]),
            (f"layers.{i}.mlp.down", mlp.down, [f"{blk}.ffn_down.weight"]),
        ]
    head = "token_embd.weight" if model.cfg.tie_word_embeddings else "output.weight"
    out.append(("lm_head", model.lm_head, [head]))
    return out


def _why_not_native(linear: Linear, parts: list[Any]) -> str:
    """Empty when ``parts`` (GGUF tensors, None where absent) can back ``linear`` natively; else the reason."""
    if linear.weight is None:
        return "already quantized"
    if any(t is None for t in parts):
        return "tensor missing from the file"
    kinds = {t.tensor_type.name for t in parts}
    if len(kinds) > 1:
        return f"fused parts of different types {sorted(kinds)}"
    kind = kinds.pop()
    if kind not in NATIVE_TYPES:
        return f"type {kind} has no kernel layout"
    if kind == "Q4_1" and linear.in_features % (2 * gguf_blocks.BLOCK):
        return f"Q4_1 with K={linear.in_features} (the int4 layout needs a multiple of {2 * gguf_blocks.BLOCK})"
    return ""


def _raw_rows(tensor: Any, model: LlamaForCausalLM) -> torch.Tensor:
    """The ``(rows, bytes)`` uint8 blocks of one GGUF tensor, Q/K rows put back in Hugging Face order."""
    raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))  # a writable copy of the memory map
    cfg = model.cfg
    # NOTE(gguf_native): llama.cpp's converter permutes Q/K rows of the llama architecture; blocks
    # run along a row, so the loader's row unpermutation applies to the bytes unchanged.
    if cfg.architecture == "llama" and ".attn_q." in tensor.name:
        raw = loader.unpermute_rope_rows(raw, cfg.num_heads)
    elif cfg.architecture == "llama" and ".attn_k." in tensor.name:
        raw = loader.unpermute_rope_rows(raw, cfg.num_kv_heads)
    return raw


def _repack(raw: torch.Tensor, kind: str) -> KernelWeight:
    if kind == "Q4_1":
        packed, scales, zeros = gguf_blocks.q4_1_to_int4(raw)
        return KernelInt4Weight(packed, scales, zeros, gguf_blocks.BLOCK)
    qweight, d = gguf_blocks.q8_0_to_int8(raw)
    return KernelInt8Weight(qweight, d, gguf_blocks.BLOCK)
