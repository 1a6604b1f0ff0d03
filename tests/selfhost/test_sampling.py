"""Sampling: seeds, top-k/top-p, logprobs, stop strings, parameter validation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from selfhost.request import Request
from selfhost.sampling import SamplingParams, sample
from tests.selfhost.conftest import chat_ids, make_engine

if TYPE_CHECKING:
    from tests.selfhost.conftest import Loaded


def req(params: SamplingParams, rid: str = "r") -> Request:
    return Request(rid, [1], params)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"top_k": -2}, "top_k must be"),
        ({"logprobs": 21}, "logprobs must be in"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
    ],
)
def test_sampling_params_reject_invalid_values(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sample_greedy_is_argmax_and_logprobs_are_log_softmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, -1.0], [2.0, 0.0, 0.0, 5.0]])
    out = sample(logits, [req(SamplingParams(temperature=0, logprobs=2)), req(SamplingParams(temperature=0))])
    assert out.token_ids == [1, 3]
    expected = torch.log_softmax(logits[0], -1)
    lp = out.logprobs[0]
    assert lp is not None
    assert lp.token_id == 1
    assert lp.logprob == pytest.approx(float(expected[1]))
    assert [t for t, _ in lp.top] == [1, 2]
    assert [v for _, v in lp.top] == pytest.approx([float(expected[1]), float(expected[2])])
    assert out.logprobs[1] is None


def test_top_k_one_equals_greedy() -> None:
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    requests = [req(SamplingParams(temperature=1.3, top_k=1, seed=i), f"r{i}") for i in range(8)]
    assert sample(logits, requests).token_ids == logits.argmax(-1).tolist()


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seen = {sample(logits, [req(SamplingParams(top_p=0.7, seed=i))]).token_ids[0] for i in range(200)}
    assert seen == {0, 1}


def test_top_k_keeps_only_the_k_best() -> None:
    logits = torch.tensor([[1.0, 1.1, 1.2, 1.3, 1.4]])
    seen = {sample(logits, [req(SamplingParams(top_k=2, seed=i))]).token_ids[0] for i in range(200)}
    assert seen == {3, 4}


def test_seeded_sampling_reproduces_per_request() -> None:
    logits = torch.zeros(1, 1000)
    a = [sample(logits, [r]).token_ids[0] for r in [req(SamplingParams(seed=7))] for _ in range(5)]
    r2 = req(SamplingParams(seed=7))
    b = [sample(logits, [r2]).token_ids[0] for _ in range(5)]
    assert a == b
    assert len(set(a)) > 1


@pytest.mark.slow
def test_seeded_request_reproduces_alone_and_in_a_batch(smollm2: Loaded) -> None:
    engine = make_engine(smollm2)
    prompt = chat_ids(smollm2, "Tell me a joke.")
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)
    alone = engine.generate([prompt], params)[0]
    assert engine.generate([prompt], params)[0] == alone
    others = [chat_ids(smollm2, p) for p in ("Name a fruit.", "Count to five.")]
    mixed = engine.generate(
        [others[0], prompt, others[1]],
        [SamplingParams(max_tokens=8, temperature=0.8), params, SamplingParams(max_tokens=12, temperature=0)],
    )
    assert mixed[1] == alone


@pytest.mark.slow
def test_top_k_one_equals_greedy_end_to_end(smollm2: Loaded) -> None:
    engine = make_engine(smollm2)
    prompt = chat_ids(smollm2, "Describe a cat.")
    greedy = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0))[0]
    assert engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0.7, top_k=1))[0] == greedy


def run_text(engine, prompt, params) -> tuple[str, list]:
    engine.add_request("t", prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return "".join(o.text for o in outs), outs


@pytest.mark.slow
def test_stop_string_cuts_output_exactly(smollm2: Loaded) -> None:
    engine = make_engine(smollm2)
    prompt = chat_ids(smollm2, "Write a haiku about the sea.")
    full, _ = run_text(engine, prompt, SamplingParams(max_tokens=24, temperature=0))
    assert len(full) > 20
    stop = full[10:14]
    first = full.index(stop)
    text, outs = run_text(engine, prompt, SamplingParams(max_tokens=24, temperature=0, stop=("zzzz-never", stop)))
    assert text == full[:first]
    assert outs[-1].finished
    assert outs[-1].finish_reason == "stop"
    assert outs[-1].stop_reason == stop
    assert engine.kv.pool.num_free_blocks() == engine.kv.pool.num_blocks


@pytest.mark.slow
def test_stop_token_ids_and_max_tokens_finish_reasons(smollm2: Loaded) -> None:
    engine = make_engine(smollm2)
    prompt = chat_ids(smollm2, "Write a haiku about the sea.")
    tokens = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0))[0]
    _, outs = run_text(engine, prompt, SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(tokens[3],)))
    assert [o.token_ids[0] for o in outs] == tokens[:4]
    assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", tokens[3])
    _, outs = run_text(engine, prompt, SamplingParams(max_tokens=6, temperature=0))
    assert outs[-1].finish_reason == "length"
    assert outs[-1].num_output_tokens == 6


@pytest.mark.slow
def test_logprobs_are_log_softmax_of_model_logits(smollm2: Loaded) -> None:
    from tests.selfhost.test_model_logits import run_paged

    engine = make_engine(smollm2)
    prompt = chat_ids(smollm2, "Say hi.")
    _, outs = run_text(engine, prompt, SamplingParams(max_tokens=3, temperature=0, logprobs=3))
    tokens = [o.token_ids[0] for o in outs]
    logits = run_paged(smollm2.model, prompt, tokens[:-1])
    for out, row in zip(outs, logits, strict=True):
        expected = torch.log_softmax(row, -1)
        lp = out.logprobs[0]
        assert lp.logprob == pytest.approx(float(expected[lp.token_id]), abs=1e-4)
        top = expected.topk(3)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)
