"""A GGUF model run from its own Q4_1 / Q8_0 blocks (``quantization="gguf"``) against its dequantized torch path.

A tiny random Llama is written with gguf-py's writer and quantizer: Q4_1 and Q8_0 linears, a Q8_0
embedding (the tied LM head), plus a fused layer whose parts mix types and an F16 layer, which must
stay float. Both models load from the same file; the native one computes on the kernels (the CPU
under the interpreter in CI), the reference one on plain torch with the loader's fp32 weights.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from kernels import reference
from selfhost import loader
from selfhost.config import EngineConfig
from selfhost.engine import LLMEngine
from selfhost.models.gguf_native import load_native
from selfhost.models.kernel_quant import KernelInt4Weight, KernelInt8Weight
from selfhost.models.ops import build_attention_metadata
from selfhost.sampling import SamplingParams

if TYPE_CHECKING:
    from pathlib import Path

    from selfhost.models.llama import LlamaForCausalLM

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 128, 2, 4, 2, 256
Q4_1, Q8_0, F16, F32 = (gguf.GGMLQuantizationType[t] for t in ("Q4_1", "Q8_0", "F16", "F32"))
# layer 1 mixes Q4_1 and Q8_0 inside qkv and has an F16 down projection: both stay float
TYPES = {
    "attn_q": (Q4_1, Q4_1),
    "attn_k": (Q4_1, Q4_1),
    "attn_v": (Q4_1, Q8_0),
    "attn_output": (Q8_0, Q8_0),
    "ffn_gate": (Q4_1, Q4_1),
    "ffn_up": (Q4_1, Q4_1),
    "ffn_down": (Q4_1, F16),
}
SHAPES = {
    "attn_q": (HEADS * 16, HIDDEN),
    "attn_k": (KV_HEADS * 16, HIDDEN),
    "attn_v": (KV_HEADS * 16, HIDDEN),
    "attn_output": (HIDDEN, HEADS * 16),
    "ffn_gate": (INTER, HIDDEN),
    "ffn_up": (INTER, HIDDEN),
    "ffn_down": (HIDDEN, INTER),
}


def _byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte, so any text tokenizes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _add(writer: gguf.GGUFWriter, name: str, w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    if qtype in (Q4_1, Q8_0):
        writer.add_tensor(name, quants.quantize(w, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, w.astype(np.float16 if qtype == F16 else np.float32))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(_byte_tokens())
    writer.add_token_types([1] * VOCAB)
    writer.add_eos_token_id(0)
    _add(writer, "token_embd.weight", rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), Q8_0)
    _add(writer, "output_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), F32)
    for i in range(LAYERS):
        for norm in ("attn_norm", "ffn_norm"):
            _add(writer, f"blk.{i}.{norm}.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), F32)
        for name, (n, k) in SHAPES.items():
            w = (rng.standard_normal((n, k)) * 1.5 / np.sqrt(k)).astype(np.float32)
            _add(writer, f"blk.{i}.{name}.weight", w, TYPES[name][i])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _models(path: Path, device: torch.device | str = "cpu") -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """``(float model on the CPU, native model on device)`` from the same file."""
    cfg = loader.load_model_config(path)
    dequantized = loader.load_model(path, cfg, torch.float32, 64)
    native = loader.load_model(path, cfg, torch.float32, 64).to(device)  # load_native wants it on its device
    load_native(native, path)
    return dequantized, native


def test_gguf_linears_take_the_files_blocks_and_mixed_or_other_types_stay_float(tiny_gguf: Path) -> None:
    dequantized, native = _models(tiny_gguf)
    report = load_native(
        loader.load_model(tiny_gguf, loader.load_model_config(tiny_gguf), torch.float32, 64), tiny_gguf
    )
    assert report.native == {
        "layers.0.attn.qkv": "Q4_1",
        "layers.0.attn.o": "Q8_0",
        "layers.0.mlp.gate_up": "Q4_1",
        "layers.0.mlp.down": "Q4_1",
        "layers.1.attn.o": "Q8_0",
        "layers.1.mlp.gate_up": "Q4_1",
        "lm_head": "Q8_0",
    }
    assert report.kept_float == {
        "layers.1.attn.qkv": "fused parts of different types ['Q4_1', 'Q8_0']",
        "layers.1.mlp.down": "type F16 has no kernel layout",
    }
    assert native.quantization == "gguf"
    assert native.embed.dtype == torch.float32  # the embedding stays float, the tied head is Q8_0 blocks
    for ref, ours in zip(dequantized.linears(), native.linears(), strict=True):
        qw = ours.qweight
        if isinstance(qw, KernelInt4Weight):
            w = reference.dequantize_int4(qw.packed, qw.scales, qw.zeros, qw.group_size)
        elif isinstance(qw, KernelInt8Weight):
            w = reference.dequantize_int8(qw.qweight, qw.scales)
        else:
            continue
        assert ref.weight is not None
        # the loader's gguf-py dequantization, Q/K rows unpermuted, up to one fp32 rounding
        torch.testing.assert_close(w, ref.weight, rtol=1e-6, atol=1e-6)


def _logits(model: LlamaForCausalLM, prompt: list[int], steps: list[int], kernels: bool) -> list[torch.Tensor]:
    """Prefill ``prompt`` then decode ``steps`` one token at a time (on the model's device); the last row's logits after each."""
    cfg, block = model.cfg, 4
    dev = model.embed.device
    table = list(reversed(range(16)))
    shape = (16, block, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, device=dev), torch.zeros(shape, device=dev)) for _ in range(cfg.num_layers)]
    out, start = [], 0
    for ids in [prompt, *([t] for t in steps)]:
        meta = build_attention_metadata([0, len(ids)], [start + len(ids)], [table], block, dev)
        with torch.inference_mode():
            positions = torch.arange(start, start + len(ids), device=dev)
            hidden = model(torch.tensor(ids, device=dev), positions, caches, meta, kernels=kernels)
            out.append(model.compute_logits(hidden[-1:])[0].cpu())
        start += len(ids)
    return out


def test_native_kernel_logits_equal_dequantized_torch_logits(device: torch.device, tiny_gguf: Path) -> None:
    dequantized, native = _models(tiny_gguf, device)
    prompt = [(37 * i + 11) % VOCAB for i in range(9)]  # 9 rows: the tiled path; decode rows: GEMV
    ref = _logits(dequantized, prompt, [5, 200, 17], kernels=False)
    ours = _logits(native, prompt, [5, 200, 17], kernels=True)
    for r, o in zip(ref, ours, strict=True):
        assert float((o.cpu() - r).abs().max() / r.abs().max()) < 2e-5  # fp32 rounding (measured ~1.5e-6)
        assert int(o.argmax()) == int(r.argmax())


def test_native_gguf_engine_generates_the_dequantized_engines_greedy_tokens(
    device: torch.device, tiny_gguf: Path
) -> None:
    base = EngineConfig(block_size=4, num_kv_blocks=64, max_model_len=64, max_num_seqs=4, device=str(device))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = ["The quick brown fox", "GGUF"]
    expected = LLMEngine.from_model(tiny_gguf, replace(base, device="cpu", use_kernels=False)).generate(prompts, params)
    engine = LLMEngine.from_model(tiny_gguf, replace(base, quantization="gguf", use_kernels=True))
    assert engine.generate(prompts, params) == expected
    assert len({tuple(t) for t in expected}) > 1  # the prompts do not collapse onto one output


def test_gguf_quantization_needs_the_kernels_and_a_gguf_file(tmp_path: Path, tiny_gguf: Path) -> None:
    with pytest.raises(ValueError, match="runs on the Triton kernels"):
        EngineConfig(quantization="gguf", use_kernels=False)
    model, _ = _models(tiny_gguf)
    not_gguf = tmp_path / "model.bin"
    not_gguf.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="needs a GGUF model file"):
        load_native(model, not_gguf)
    with pytest.raises(ValueError, match="file's own blocks"):
        model.quantize("gguf")
