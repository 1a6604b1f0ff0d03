"""Our model's logits against Hugging Face transformers on the same weights, prefill and every decode step."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import torch

from selfhost.loader import load_model, load_model_config, unpermute_rope_rows
from selfhost.models.ops import build_attention_metadata

if TYPE_CHECKING:
    from pathlib import Path

    from selfhost.models.llama import LlamaForCausalLM
    from tests.selfhost.conftest import Loaded

from tests.selfhost.conftest import chat_ids

REL_TOL = 1e-4
BLOCK = 4


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def run_paged(model: LlamaForCausalLM, prompt: list[int], continuation: list[int]) -> list[torch.Tensor]:
    """Prefill ``prompt`` then feed ``continuation`` one token at a time through a scattered block table.

    Returns the logits after the prefill and after each decode step.
    """
    cfg = model.cfg
    total = len(prompt) + len(continuation)
    num_blocks = -(-total // BLOCK) + 3
    # blocks deliberately out of order, so the test exercises the paging
    table = list(reversed(range(num_blocks)))
    shape = (num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]

    def step(ids: list[int], start: int) -> torch.Tensor:
        positions = list(range(start, start + len(ids)))
        meta = build_attention_metadata([0, len(ids)], [start + len(ids)], [table], BLOCK, torch.device("cpu"))
        with torch.inference_mode():
            hidden = model(torch.tensor(ids), torch.tensor(positions), caches, meta)
            return model.compute_logits(hidden[-1:])[0]

    out = [step(prompt, 0)]
    for i, token in enumerate(continuation):
        out.append(step([token], len(prompt) + i))
    return out


Explain = Callable[[list[int], list[int], int, torch.Tensor, torch.Tensor], str]
"""``(prompt, continuation, step, ours, ref) -> str``: more to say when a step's logits are off."""


def assert_matches_hf(
    model: LlamaForCausalLM, hf: Any, prompt: list[int], steps: int, explain: Explain | None = None
) -> None:
    with torch.inference_mode():
        generated = hf.generate(
            torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0, eos_token_id=None
        )[0].tolist()
        ref_logits = hf(torch.tensor([generated])).logits[0]  # (T, V)
    continuation = generated[len(prompt) :]
    ours = run_paged(model, prompt, continuation[:-1])
    assert len(ours) == steps
    for i, logits in enumerate(ours):
        ref = ref_logits[len(prompt) - 1 + i]
        err = rel_err(logits, ref)
        if err >= REL_TOL:
            detail = ""
            if explain is not None:
                try:
                    detail = explain(prompt, continuation[:-1], i, logits, ref)
                except Exception as exc:  # noqa: BLE001 (the comparison's failure is the one to report)
                    detail = f"; explaining it failed: {exc!r}"
            pytest.fail(f"step {i}: relative error {err:.3g} against HF's logits (tolerance {REL_TOL}){detail}")


def explain_with_fresh_model(loaded: Loaded) -> Explain:
    """What a failure of the shared model's comparison needs said: does a fresh load of the same file agree?

    NOTE(crossway): the SmolLM2 comparison failed in CI twice, each time at step 0 at 1.6e-4, where
    runs agree to ~1.4e-6; it did not fail in one process over every other test file, with the
    shared model's parameters, buffers and logits checked after each test. A fresh model that
    matches HF points at the shared fixture's state (the second failure: fresh 1.43e-6, shared 1.6e-4
    from fresh), and ``state_diff`` names where it differs; one that does not, at the process (its
    threads, its torch settings), which this prints too.
    """

    def explain(prompt: list[int], continuation: list[int], step: int, ours: torch.Tensor, ref: torch.Tensor) -> str:
        fresh = load_model(loaded.path, loaded.config, torch.float32, loaded.model.max_positions)
        again = run_paged(fresh, prompt, continuation)[step]
        threads = sorted(t.name for t in threading.enumerate())
        return (
            f"; a freshly loaded model: {rel_err(again, ref):.3g} against HF, {rel_err(ours, again):.3g} between"
            f" the shared model and it; where their states differ: {state_diff(loaded.model, fresh)};"
            f" torch threads {torch.get_num_threads()}, default dtype {torch.get_default_dtype()},"
            f" fp32 matmul precision {torch.get_float32_matmul_precision()}; live Python threads {threads}"
        )

    return explain


