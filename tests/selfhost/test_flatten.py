"""``ModelRunner._flatten``: one-token rows as lists, several-token runs in numpy, in order, equal to the per-token rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from selfhost.sampling import SamplingParams
from tests.selfhost.conftest import make_engine

if TYPE_CHECKING:
    from selfhost.kv_cache import KVCacheManager
    from selfhost.scheduler import ScheduledBatch
    from tests.selfhost.conftest import Loaded


def _per_token(batch: ScheduledBatch, kv: KVCacheManager, order: Any, bs: int) -> tuple[list[int], ...]:
    """Ids (0 where not yet known), positions, slots (-1 below the prefix hit's KV) and pending rows, token by token."""
    ids, positions, slots, pending = [], [], [], []
    for i in order:
        request, start, num_new = batch.requests[i], batch.starts[i], batch.num_new_tokens[i]
        table = kv.block_ids(request.request_id)
        for p in range(start, start + num_new):
            if p >= request.num_tokens:
                pending.append(len(ids))
            ids.append(request.all_token_ids[p] if p < request.num_tokens else 0)
            positions.append(p)
            slots.append(-1 if p < request.num_kv_tokens else table[p // bs] * bs + p % bs)
    return ids, positions, slots, pending


def test_flatten_puts_prefill_chunks_between_decode_rows_as_the_per_token_rule(smollm2: Loaded) -> None:
    engine = make_engine(smollm2, max_num_batched_tokens=64, long_prefill_token_threshold=24, async_scheduling=True)
    runner = engine.runner
    flatten = runner._flatten
    shapes: list[tuple[int, ...]] = []

    def checked(batch: ScheduledBatch, kv_: KVCacheManager, order: Any) -> Any:
        flat = flatten(batch, kv_, order)
        ids, positions, slots, pending = _per_token(batch, kv_, order, runner.block_size)
        assert list(flat.ids) == ids and list(flat.positions) == positions and list(flat.slots) == slots
        assert flat.pending_rows == pending
        runs = any(batch.num_new_tokens[i] > 1 for i in order)
        assert isinstance(flat.ids, np.ndarray) == runs  # lists for a step of one-token rows only
        shapes.append(tuple(batch.num_new_tokens[i] for i in order))
        return flat

    runner._flatten = checked  # type: ignore[method-assign]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    prompts = [list(range(100, 180)), list(range(200, 205)), list(range(300, 360))]
    first = engine.generate(prompts, greedy)
    again = engine.generate([prompts[0][:64]], greedy)  # four full blocks, all cached: the last token runs alone
    assert len(first) == 3 and len(again[0]) == 6
    assert (24, 1, 24) in shapes  # a decode row between two prefill chunks
    assert (1,) in shapes


def test_a_run_reads_its_ids_from_the_packed_prompt_and_writes_no_kv_below_the_hits():
    from selfhost.block_hash import pack_token_ids
    from selfhost.request import Request
    from selfhost.runner import _run_arrays

    prompt = list(range(1000, 1040))
    request = Request("r", prompt, SamplingParams(max_tokens=4), packed_prompt=pack_token_ids(prompt))
    request.append_output_token(7)  # 41 tokens known; position 41 is pending
    request.num_kv_tokens = 20
    table = [5, 9, 11]
    ids, positions, slots = _run_arrays(request, table, 16, 42, 16)
    assert ids.tolist() == [*range(1016, 1040), 7, 0]
    assert positions.tolist() == list(range(16, 42))
    assert slots.tolist() == [-1] * 4 + [9 * 16 + p % 16 for p in range(20, 32)] + [
        11 * 16 + p % 16 for p in range(32, 42)
    ]
    assert ids.dtype == positions.dtype == slots.dtype == np.int64
