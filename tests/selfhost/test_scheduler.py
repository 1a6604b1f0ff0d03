from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfhost.config import EngineConfig
from selfhost.request import RequestStatus
from tests.selfhost.builders import EOS, make_request, make_scheduler, run_step


def test_schedule_chunks_prefill_under_token_budget() -> None:
    s = make_scheduler(budget=16)
    for rid in "abc":
        s.add_request(make_request(rid, [ord(rid)] * 10, max_tokens=4))
    assert run_step(s) == [("a", 10), ("b", 6)]
    assert [r.request_id for r in s.running] == ["a", "b"]
    assert s.requests["a"].output_token_ids == [7]
    assert s.requests["b"].output_token_ids == []  # a partial prefill samples nothing
    assert run_step(s) == [("a", 1), ("b", 4), ("c", 10)]  # decode mixed with a chunk and a new prefill
    assert s.kv.block_ids("a") == [0, 1, 2]
    assert s.kv.block_ids("b") == [3, 4, 5]
    assert s.kv.block_ids("c") == [6, 7, 8]


def test_chunks_share_mixed_prefill_tokens_in_a_step_that_decodes() -> None:
    s = make_scheduler(budget=32, num_blocks=40, mixed_prefill=6)
    s.add_request(make_request("a", [ord("a")] * 4, max_tokens=20))
    s.add_request(make_request("b", [ord("b")] * 40, max_tokens=2))
    s.add_request(make_request("c", [ord("c")] * 40, max_tokens=2))
    assert run_step(s) == [("a", 4), ("b", 28)]  # nothing decodes yet: the chunks fill the budget
    assert run_step(s) == [("a", 1), ("b", 6)]  # a decodes: b's chunk takes the 6 chunk tokens, c waits
    assert run_step(s) == [("a", 1), ("b", 6)]  # b's last 6 prompt tokens: it samples
    assert run_step(s) == [("a", 1), ("b", 1), ("c", 6)]


def test_chunk_with_no_mixed_tokens_left_waits_while_the_decodes_after_it_run() -> None:
    s = make_scheduler(budget=32, num_blocks=40, mixed_prefill=6)
    s.add_request(make_request("a", [ord("a")] * 20, max_tokens=4))
    s.add_request(make_request("b", [ord("b")] * 20, max_tokens=4))
    s.add_request(make_request("c", [ord("c")] * 4, max_tokens=4))
    assert run_step(s) == [("a", 20), ("b", 12)]
    s.add_request(make_request("d", [ord("d")] * 3, max_tokens=4))
    assert run_step(s) == [("a", 1), ("b", 6)]  # c's and d's admissions wait for chunk tokens
    assert run_step(s) == [("a", 1), ("b", 2), ("c", 4)]  # b's 2 and c's 4 make the 6
    assert run_step(s) == [("a", 1), ("b", 1), ("c", 1), ("d", 3)]


def test_prompt_alone_fills_the_whole_budget_and_zero_turns_the_cap_off() -> None:
    capped = make_scheduler(budget=32, num_blocks=40, mixed_prefill=6)
    uncapped = make_scheduler(budget=32, num_blocks=40, mixed_prefill=0)
    for s in (capped, uncapped):
        s.add_request(make_request("a", [ord("a")] * 3, max_tokens=8))
        s.add_request(make_request("b", [ord("b")] * 60, max_tokens=1))
        assert run_step(s) == [("a", 3), ("b", 29)]
    assert run_step(capped) == [("a", 1), ("b", 6)]
    assert run_step(uncapped) == [("a", 1), ("b", 31)]


def test_negative_mixed_prefill_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="mixed_prefill_tokens must be 0 or positive, got -1"):
        EngineConfig(mixed_prefill_tokens=-1)


def test_schedule_respects_max_num_seqs() -> None:
    s = make_scheduler(budget=64, max_num_seqs=2, num_blocks=20)
    for rid in "abc":
        s.add_request(make_request(rid, [ord(rid)] * 3))
    assert run_step(s) == [("a", 3), ("b", 3)]
    assert [r.request_id for r in s.waiting] == ["c"]


def test_same_step_admissions_share_blocks_indexed_in_that_step() -> None:
    """A block indexed when scheduled is a hit for a later admission of the same step (its KV is written first)."""
    s = make_scheduler(budget=64, num_blocks=20)
    s.add_request(make_request("a", 10))
    s.add_request(make_request("b", 10))
    assert run_step(s) == [("a", 10), ("b", 2)]
    assert s.kv.block_ids("a") == [0, 1, 2]
    assert s.kv.block_ids("b") == [0, 1, 3]


def test_prefix_hit_skips_computed_tokens() -> None:
    s = make_scheduler(budget=64, num_blocks=20)
    s.add_request(make_request("a", 10, max_tokens=1))
    run_step(s)
    assert "a" not in s.requests  # finished by max_tokens, blocks freed
    s.add_request(make_request("b", 10, max_tokens=1))
    assert run_step(s) == [("b", 2)]
    assert s.kv.block_ids("b") == []  # finished again
    assert (s.kv.prefix_query_tokens, s.kv.prefix_hit_tokens) == (20, 8)


