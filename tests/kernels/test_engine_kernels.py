"""The engine on the Triton kernels (``models.fused``, CUDA graphs on a GPU) against the plain torch engine.

A tiny random-weight Llama shape (GQA ratio 3, head dim 16, 4-token blocks) runs on the CPU under
the interpreter in CI and on CUDA through the device tool; in fp32 greedy ids must equal the torch
path's token for token, whatever the batching, prefix hits and prefill chunking.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels import reference
from selfhost.config import EngineConfig, ModelConfig
from selfhost.engine import LLMEngine
from selfhost.models.linear import Linear
from selfhost.models.llama import LlamaForCausalLM
from selfhost.request import Request
from selfhost.sampling import SamplingParams, sample

TINY = ModelConfig(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def tiny_model(device: torch.device | str, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    gen = torch.Generator().manual_seed(0)
    model = LlamaForCausalLM(TINY, 256)
    for name, p in model.named_parameters():
        if name.endswith("norm"):
            p.data = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            p.data = 0.2 * torch.randn(p.shape, generator=gen)
    return model.to(device=device, dtype=dtype)


def prompts() -> list[list[int]]:
    shared = [(7 * i + 3) % 96 for i in range(17)]  # 4 full blocks shared by two prompts
    return [[5, 9, 2, 44, 81], [*shared, 1, 2, 3], [(3 * i) % 96 for i in range(33)], [*shared, 60, 61]]


def generate(model: LlamaForCausalLM, device: torch.device | str, **overrides: object) -> list[list[int]]:
    cfg = EngineConfig(block_size=4, num_kv_blocks=128, max_model_len=128, max_num_seqs=8, device=str(device))
    cfg = replace(cfg, **overrides)  # type: ignore[arg-type]
    engine = LLMEngine(model, TINY, None, cfg)
    return engine.generate(prompts(), GREEDY)


def test_kernel_engine_greedy_equals_torch_engine_in_fp32(device: torch.device) -> None:
    expected = generate(tiny_model("cpu"), "cpu", use_kernels=False)
    got = generate(tiny_model(device), device, use_kernels=True)
    assert got == expected


def test_kernel_engine_runs_in_bf16_and_starts_like_the_torch_engine(device: torch.device) -> None:
    # bf16 is the GPU's serving dtype; rounding lets the two paths drift apart after a few tokens
    expected = generate(tiny_model("cpu", torch.bfloat16), "cpu", use_kernels=False, dtype="bfloat16")
    got = generate(tiny_model(device, torch.bfloat16), device, use_kernels=True, dtype="bfloat16")
    assert [len(g) for g in got] == [len(e) for e in expected]
    assert [g[0] for g in got] == [e[0] for e in expected]


def test_kernel_engine_is_invariant_under_chunking_prefix_hits_and_one_at_a_time(device: torch.device) -> None:
    model = tiny_model(device)
    together = generate(model, device, use_kernels=True)
    chunked = generate(model, device, use_kernels=True, max_num_batched_tokens=8)
    uncached = generate(model, device, use_kernels=True, enable_prefix_caching=False)
    alone = [generate(model, device, use_kernels=True, max_num_seqs=1)]
    assert chunked == together
    assert uncached == together
    assert alone[0] == together
    assert len({tuple(t) for t in together}) > 1  # the prompts do not collapse onto one output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_steps_equal_eager_steps() -> None:
    model = tiny_model("cuda")
    graphs = generate(model, "cuda", use_kernels=True)
    eager = generate(model, "cuda", use_kernels=True, enforce_eager=True)
    assert graphs == eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the int4 GEMV reads x as pairs only on a GPU")
def test_int4_engine_with_x_pairs_equals_it_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape wide enough for the int4 half2 GEMV: its norms (the final one too) hand it x as pairs, and greedy ids do not move."""
    wide = replace(TINY, hidden_size=2048, intermediate_size=4096, num_heads=16, num_kv_heads=4, head_dim=128)
    gen = torch.Generator().manual_seed(0)
    model = LlamaForCausalLM(wide, 256)
    for name, p in model.named_parameters():
        p.data = (
            1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            if name.endswith("norm")
            else 0.02 * torch.randn(p.shape, generator=gen)
        )
    model = model.to(device="cuda", dtype=torch.bfloat16)
    model.quantize("int4", group_size=128, kernels=True)
    layer = model.decoder_layers()[0]
    assert layer.attn.qkv.x_pairs(1, torch.bfloat16) is not None
    assert layer.mlp.gate_up.x_pairs(1, torch.bfloat16) is not None
    assert model.lm_head.x_pairs(1, torch.bfloat16) is not None  # the final norm's, in every decode step

    def run() -> list[list[int]]:
        cfg = EngineConfig(
            block_size=4, num_kv_blocks=128, max_model_len=128, max_num_seqs=8, dtype="bfloat16", device="cuda",
            quantization="int4", quant_group_size=128,
        )  # fmt: skip
        return LLMEngine(model, wide, None, cfg).generate(prompts(), GREEDY)

    with_pairs = run()
    monkeypatch.setattr(Linear, "x_pairs", lambda self, m, dtype: None)
    assert run() == with_pairs


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_kernel_quantized_linear_matches_its_dequantized_reference(device: torch.device, mode: str) -> None:
    torch.manual_seed(0)
    linear = Linear(128, 48, bias=False).to(device)
    linear.weight.data.normal_()  # type: ignore[union-attr]
    x = torch.randn(5, 128, device=device)
    linear.quantize(mode, 32, kernels=True)  # type: ignore[arg-type]
    qw = linear.qweight
    if mode == "int8":
        ref = reference.int8_matmul(x.cpu(), qw.qweight.cpu(), qw.scales.cpu())  # type: ignore[union-attr]
    else:
        ref = reference.int4_matmul(x.cpu(), qw.packed.cpu(), qw.scales.cpu(), qw.zeros.cpu(), 32)  # type: ignore[union-attr]
    torch.testing.assert_close(linear(x).cpu(), ref, atol=1e-3, rtol=1e-3)


def test_batched_sampling_keeps_to_top_k_and_top_p() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, -1.0]] * 3)
    reqs = [
        Request("k2", [1], SamplingParams(temperature=1.0, top_k=2)),
        Request("p", [1], SamplingParams(temperature=1.0, top_p=0.01)),
        Request("hot", [1], SamplingParams(temperature=100.0)),
    ]
    seen: list[set[int]] = [set(), set(), set()]
    for _ in range(200):
        for i, t in enumerate(sample(logits, reqs).token_ids):
            seen[i].add(t)
    assert seen[0] == {1, 2}  # top-2 only, both drawn
    assert seen[1] == {1}  # the nucleus holds the most likely token alone
    assert seen[2] == {0, 1, 2, 3}  # a hot temperature reaches every token
