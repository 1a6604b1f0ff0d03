"""SmolLM2 on the engine's GPU path (Triton kernels, CUDA graphs) against its CPU path and HF transformers.

Skipped without CUDA; run through the device tool. fp32 on the GPU must give the CPU's greedy ids
token for token, batched or alone, with prefix hits, chunked prefill and with or without CUDA graphs;
bf16 must match HF transformers (bf16, same GPU) by vLLM's rule: at the first differing token each
side's pick is in the other's top 5.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import torch

from selfhost.block_hash import extend_block_hashes
from selfhost.loader import load_model
from selfhost.runner import DECODE_ROWS_MAX
from selfhost.sampling import SamplingParams
from tests.selfhost.conftest import CHAT_PROMPTS, Loaded, chat_ids, make_engine

if TYPE_CHECKING:
    from selfhost.models.llama import LlamaForCausalLM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def gpu_fp32(smollm2: Loaded) -> Loaded:
    model = load_model(smollm2.path, smollm2.config, torch.float32, 2048).to("cuda")
    return Loaded(smollm2.path, smollm2.config, model, smollm2.tokenizer)


@pytest.fixture(scope="module")
def cpu_ids(smollm2: Loaded) -> list[list[int]]:
    ids = [chat_ids(smollm2, p) for p in CHAT_PROMPTS]
    return make_engine(smollm2).generate(ids, GREEDY)


def test_gpu_fp32_greedy_equals_cpu_fp32(smollm2: Loaded, gpu_fp32: Loaded, cpu_ids: list[list[int]]) -> None:
    ids = [chat_ids(smollm2, p) for p in CHAT_PROMPTS]
    assert make_engine(gpu_fp32, device="cuda").generate(ids, GREEDY) == cpu_ids


@pytest.mark.parametrize(
    "overrides",
    [
        {"enforce_eager": True},
        {"max_num_seqs": 1},
        {"max_num_batched_tokens": 7},
        {"enable_prefix_caching": False},
    ],
    ids=["no-graphs", "alone", "chunked", "no-prefix-cache"],
)
def test_gpu_fp32_is_invariant(
    smollm2: Loaded, gpu_fp32: Loaded, cpu_ids: list[list[int]], overrides: dict[str, Any]
) -> None:
    ids = [chat_ids(smollm2, p) for p in CHAT_PROMPTS]
    engine = make_engine(gpu_fp32, device="cuda", **overrides)
    assert engine.generate(ids, GREEDY) == cpu_ids
    if overrides.get("enable_prefix_caching", True) and overrides.get("max_num_seqs", 2) > 1:
        # the same prompts again hit their cached prefixes and must not change a token
        assert engine.generate(ids, GREEDY) == cpu_ids
        assert engine.metrics_snapshot().prefix_cache_hit_rate > 0.2


def _hf_greedy_top5(hf: Any, prompt: list[int], n: int) -> tuple[list[int], list[set[int]]]:
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt], device="cuda"),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=2,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, [set(s[0].topk(5).indices.tolist()) for s in out.scores]


def test_gpu_bf16_matches_hf_bf16_by_top5_rule(smollm2: Loaded, hf_smollm2: Any) -> None:
    model: LlamaForCausalLM = load_model(smollm2.path, smollm2.config, torch.bfloat16, 2048).to("cuda")
    bf16 = Loaded(smollm2.path, smollm2.config, model, smollm2.tokenizer)
    engine = make_engine(bf16, device="cuda", dtype="bfloat16")
    hf = hf_smollm2.to(device="cuda", dtype=torch.bfloat16)
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=5)
    exact = 0
    for text in CHAT_PROMPTS:
        prompt = chat_ids(smollm2, text)
        request = engine.add_request(f"p{text}", prompt, params)
        tops: list[set[int]] = []
        ours: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                ours += out.token_ids
                tops += [{t for t, _ in lp.top} for lp in out.logprobs or [] if lp is not None]
        assert request.num_output_tokens == len(ours)
        theirs, their_tops = _hf_greedy_top5(hf, prompt, len(ours))
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if diff is None:
            exact += 1
            continue
        assert ours[diff] in their_tops[diff] and theirs[diff] in tops[diff], (text, diff)
    # NOTE(crossway): on the H100, 4 of 12 prompts agreed for all 24 tokens (2026-11-23): bf16
    # rounding differs between our kernels (fp32 rotary tables, Triton attention) and HF's ops
    assert exact >= 1


def test_gpu_fp32_step_graphs_equal_eager_with_chunked_prefill_and_prefix_hits(
    smollm2: Loaded, gpu_fp32: Loaded
) -> None:
    """Steps replayed from ``StepGraphs``, and short prefix-hit tails as decode-graph rows, give the eager engine's ids."""
    ids = [chat_ids(smollm2, p) for p in CHAT_PROMPTS]
    # a 48-token budget chunks every prompt and mixes its chunks with running decodes; the shared
    # chat preamble, and the second round, hit cached prefixes and run only their tails
    eager = make_engine(gpu_fp32, device="cuda", enforce_eager=True, max_num_batched_tokens=48)
    graphs = make_engine(gpu_fp32, device="cuda", max_num_batched_tokens=48)
    step_graphs = getattr(graphs.runner, "step_graphs", None)
    assert step_graphs is not None, "ModelRunner.step_graphs is not wired: the engine never replays StepGraphs"
    want = eager.generate(ids, GREEDY)
    assert graphs.generate(ids, GREEDY) == want
    first_round = step_graphs.num_replays
    assert graphs.generate(ids, GREEDY) == eager.generate(ids, GREEDY) == want
    assert first_round > 0
    decode_graphs = graphs.runner.graphs
    assert decode_graphs is not None
    # each prompt cut a few tokens past a block boundary and run alone hits the blocks cached above:
    # a 12-token tail replays a step graph, a 4-token one runs as rows of the decode graphs
    # (runner.DECODE_ROWS_MAX)
    for tail in (12, 4):
        cut = [p[: (len(p) - tail - 1) // 16 * 16 + tail] for p in ids]
        steps_before, decodes_before = step_graphs.num_replays, decode_graphs.num_replays
        assert [graphs.generate([p], GREEDY)[0] for p in cut] == [eager.generate([p], GREEDY)[0] for p in cut]
        assert decode_graphs.num_replays > decodes_before  # the decode steps after the tails
        if tail > DECODE_ROWS_MAX:
            assert step_graphs.num_replays > steps_before
        else:
            assert step_graphs.num_replays == steps_before


def test_gpu_fp32_full_prefix_hit_equals_eager_and_leaves_the_shared_blocks_untouched(
    smollm2: Loaded, gpu_fp32: Loaded
) -> None:
    """Whole-block prompts run again with every block cached: the last token alone, through a decode graph, writing no KV."""
    cut = [p[: len(p) // 16 * 16] for p in (chat_ids(smollm2, q) for q in CHAT_PROMPTS) if len(p) >= 32]
    eager = make_engine(gpu_fp32, device="cuda", enforce_eager=True, enable_prefix_caching=False)
    want = [eager.generate([p], GREEDY)[0] for p in cut]
    graphs = make_engine(gpu_fp32, device="cuda")
    assert [graphs.generate([p], GREEDY)[0] for p in cut] == want  # caches every prompt's blocks
    index = graphs.kv.pool.cached_block_ids()
    blocks = torch.tensor(sorted({index[h] for p in cut for h in extend_block_hashes([], p, 16)}), device="cuda")
    before = [(k[blocks].clone(), v[blocks].clone()) for k, v in graphs.runner.kv_caches]
    decode_graphs, step_graphs = graphs.runner.graphs, graphs.runner.step_graphs
    assert decode_graphs is not None and step_graphs is not None
    decodes, steps = decode_graphs.num_replays, step_graphs.num_replays
    for p, expected in zip(cut, want, strict=True):
        request = graphs.add_request(f"again-{len(p)}", p, GREEDY)
        out: list[int] = []
        while graphs.has_unfinished_requests():
            out += [t for o in graphs.step() for t in o.token_ids]
        assert (request.num_cached_tokens, request.num_kv_tokens) == (len(p) - 1, len(p))
        assert out == expected
    assert step_graphs.num_replays == steps  # every step of the second round, its first too, was a decode graph's
    assert decode_graphs.num_replays > decodes
    after = [(k[blocks], v[blocks]) for k, v in graphs.runner.kv_caches]
    assert all(torch.equal(k0, k1) and torch.equal(v0, v1) for (k0, v0), (k1, v1) in zip(before, after, strict=True))