def test_full_prefix_hit_admits_with_every_block_shared_and_one_token_to_run() -> None:
    s = make_scheduler(budget=64, num_blocks=20)
    s.add_request(make_request("a", 8, max_tokens=1))
    run_step(s)
    b = make_request("b", 8, max_tokens=2)
    s.add_request(b)
    assert run_step(s) == [("b", 1)]
    assert (b.num_cached_tokens, b.num_kv_tokens) == (7, 8)  # token 7 ran; its KV sits in shared block 1
    assert s.kv.block_ids("b") == [0, 1]
    batch = s.schedule()
    assert (batch.starts, batch.num_new_tokens) == ([8], [1])
    assert s.kv.block_ids("b") == [0, 1, 2]  # its first output token's block


def test_preemption_picks_newest_and_recomputes_later() -> None:
    s = make_scheduler(num_blocks=6, block_size=4, budget=32)
    s.add_request(make_request("a", [1] * 8, max_tokens=20))
    s.add_request(make_request("b", [2] * 8, max_tokens=20))
    assert run_step(s) == [("a", 8), ("b", 8)]  # a: [0, 1], b: [2, 3]
    for _ in range(4):
        run_step(s)  # a and b grow to 12 tokens each: blocks 4 and 5
    assert s.kv.block_ids("a") == [0, 1, 4]
    assert s.kv.block_ids("b") == [2, 3, 5]
    plan = run_step(s)  # a needs a 4th block: none free -> b (newest) is preempted
    assert plan == [("a", 1)]
    b = s.waiting[0]
    assert b.request_id == "b"
    assert b.status is RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0
    assert b.output_token_ids == [7] * 5  # outputs kept: recompute covers prompt + outputs
    assert s.kv.block_ids("a") == [0, 1, 4, 5]
    # b freed tail first to the back: [5, 3, 2]; a then took 5 from the front
    assert s.kv.pool.free_block_ids() == [3, 2]
    assert s.num_preemptions == 1


def test_request_preempts_itself_when_it_is_the_only_one_running() -> None:
    s = make_scheduler(num_blocks=2, block_size=4, budget=32)
    s.max_model_len = 100  # let it outgrow the pool
    s.add_request(make_request("a", 8, max_tokens=20))
    run_step(s)
    assert run_step(s) == []
    assert s.waiting[0].request_id == "a"
    assert s.kv.pool.num_free_blocks() == 2


def test_update_stops_on_eos_unless_ignored_and_on_stop_token_ids() -> None:
    s = make_scheduler(budget=64, num_blocks=20)
    s.add_request(make_request("eos", 3, ignore_eos=False))
    s.add_request(make_request("ignore", 3, ignore_eos=True, max_tokens=2))
    run_step(s, token=EOS)
    assert "eos" not in s.requests
    assert s.requests["ignore"].output_token_ids == [EOS]
    run_step(s, token=EOS)
    assert s.requests == {}


def test_finish_aborts_waiting_and_running_and_frees_blocks() -> None:
    s = make_scheduler(budget=8, num_blocks=10)
    a, b = make_request("a", 8), make_request("b", 8)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    s.finish(a, RequestStatus.FINISHED_ABORTED)
    s.finish(b, RequestStatus.FINISHED_ABORTED)
    assert s.kv.pool.num_free_blocks() == 10
    assert not s.has_unfinished()
    assert a.status.finish_reason == "abort"


@settings(max_examples=60, deadline=None, database=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "abort", "step"]), st.integers(1, 30), st.integers(1, 12)),
        min_size=1,
        max_size=60,
    ),
    budget=st.integers(1, 40),
    num_blocks=st.integers(8, 24),
    mixed_prefill=st.integers(0, 12),
)
def test_random_arrivals_and_aborts_never_leak_or_starve(ops, budget, num_blocks, mixed_prefill) -> None:
    s = make_scheduler(num_blocks=num_blocks, block_size=4, budget=budget, max_num_seqs=4, mixed_prefill=mixed_prefill)
    s.max_model_len = num_blocks * 4
    live: list[str] = []
    for i, (op, size, max_tokens) in enumerate(ops):
        if op == "add":
            prompt = [1 + (i * 7 + j) % 5 for j in range(min(size, s.max_model_len - max_tokens - 1) or 1)]
            s.add_request(make_request(f"r{i}", prompt, max_tokens=max_tokens))
            live.append(f"r{i}")
        elif op == "abort" and live:
            victim = s.requests.get(live[size % len(live)])
            if victim is not None:
                s.finish(victim, RequestStatus.FINISHED_ABORTED)
        else:
            run_step(s)
        held = sum(len(s.kv.block_ids(r.request_id)) for r in s.requests.values())
        ref_total = sum(b.ref_cnt for b in s.kv.pool.blocks)
        assert ref_total >= len({b for r in s.requests.values() for b in s.kv.block_ids(r.request_id)})
        assert held == ref_total  # every reference belongs to a live request's table
        assert s.kv.pool.num_free_blocks() == sum(1 for b in s.kv.pool.blocks if b.ref_cnt == 0)
    # everything left finishes in bounded steps: no starvation
    for _ in range(2000):
        if not s.has_unfinished():
            break
        run_step(s)
    assert not s.has_unfinished()
    assert s.kv.pool.num_free_blocks() == num_blocks
    assert all(b.ref_cnt == 0 for b in s.kv.pool.blocks)
