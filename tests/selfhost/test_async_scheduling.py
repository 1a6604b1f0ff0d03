"""Async scheduling (step n+1 planned and launched before step n's tokens reach the host) changes nothing a client sees.

On the CPU nothing overlaps, but every piece of the mechanism runs: pending tokens, the next step's
ids read from the last sampled ids on the device, tokens dropped for requests that finished while
their step ran, outputs one ``step`` call late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from selfhost.sampling import SamplingParams
from tests.selfhost.conftest import CHAT_PROMPTS, chat_ids, make_engine

if TYPE_CHECKING:
    from selfhost.engine import LLMEngine
    from selfhost.output import RequestOutput
    from tests.selfhost.conftest import Loaded

pytestmark = pytest.mark.slow

SYSTEM = "You are a terse assistant. Answer in as few words as possible."


def workload(smollm2: Loaded) -> list[tuple[str, list[int], SamplingParams]]:
    """Greedy chats that end on EOS, a shared system prompt (prefix hits), a stop string, a stop token,
    short max_tokens, logprobs, and seeded and unseeded random neighbours."""
    out: list[tuple[str, list[int], SamplingParams]] = []
    for i, text in enumerate(CHAT_PROMPTS[:10]):
        ids = chat_ids(smollm2, text, system=SYSTEM if i % 2 else None)
        out.append((f"g{i}", ids, SamplingParams(max_tokens=12 + i, temperature=0.0)))
    ids = chat_ids(smollm2, CHAT_PROMPTS[7])
    out.append(("stop-str", ids, SamplingParams(max_tokens=30, temperature=0.0, stop=("blue",))))
    out.append(("stop-tok", ids, SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(282,))))
    out.append(("short", ids, SamplingParams(max_tokens=1, temperature=0.0)))
    out.append(("lp", ids, SamplingParams(max_tokens=6, temperature=0.0, logprobs=3)))
    out.append(("seeded", ids, SamplingParams(max_tokens=8, temperature=0.8, seed=11)))
    return out


def run(engine: LLMEngine, work: list[tuple[str, list[int], SamplingParams]]) -> dict[str, list[RequestOutput]]:
    for request_id, ids, params in work:
        engine.add_request(request_id, ids, params)
    got: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    return got


def summary(outs: list[RequestOutput]) -> tuple[Any, ...]:
    """What a client sees, logprobs as ``(token, top ids)`` (their values: ``logprob_values``)."""
    last = outs[-1]
    logprobs = [(lp.token_id, [t for t, _ in lp.top]) for o in outs for lp in o.logprobs]
    tokens = [t for o in outs for t in o.token_ids]
    text = "".join(o.text for o in outs)
    return (tokens, text, last.finished, last.finish_reason, last.stop_reason, logprobs)


def logprob_values(outs: list[RequestOutput]) -> list[float]:
    return [lp.logprob for o in outs for lp in o.logprobs]


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_num_batched_tokens": 64},  # prefill chunks mixed into decodes
        {"num_kv_blocks": 14, "max_model_len": 200},  # preemption by recompute
    ],
    ids=["chunked", "preempting"],
)
def test_async_outputs_equal_sync_outputs(smollm2: Loaded, overrides: dict[str, Any]) -> None:
    work = workload(smollm2)
    sync = make_engine(smollm2, async_scheduling=False, **overrides)
    asyn = make_engine(smollm2, async_scheduling=True, **overrides)
    want, got = run(sync, work), run(asyn, work)
    assert set(got) == {w[0] for w in work}
    for request_id in want:
        assert summary(got[request_id]) == summary(want[request_id]), request_id
        # NOTE: a row the async run computes in another batch than the sync run (preemption by
        # recompute) sums in another order in fp32, so its logprobs may differ in the last bits: a
        # clean CI run (2026-11-27) saw -1.3269 against -1.327 once, rounded to 4 decimals
        want_lp = logprob_values(want[request_id])
        assert logprob_values(got[request_id]) == pytest.approx(want_lp, abs=1e-4), request_id
    assert want["stop-str"][-1].finish_reason == "stop"  # the workload exercises what it claims
    assert any(o[-1].finish_reason == "stop" and o[-1].stop_reason is None for o in want.values())  # EOS
    if "num_kv_blocks" in overrides:
        assert asyn.scheduler.num_preemptions > 0
    pool = asyn.kv.pool
    assert pool.num_free_blocks() == pool.num_blocks
    assert not asyn.scheduler.requests


def test_async_step_returns_the_previous_steps_outputs(smollm2: Loaded) -> None:
    engine = make_engine(smollm2, async_scheduling=True)
    request = engine.add_request("a", chat_ids(smollm2, CHAT_PROMPTS[0]), SamplingParams(max_tokens=3, temperature=0.0))
    assert engine.step() == []  # the prefill is launched; its token is not back yet
    assert request.num_pending_tokens == 1
    first = engine.step()  # launches the second token's step, returns the first token
    assert [o.request_id for o in first] == ["a"] and request.num_output_tokens == 1
    assert request.num_pending_tokens == 1
    outs = first
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [len(o.token_ids) for o in outs] == [1, 1, 1] and outs[-1].finish_reason == "length"
    assert request.num_pending_tokens == 0


def test_async_abort_while_a_step_runs_drops_its_token(smollm2: Loaded) -> None:
    engine = make_engine(smollm2, async_scheduling=True)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine.add_request("keep", chat_ids(smollm2, CHAT_PROMPTS[1]), params)
    engine.add_request("drop", chat_ids(smollm2, CHAT_PROMPTS[2]), params)
    for _ in range(4):
        engine.step()
    engine.abort(["drop"])  # its step is in flight
    outs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert {o.request_id for o in outs} == {"keep"}
    assert engine.kv.pool.num_free_blocks() == engine.kv.pool.num_blocks
    alone = make_engine(smollm2, async_scheduling=False).generate([chat_ids(smollm2, CHAT_PROMPTS[1])], params)[0]
    kept = [t for o in outs for t in o.token_ids]
    assert kept == alone[-len(kept) :] and len(kept) == 20 - 3  # the three before the abort came out earlier
