from __future__ import annotations

import pytest

from selfhost.kv_cache import BlockPool, KVCacheManager
from tests.selfhost.builders import make_request


def admit(kv: KVCacheManager, request, num_new: int | None = None):
    """Look up the prefix, allocate the rest, and mark the hit as computed (as the scheduler does)."""
    hit = kv.find_prefix(request)
    n = request.num_tokens - hit.num_tokens if num_new is None else num_new
    new = kv.allocate_slots(request, n, hit)
    if new is not None:
        request.num_computed_tokens = hit.num_tokens
    return hit, new


def refs(kv: KVCacheManager) -> list[int]:
    return [b.ref_cnt for b in kv.pool.blocks]


def test_pool_starts_with_all_blocks_free_in_id_order() -> None:
    pool = BlockPool(6)
    assert pool.free_block_ids() == [0, 1, 2, 3, 4, 5]


def test_pool_allocate_raises_when_short() -> None:
    pool = BlockPool(2)
    with pytest.raises(RuntimeError, match="asked for 3 KV blocks, 2 free"):
        pool.allocate(3)


def test_allocate_slots_takes_blocks_from_the_front_and_caches_full_ones() -> None:
    kv = KVCacheManager(10, 4)
    req = make_request("a", 10)
    _, new = admit(kv, req)
    assert [b.block_id for b in new] == [0, 1, 2]
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9]
    assert refs(kv) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    cached = kv.pool.cached_block_ids()
    assert cached == {req.block_hashes[0]: 0, req.block_hashes[1]: 1}  # the partial block 2 has no hash


def test_allocate_slots_returns_none_when_pool_full_and_changes_nothing() -> None:
    kv = KVCacheManager(4, 4)
    admit(kv, make_request("a", 12))
    before = (kv.pool.free_block_ids(), refs(kv), kv.pool.cached_block_ids())
    _, new = admit(kv, make_request("b", [1] * 8))
    assert new is None
    assert kv.block_ids("b") == []
    assert (kv.pool.free_block_ids(), refs(kv), kv.pool.cached_block_ids()) == before


def test_free_puts_hashed_blocks_at_back_tail_first_and_partial_block_at_front() -> None:
    kv = KVCacheManager(10, 4)
    req = make_request("a", 10)
    admit(kv, req)
    kv.free(req)
    assert kv.pool.free_block_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert refs(kv) == [0] * 10
    kv.free(req)  # idempotent
    assert kv.pool.free_block_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]


def test_prefix_hit_reuses_free_cached_blocks_and_takes_them_off_the_queue() -> None:
    kv = KVCacheManager(10, 4)
    a = make_request("a", 10)
    admit(kv, a)
    kv.free(a)
    b = make_request("b", [*range(100, 108), 1, 2, 3])  # shares the first two blocks with a
    hit, new = admit(kv, b)
    assert [blk.block_id for blk in hit.blocks] == [0, 1]
    assert hit.num_tokens == 8
    assert [blk.block_id for blk in new] == [2]
    assert kv.block_ids("b") == [0, 1, 2]
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9]
    assert b.num_computed_tokens == 8
    assert (kv.prefix_query_tokens, kv.prefix_hit_tokens) == (10 + 11, 8)


def test_shared_blocks_are_reference_counted() -> None:
    kv = KVCacheManager(10, 4)
    a, b = make_request("a", 9), make_request("b", 9)
    admit(kv, a)
    admit(kv, b)
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.block_ids("b") == [0, 1, 3]
    assert refs(kv)[:4] == [2, 2, 1, 1]
    kv.free(a)
    assert refs(kv)[:4] == [1, 1, 0, 1]
    assert kv.pool.free_block_ids() == [2, 4, 5, 6, 7, 8, 9]
    kv.free(b)
    assert kv.pool.free_block_ids() == [3, 2, 4, 5, 6, 7, 8, 9, 1, 0]


def test_full_hit_takes_every_block_and_leaves_only_the_last_token_to_run() -> None:
    kv = KVCacheManager(10, 4)
    a = make_request("a", 8)
    admit(kv, a)
    kv.free(a)
    b = make_request("b", 8)
    hit, new = admit(kv, b)
    assert [blk.block_id for blk in hit.blocks] == [0, 1]
    assert hit.num_tokens == 7  # the last token runs again for its logits
    assert new == []  # its slot is in block 1, which it shares
    assert kv.block_ids("b") == [0, 1]
    assert refs(kv)[:3] == [1, 1, 0]
    assert (kv.prefix_query_tokens, kv.prefix_hit_tokens) == (16, 7)
    b.num_computed_tokens = 8
    b.append_output_token(5)
    assert [blk.block_id for blk in kv.allocate_slots(b, 1)] == [2]  # the first output token's block


def test_lru_evicts_front_of_queue_and_drops_its_hash() -> None:
    kv = KVCacheManager(6, 2)
    a, b = make_request("a", [1, 2, 3, 4]), make_request("b", [5, 6, 7, 8])
    admit(kv, a)
    admit(kv, b)
    kv.free(a)
    kv.free(b)
    assert kv.pool.free_block_ids() == [4, 5, 1, 0, 3, 2]
    c = make_request("c", [9, 9, 9, 9, 9, 9])
    _, new = admit(kv, c)
    assert [blk.block_id for blk in new] == [4, 5, 1]  # 1 (a's tail) evicted before 0 (a's head)
    assert a.block_hashes[1] not in kv.pool.cached_block_ids()
    assert kv.pool.cached_block_ids()[a.block_hashes[0]] == 0
    d = make_request("d", [1, 2, 3, 4, 0])
    hit, _ = admit(kv, d)
    assert [blk.block_id for blk in hit.blocks] == [0]