def state_diff(shared: torch.nn.Module, fresh: torch.nn.Module, most: int = 8) -> str:
    """The first tensors and plain attributes in which two models of one file differ, or "nowhere"."""
    out = []
    fresh_tensors = {**dict(fresh.named_parameters()), **dict(fresh.named_buffers())}
    for name, t in [*shared.named_parameters(), *shared.named_buffers()]:
        f = fresh_tensors.get(name)
        if f is None or f.shape != t.shape or f.dtype != t.dtype:
            out.append(f"{name}: {tuple(t.shape)} {t.dtype} against {None if f is None else (tuple(f.shape), f.dtype)}")
        elif not torch.equal(t, f):
            out.append(f"{name}: max abs diff {float((t.float() - f.float()).abs().max()):.3g}")
    fresh_modules = dict(fresh.named_modules())
    for name, m in shared.named_modules():
        plain = {k: v for k, v in vars(m).items() if not k.startswith("_") and not isinstance(v, torch.Tensor)}
        other = vars(fresh_modules[name]) if name in fresh_modules else {}
        out += [
            f"{name or 'model'}.{k} = {v!r} against {other.get(k)!r}" for k, v in plain.items() if other.get(k) != v
        ]
    if not out:
        return "nowhere"
    more = f" (+{len(out) - most} more)" if len(out) > most else ""
    return "; ".join(out[:most]) + more


TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def save_tiny(tmp_path: Path, kind: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if kind == "qwen2":
        hf = Qwen2ForCausalLM(Qwen2Config(**TINY, rope_theta=1e6, tie_word_embeddings=True))
    elif kind == "llama3-rope":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        hf = LlamaForCausalLM(LlamaConfig(**TINY, rope_parameters=rope))
    elif kind == "llama-bias":
        hf = LlamaForCausalLM(LlamaConfig(**TINY, attention_bias=True, mlp_bias=True, head_dim=24))
    else:
        hf = LlamaForCausalLM(LlamaConfig(**TINY))
    # random init is near-uniform; widen the weights so the logits have structure worth comparing
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    return hf.eval()


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "llama-bias", "qwen2"])
def test_logits_match_hf_for_tiny_random_checkpoint(tmp_path: Path, kind: str) -> None:
    hf = save_tiny(tmp_path, kind)
    cfg = load_model_config(tmp_path)
    assert cfg.architecture == ("qwen2" if kind == "qwen2" else "llama")
    model = load_model(tmp_path, cfg, torch.float32, 128)
    prompt = torch.randint(0, 256, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    assert_matches_hf(model, hf, prompt, steps=12)


@pytest.mark.slow
def test_logits_match_hf_for_smollm2_gguf(smollm2: Loaded, hf_smollm2: Any) -> None:
    prompt = chat_ids(smollm2, "Tell me a short story about a robot.")
    assert_matches_hf(smollm2.model, hf_smollm2, prompt, steps=8, explain=explain_with_fresh_model(smollm2))


def test_unpermute_rope_rows_inverts_llama_cpp_permutation() -> None:
    """llama.cpp's converter permutes rows ``(nh, 2, hd/2) -> (nh, hd/2, 2)``; we undo it exactly."""
    nh, hd, cols = 3, 8, 5
    w = torch.arange(nh * hd * cols, dtype=torch.float32).reshape(nh * hd, cols)
    permuted = w.reshape(nh, 2, hd // 2, cols).transpose(1, 2).reshape(nh * hd, cols)
    assert torch.equal(unpermute_rope_rows(permuted, nh), w)
