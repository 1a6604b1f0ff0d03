"""Load a model's shape and weights from a Hugging Face folder or a GGUF file.

Owns reading ``config.json`` + ``*.safetensors`` and GGUF metadata + tensors (dequantized to float
with the ``gguf`` package), and turning both into a ``ModelConfig`` and a ``LlamaForCausalLM`` with
weights. Does not own the tokenizer (``tokenizer``), fetching the default model (``fetch``) or
anything the engine does with the model afterwards.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from selfhost.config import ModelConfig, RopeScaling
from selfhost.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HF_ARCHS = {"llama", "mistral", "qwen2"}
_GGUF_ARCHS = {"llama", "qwen2"}


def torch_dtype(name: str) -> torch.dtype:
    """Map a dtype name of ``EngineConfig`` to a torch dtype."""
    return _DTYPES[name]


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file (by its magic bytes)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def load_model_config(path: Path) -> ModelConfig:
    """Read the model's shape from ``path`` (a HF folder or a GGUF file).

    Raises:
        ValueError: the file or folder is not a supported Llama-family model.
    """
    if is_gguf(path):
        return _gguf_config(gguf_reader(path))
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is neither a GGUF file nor a folder with config.json")
    raw = json.loads(config_file.read_text())
    return _hf_config(raw, has_lm_head=_safetensors_has(path, "lm_head.weight"))


def load_model(path: Path, cfg: ModelConfig, dtype: torch.dtype, max_positions: int) -> LlamaForCausalLM:
    """Build the model for ``cfg`` and fill its weights from ``path``, cast to ``dtype``."""
    model = LlamaForCausalLM(cfg, max_positions)
    weights = _gguf_weights(path, cfg) if is_gguf(path) else _safetensors_weights(path)
    with torch.no_grad():
        model.load_weights(weights)
    return model.to(dtype).eval()


# Hugging Face folders


def _hf_config(raw: dict[str, Any], has_lm_head: bool) -> ModelConfig:
    arch = raw.get("model_type", "")
    if arch not in _HF_ARCHS:
        raise ValueError(f"unsupported model_type {arch!r}; supported: {sorted(_HF_ARCHS)}")
    heads = raw["num_attention_heads"]
    rope = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or rope
    eos = raw.get("eos_token_id")
    tie = raw.get("tie_word_embeddings")
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        rope_theta=float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rope_scaling=_rope_scaling(scaling),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        # NOTE(crossway): save_pretrained omits values equal to the class default, so a missing
        # tie_word_embeddings is read from the checkpoint itself: no lm_head tensor means tied.
        tie_word_embeddings=bool(tie) if tie is not None else not has_lm_head,
        qkv_bias=arch == "qwen2" or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        architecture=arch,
    )


def _rope_scaling(raw: dict[str, Any]) -> RopeScaling | None:
    kind = raw.get("rope_type") or raw.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling {kind!r}; supported: default, llama3")
    return RopeScaling(
        factor=float(raw["factor"]),
        low_freq_factor=float(raw["low_freq_factor"]),
        high_freq_factor=float(raw["high_freq_factor"]),
        original_max_position=int(raw["original_max_position_embeddings"]),
    )


def _safetensors_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    return files


def _safetensors_has(path: Path, name: str) -> bool:
    from safetensors import safe_open

    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                return True
    return False


def _safetensors_weights(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                yield name, f.get_tensor(name).float()


# GGUF files


@functools.lru_cache(maxsize=2)
def _gguf_reader(path: Path) -> Any:
    # NOTE(crossway): parsing the metadata of a 49k-token vocabulary takes seconds, and config,
    # weights and tokenizer all read it, so the reader (a read-only memory map) is shared.
    import gguf

    return gguf.GGUFReader(str(path))


def gguf_reader(path: Path) -> Any:
    """The shared ``gguf.GGUFReader`` of ``path`` (opened once per path)."""
    return _gguf_reader(path.resolve())


def gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    """Read one scalar, string or array metadata value of a GGUF file (``default`` when absent)."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _gguf_config(reader: Any) -> ModelConfig:
    arch = gguf_field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(_GGUF_ARCHS)}")

    def key(name: str, default: Any = None) -> Any:
        return gguf_field(reader, f"{arch}.{name}", default)

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = key("vocab_size") or len(gguf_field(reader, "tokenizer.ggml.tokens"))
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        o_bias="blk.0.attn_output.bias" in names,
        max_position_embeddings=int(key("context_length", 2048)),
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        architecture=arch,
    )


_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _gguf_to_hf_name(name: str) -> str | None:
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if name in top:
        return top[name]
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")  # blk.{i}.{module}.{weight|bias}
    if parts[0] != "blk" or parts[2] not in _GGUF_NAMES:
        return None  # e.g. rope_freqs: recomputed from the config
    return f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo the row order llama.cpp's converter gives Q/K weights of the llama architecture.

    The converter interleaves each head's two rotary halves (row ``2i`` and ``2i+1`` hold dims
    ``i`` and ``i + hd/2``) so that GGML's pairwise RoPE applies; we use the half-split
    (``rotate_half``) layout of Hugging Face, so the rows go back: ``(nh, hd/2, 2) -> (nh, 2, hd/2)``.
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)  # (nh * hd, ...)


def _gguf_weights(path: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf import quants

    reader = gguf_reader(path)
    for t in reader.tensors:
        name = _gguf_to_hf_name(t.name)
        if name is None:
            continue
        shape = tuple(reversed([int(d) for d in t.shape]))  # GGUF lists dims innermost first
        arr = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)  # a writable copy
        tensor = torch.from_numpy(arr)
        if cfg.architecture == "llama" and ".self_attn.q_proj." in name:
            tensor = unpermute_rope_rows(tensor, cfg.num_heads)
        elif cfg.architecture == "llama" and ".self_attn.k_proj." in name:
            tensor = unpermute_rope_rows(tensor, cfg.num_kv_heads)
        yield name, tensor
