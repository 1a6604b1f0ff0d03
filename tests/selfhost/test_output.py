"""Outputs of requests that are not streamed: one output at the end, equal to what the streamed ones add up to."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from selfhost.output import OutputProcessor, RequestOutput
from selfhost.request import Request, RequestStatus
from selfhost.sampling import SamplingParams, TokenLogprobs
from tests.selfhost.conftest import CHAT_PROMPTS, chat_ids, make_engine

if TYPE_CHECKING:
    from tests.selfhost.conftest import Loaded

pytestmark = pytest.mark.slow


def _run(processor: OutputProcessor, request: Request, tokens: list[int], end: RequestStatus) -> list[RequestOutput]:
    """Feed ``tokens`` one step each, the last one with the request ended as ``end``."""
    outputs = []
    for i, token in enumerate(tokens):
        request.append_output_token(token)
        if i == len(tokens) - 1:
            request.status = end
        lp = TokenLogprobs(token, -0.5, [])
        outputs += [o for o in processor.process_step([request], [token], [lp]) if o is not None]
    return outputs


def test_a_final_only_output_equals_the_streamed_outputs_joined(smollm2: Loaded) -> None:
    """Random prompts and outputs, with characters split over byte tokens at either end and EOS endings."""
    tok = smollm2.tokenizer
    rng = random.Random(5)  # noqa: S311 - not security
    pieces = [tok.encode(t, add_special_tokens=False) for t in [" 東京", " 🙂 and 🚀", "é", " hello", "\n\n"]]
    eos = tok.eos_token_ids[0]
    for case in range(120):
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 12))]
        if case % 3 == 0:
            prompt += pieces[0][:1]  # the prompt's tail ends inside a character
        out: list[int] = []
        while len(out) < rng.randint(1, 24):
            out += rng.choice(pieces) if rng.random() < 0.5 else [rng.randrange(tok.vocab_size)]
        if case % 4 == 1:
            out = out + pieces[1][:2]  # the output ends inside a character: a stream holds it back for good
        end = RequestStatus.FINISHED_LENGTH
        if case % 5 == 2:
            out, end = [*out, eos], RequestStatus.FINISHED_STOPPED
        got = {}
        for stream in (True, False):
            processor = OutputProcessor(tok)
            request = Request(f"r{case}", prompt, SamplingParams(max_tokens=len(out)))
            request.status = RequestStatus.RUNNING
            processor.add(request, stream=stream)
            got[stream] = _run(processor, request, out, end)
        (final,) = got[False]
        streamed = got[True]
        assert final.token_ids == [t for o in streamed for t in o.token_ids] == out
        assert final.text == "".join(o.text for o in streamed), (prompt, out)
        assert final.logprobs == [lp for o in streamed for lp in o.logprobs]
        assert (final.finish_reason, final.num_output_tokens) == (streamed[-1].finish_reason, len(out))


def test_a_prompt_ending_inside_a_character_leaves_its_text_out_and_the_output_completes_it(smollm2: Loaded) -> None:
    tok = smollm2.tokenizer
    split = tok.encode(" 東京", add_special_tokens=False)  # byte-level pieces: " 東" ends on the third
    prompt = tok.encode(" hello world", add_special_tokens=False) + split[:1]
    for stream in (True, False):
        processor = OutputProcessor(tok)
        request = Request("r", prompt, SamplingParams(max_tokens=len(split) - 1))
        request.status = RequestStatus.RUNNING
        processor.add(request, stream=stream)
        outputs = _run(processor, request, split[1:], RequestStatus.FINISHED_LENGTH)
        assert "".join(o.text for o in outputs) == " 東京"


def test_a_request_with_stop_strings_is_streamed_even_when_not_asked(smollm2: Loaded) -> None:
    processor = OutputProcessor(smollm2.tokenizer)
    request = Request("r", [1, 2], SamplingParams(max_tokens=3, stop=("zz",)))
    request.status = RequestStatus.RUNNING
    processor.add(request, stream=False)
    ids = smollm2.tokenizer.encode(" a b c", add_special_tokens=False)
    outputs = _run(processor, request, ids, RequestStatus.FINISHED_LENGTH)
    assert len(outputs) == len(ids)


def test_engine_requests_not_streamed_get_one_output_with_the_streamed_result(smollm2: Loaded) -> None:
    engine = make_engine(smollm2)
    prompts = [chat_ids(smollm2, p) for p in CHAT_PROMPTS[:6]]
    params = [
        SamplingParams(max_tokens=20, temperature=0),
        SamplingParams(max_tokens=9, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=40, temperature=0),  # ends on EOS
    ]
    outputs: dict[str, list[RequestOutput]] = {}
    for stream in (True, False):
        for i, prompt in enumerate(prompts):
            engine.add_request(f"{stream}-{i}", prompt, params[i % 3], stream=stream)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    for i in range(len(prompts)):
        (final,) = outputs[f"False-{i}"]
        streamed = outputs[f"True-{i}"]
        assert final.finished and streamed[-1].finished
        assert final.token_ids == [t for o in streamed for t in o.token_ids]
        assert final.text == "".join(o.text for o in streamed) != ""
        # the two ran in different batches: the same picks, logprobs equal up to the batch's rounding
        assert [lp.token_id for lp in final.logprobs] == [lp.token_id for o in streamed for lp in o.logprobs]
        assert [lp.logprob for lp in final.logprobs] == pytest.approx(
            [lp.logprob for o in streamed for lp in o.logprobs], abs=1e-4
        )
        assert final.finish_reason == streamed[-1].finish_reason
    assert engine.metrics_snapshot().ttft.count == 2 * len(prompts)  # first tokens counted without outputs
