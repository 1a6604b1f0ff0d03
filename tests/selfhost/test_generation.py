"""End-to-end greedy generation with SmolLM2: equal to HF transformers, and invariant to how it is batched."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import torch

from selfhost.sampling import SamplingParams
from tests.selfhost.conftest import CHAT_PROMPTS, chat_ids, make_engine

if TYPE_CHECKING:
    from tests.selfhost.conftest import Loaded

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
SYSTEM = "You are a terse assistant. Answer in as few words as possible, and never use lists or markdown."


def prompts(smollm2: Loaded) -> list[list[int]]:
    """16 prompts of mixed lengths; half share a long system prompt (prefix-cache material)."""
    out = [chat_ids(smollm2, p) for p in CHAT_PROMPTS[:8]]
    out += [chat_ids(smollm2, p, system=SYSTEM * 2) for p in CHAT_PROMPTS[4:12]]
    return out


@pytest.fixture(scope="module")
def alone(smollm2: Loaded) -> list[list[int]]:
    """Each prompt run by itself, no prefix caching, whole prefill: the reference."""
    engine = make_engine(smollm2, enable_prefix_caching=False)
    return [engine.generate([p], GREEDY)[0] for p in prompts(smollm2)]


def test_greedy_matches_hf_transformers_for_chat_prompts(smollm2: Loaded, hf_smollm2: Any) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0)
    ids = [chat_ids(smollm2, p) for p in CHAT_PROMPTS]
    ours = make_engine(smollm2).generate(ids, params)
    for prompt, got in zip(ids, ours, strict=True):
        with torch.inference_mode():
            ref = hf_smollm2.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=2
            )[0, len(prompt) :].tolist()
        assert got == ref, smollm2.tokenizer.decode(prompt)


def test_request_alone_equals_request_in_batch_of_16_mixed(smollm2: Loaded, alone: list[list[int]]) -> None:
    """16 greedy requests plus sampled and stop-string neighbours, with a small budget that mixes prefill chunks into decodes."""
    engine = make_engine(smollm2, max_num_batched_tokens=96, enable_prefix_caching=False)
    ps = prompts(smollm2)
    for i, p in enumerate(ps):
        engine.add_request(f"g{i}", p, GREEDY)
        if i % 4 == 0:
            engine.add_request(f"s{i}", p, SamplingParams(max_tokens=5 + i, temperature=0.9, top_p=0.9, seed=i))
    got: dict[str, list[int]] = {}
    max_batch = 0
    while engine.has_unfinished_requests():
        max_batch = max(max_batch, len(engine.scheduler.running))
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
    assert max_batch >= 16
    assert [got[f"g{i}"] for i in range(len(ps))] == alone


def test_prefix_cache_hit_equals_miss(smollm2: Loaded, alone: list[list[int]]) -> None:
    engine = make_engine(smollm2)
    ps = prompts(smollm2)
    assert engine.generate([ps[8]], GREEDY)[0] == alone[8]  # warms the shared system prompt
    for i in range(9, 16):
        request = engine.add_request(f"r{i}", ps[i], GREEDY)
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            tokens += [t for out in engine.step() for t in out.token_ids]
        assert request.num_cached_tokens >= 3 * 16, "the shared system prompt should hit"
        assert tokens == alone[i]
    # the very same prompt again: every full block hits; only the tail runs (a whole-block prompt: its last token)
    again = engine.add_request("again", ps[9], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    assert again.num_cached_tokens == min(len(ps[9]) // 16 * 16, len(ps[9]) - 1)
    assert engine.metrics_snapshot().prefix_cache_hit_rate > 0.4


def test_full_prefix_hit_equals_miss_and_leaves_the_shared_blocks_untouched(smollm2: Loaded) -> None:
    """A prompt of whole blocks, all cached, runs only its last token again, and writes no KV over the shared blocks."""
    prompt = prompts(smollm2)[9]
    prompt = prompt[: len(prompt) // 16 * 16]
    expected = make_engine(smollm2, enable_prefix_caching=False).generate([prompt], GREEDY)[0]
    engine = make_engine(smollm2)
    first = engine.add_request("first", prompt, GREEDY)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        tokens += [t for out in engine.step() for t in out.token_ids]
    assert tokens == expected
    block = engine.kv.pool.cached_block_ids()[first.block_hashes[len(prompt) // 16 - 1]]  # the prompt's last block
    before = [(k[block].clone(), v[block].clone()) for k, v in engine.runner.kv_caches]
    again = engine.add_request("again", prompt, GREEDY)
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for out in engine.step() for t in out.token_ids]
    assert (again.num_cached_tokens, again.num_kv_tokens) == (len(prompt) - 1, len(prompt))
    assert tokens == expected
    after = [(k[block], v[block]) for k, v in engine.runner.kv_caches]
    assert all(torch.equal(k0, k1) and torch.equal(v0, v1) for (k0, v0), (k1, v1) in zip(before, after, strict=True))


def test_chunked_prefill_equals_whole_prefill(smollm2: Loaded, alone: list[list[int]]) -> None:
    engine = make_engine(smollm2, max_num_batched_tokens=7, enable_prefix_caching=False)  # chunks cross block edges
    ps = prompts(smollm2)
    assert engine.generate([ps[0], ps[12]], GREEDY) == [alone[0], alone[12]]


def test_preempted_and_recomputed_equals_uninterrupted(smollm2: Loaded, alone: list[list[int]]) -> None:
    ps = prompts(smollm2)[:6]
    longest = max(len(p) for p in ps) + GREEDY.max_tokens
    engine = make_engine(smollm2, num_kv_blocks=12, max_model_len=longest, enable_prefix_caching=False)
    assert engine.generate(ps, GREEDY) == alone[:6]
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv.pool.num_free_blocks() == 12