def test_hit_on_free_cached_block_counts_against_free_space() -> None:
    kv = KVCacheManager(3, 2)
    a = make_request("a", [1, 2, 3, 4])
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_block_ids() == [2, 1, 0]
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8])
    hit, new = admit(kv, b)  # hits blocks 0 and 1 (both free); needs 2 more, only block 2 remains
    assert [blk.block_id for blk in hit.blocks] == [0, 1]
    assert new is None
    assert kv.pool.free_block_ids() == [2, 1, 0]


def test_tenant_salt_isolates_identical_prompts() -> None:
    kv = KVCacheManager(10, 4)
    a = make_request("a", 9, salt="tenant-a")
    b = make_request("b", 9, salt="tenant-b")
    c = make_request("c", 9, salt="tenant-a")
    admit(kv, a)
    hit_b, _ = admit(kv, b)
    hit_c, _ = admit(kv, c)
    assert hit_b.blocks == []
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.block_ids("b") == [3, 4, 5]
    assert set(kv.block_ids("a")).isdisjoint(kv.block_ids("b"))
    assert [blk.block_id for blk in hit_c.blocks] == [0, 1]


def test_prefix_caching_off_never_hits() -> None:
    kv = KVCacheManager(10, 4, enable_prefix_caching=False)
    a = make_request("a", 9)
    admit(kv, a)
    hit, _ = admit(kv, make_request("b", 9))
    assert hit.blocks == []
    assert kv.pool.cached_block_ids() == {}


def test_cold_prompt_is_hashed_up_to_its_first_miss_then_as_its_chunks_are_scheduled() -> None:
    kv = KVCacheManager(20, 4)
    req = make_request("a", 33)  # 8 full blocks
    hit, _ = admit(kv, req, num_new=10)  # a first chunk: blocks 0 and 1 fill
    assert hit.num_tokens == 0
    assert len(req.block_hashes) == 2  # one for the lookup's miss, one more for the filled block
    req.num_computed_tokens = 10
    kv.allocate_slots(req, 13)  # up to token 23: five full blocks
    assert len(req.block_hashes) == 5
    assert sorted(kv.pool.cached_block_ids().values()) == [0, 1, 2, 3, 4]
    twin = make_request("b", 33)
    hit = kv.find_prefix(twin)
    assert hit.num_tokens == 20  # the five cached blocks; the lookup stopped at the sixth
    assert len(twin.block_hashes) == 8  # hashed in batches of 1, 2, 4 and 8 blocks


def start_decoding(kv: KVCacheManager, request) -> None:
    """Admit ``request``'s whole prompt and bring back its first token (a synchronous step)."""
    admit(kv, request)
    request.num_computed_tokens = request.num_tokens
    request.append_output_token(7)


def decode_step(kv: KVCacheManager, request) -> None:
    """Schedule one decode of ``request``, run it and bring back its token."""
    assert kv.allocate_slots(request, 1) is not None
    request.num_computed_tokens += 1
    request.append_output_token(7)


def test_a_block_filled_by_decoding_is_indexed_its_requests_lag_later_and_lags_differ() -> None:
    kv = KVCacheManager(20, 4)  # lags cycle through 1 + n % 3 for the n-th table: 2, 3, 1, ...
    a, b = make_request("a", 6), make_request("b", list(range(300, 306)))
    start_decoding(kv, a)
    start_decoding(kv, b)
    assert kv.block_ids("a") == [0, 1] and kv.block_ids("b") == [2, 3]
    assert sorted(kv.pool.cached_block_ids().values()) == [0, 2]  # the prompts' full blocks, at once
    indexed_at = {0: 6, 2: 6}  # block id -> its request's computed tokens when it was first indexed
    for _ in range(6):
        for request in (a, b):
            decode_step(kv, request)
            cached = set(kv.pool.cached_block_ids().values())
            for block_id in cached.intersection(kv.block_ids(request.request_id)):
                indexed_at.setdefault(block_id, request.num_computed_tokens)
    # blocks 1 and 3 fill at 8 computed tokens; a's is indexed 2 tokens later, b's 3
    assert indexed_at == {0: 6, 1: 10, 2: 6, 3: 11}
    assert kv.block_ids("a") == [0, 1, 4] and kv.block_ids("b") == [2, 3, 5]


def test_free_indexes_the_full_blocks_a_decoding_lag_left_unindexed() -> None:
    kv = KVCacheManager(20, 4)
    a = make_request("a", 6)
    start_decoding(kv, a)
    decode_step(kv, a)
    decode_step(kv, a)  # 8 computed tokens: block 1 is full, its lag (2) not yet passed
    assert sorted(kv.pool.cached_block_ids().values()) == [0]
    kv.free(a)
    assert sorted(kv.pool.cached_block_ids().values()) == [0, 1]
    hit = kv.find_prefix(make_request("next-turn", [*a.all_token_ids[:8], 1, 2, 3]))
    assert [blk.block_id for blk in hit.blocks] == [0, 1]
