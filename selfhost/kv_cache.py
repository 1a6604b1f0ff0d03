"""The paged KV cache's bookkeeping: fixed-size ref-counted blocks, block tables and the prefix cache.

Owns which block ids exist, who holds them (reference counts), each request's block table, the
index from chained block hash to cached block, and the free queue that doubles as the LRU of
cached blocks. Does not own the cache tensors themselves (``runner``) nor the decision of what to
run or preempt (``scheduler``); ``allocate_slots`` returns None and leaves the choice to its caller.

Free-queue order (the eviction order, front first):

1. At start every block is free, in id order ``[0, 1, ..., N-1]``.
2. Allocation pops from the front. A popped block that still carries a hash is evicted from the
   prefix cache at that moment.
3. When a request frees its blocks, they are walked from its last block to its first: a block
   whose count drops to zero and that carries a hash goes to the *back* (kept longest); one with no
   hash (a partial block, or a duplicate of an already cached block) goes to the *front*, since
   nothing is lost by reusing it first. So among a request's cached blocks the tail is evicted
   before the head, and a shared prefix lives longest.
4. A prefix hit on a free cached block takes it out of the queue (its count goes to one).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.block_hash import BlockHash
    from selfhost.request import Request


@dataclass(slots=True)
class KVBlock:
    """One block of ``block_size`` token slots in every layer's cache."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """All blocks, the free queue and the hash index. Single-threaded: the engine thread owns it."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        """Size of the pool."""
        return len(self.blocks)

    def num_free_blocks(self) -> int:
        """Blocks with no holder (cached or not): what allocation can use."""
        return len(self._free)

    def free_block_ids(self) -> list[int]:
        """The free queue, front (evicted next) first."""
        return list(self._free)

    def cached_block_ids(self) -> dict[BlockHash, int]:
        """The prefix-cache index: hash -> block id (a copy)."""
        return {h: b.block_id for h, b in self._cached.items()}

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        """The cached block with this hash, if any; does not change counts or order."""
        return self._cached.get(block_hash)

    def lookup_run(self, hashes: Sequence[BlockHash]) -> list[KVBlock]:
        """The cached blocks of the leading ``hashes``, up to the first one not cached; changes nothing."""
        get = self._cached.get
        out = []
        for block_hash in hashes:
            block = get(block_hash)
            if block is None:
                break
            out.append(block)
        return out

    def allocate(self, n: int) -> list[KVBlock]:
        """Pop ``n`` blocks from the front of the free queue, evicting their hashes; each gets count 1.

        Raises:
            RuntimeError: fewer than ``n`` blocks are free (callers check ``num_free_blocks`` first).
        """
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Sequence[KVBlock]) -> None:
        """Take another reference on each block (a prefix hit), removing free ones from the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference on each of a request's blocks (given in table order); see the module doc for order."""
        for block in reversed(blocks):
            if block.ref_cnt <= 0:
                raise RuntimeError(f"KV block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)

    def cache(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Index a full block under its hash; a hash already indexed keeps its first block."""
        if block_hash not in self._cached and block.block_hash is None:
            block.block_hash = block_hash
            self._cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every hash (blocks in use keep their contents)."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()


@dataclass(slots=True)
class _Hashing:
    """How far a request's blocks are indexed in the prefix cache, and when its next one is due."""

    num_hashed: int
    """Leading blocks of the request's table that are indexed (or were found by their hashes)."""
    lag: int
    """Tokens past a decode-filled block's end before it is hashed, in ``[1, block_size)``."""


class PrefixHit(NamedTuple):
    """Cached blocks that cover a request's leading tokens."""

    blocks: list[KVBlock]
    num_tokens: int
    """Tokens the hit spares from running: the blocks' tokens, less one when they hold the whole
    prompt (its last token must run to give the logits of the next)."""


NO_HIT = PrefixHit([], 0)


class KVCacheManager:
    """Block tables per request on top of a ``BlockPool``, with prefix-cache lookups and hit statistics."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._tables: dict[str, list[KVBlock]] = {}
        self._ids: dict[str, list[int]] = {}
        """``_tables`` again as block ids: the runner reads every running request's table every step."""
        self._hashing: dict[str, _Hashing] = {}
        self._num_tables = 0
        """Block tables made so far: spreads requests' hash lags (``_cache_full_blocks``)."""
        self.prefix_query_tokens = 0
        """Prompt tokens looked up in the prefix cache (counted once per request admission)."""
        self.prefix_hit_tokens = 0
        """Of those, tokens found."""

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table as ids (empty when it holds none); read-only, and valid until it next changes."""
        return self._ids.get(request_id, [])

    def usage(self) -> float:
        """Fraction of blocks held by some request."""
        return 1.0 - self.pool.num_free_blocks() / self.pool.num_blocks

    def find_prefix(self, request: Request) -> PrefixHit:
        """Longest run of the request's leading full blocks found in the prefix cache.

        Does not take references; pass the blocks to ``allocate_slots``.
        """
        if not self.enable_prefix_caching:
            return NO_HIT
        # NOTE(crossway): every full block may hit, the last one too: the last token runs again
        # for its logits, reading its KV from the shared block (the runner does not write it
        # again), where vLLM recomputes the whole last block. Blocks are hashed in doubling
        # batches (1, 2, 4, ...) up to the first miss: a cold 8k prompt costs one hash here, not
        # 500 on the engine thread, and a hit of n blocks at most 2n + 1 hashes in ~log2(n) calls:
        # a 4k hit 0.18 ms on the H100's host, against 0.49 ms with one call a block
        # (bench/prefix_lookup_cost.py). Blocks hashed past the miss are the ones the prompt's
        # chunks would hash anyway when they fill.
        max_blocks = request.num_tokens // self.block_size
        blocks: list[KVBlock] = []
        batch_end = 1
        while len(blocks) < max_blocks:
            batch_end = min(max_blocks, batch_end)
            hashes = request.update_block_hashes(self.block_size, batch_end)
            blocks += self.pool.lookup_run(hashes[len(blocks) : batch_end])
            if len(blocks) < batch_end:
                break
            batch_end *= 2
        hit = PrefixHit(blocks, min(len(blocks) * self.block_size, request.num_tokens - 1))
        self.prefix_query_tokens += request.num_tokens
        self.prefix_hit_tokens += hit.num_tokens
        return hit

    def allocate_slots(self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> list[KVBlock] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request`` after its computed ones (and prefix hit).

        Returns:
            The newly allocated blocks, or None (and no change at all) when the pool cannot supply them.
        """
        table = self._tables.get(request.request_id)
        total = request.num_computed_tokens + hit.num_tokens + num_new_tokens
        if table is not None and not hit.blocks and total <= len(table) * self.block_size:
            # NOTE(crossway): most decode steps: the last block has room. Checked here rather than by
            # a call that returns at once: this runs for every running request every step
            # (bench/prefix_cache_cost.py)
            if self.enable_prefix_caching:
                progress = self._hashing[request.request_id]
                lagged = total - progress.lag
                if lagged // self.block_size > progress.num_hashed:  # a block full and its lag passed
                    self._cache_full_blocks(request, table, lagged)
            return []
        table = table if table is not None else []
        prefix_blocks = hit.blocks
        need = -(-total // self.block_size) - len(table) - len(prefix_blocks)
        # a hit on a free cached block takes it out of the free queue too
        reclaimed = sum(1 for b in prefix_blocks if b.ref_cnt == 0) if prefix_blocks else 0
        if need > self.pool.num_free_blocks() - reclaimed:
            return None
        new = self.pool.allocate(max(need, 0))
        table = self._tables.setdefault(request.request_id, table)
        ids = self._ids.setdefault(request.request_id, [])
        if prefix_blocks:
            self.pool.touch(prefix_blocks)
            table.extend(prefix_blocks)
            ids.extend([b.block_id for b in prefix_blocks])
        table.extend(new)
        ids.extend([b.block_id for b in new])
        if self.enable_prefix_caching:
            hashing = self._hashing.get(request.request_id)
            if hashing is None:
                self._num_tables += 1
                lag = 1 + self._num_tables % max(1, self.block_size - 1)
                hashing = self._hashing[request.request_id] = _Hashing(0, lag)
            if prefix_blocks:  # found by their hashes: indexed already
                hashing.num_hashed = len(prefix_blocks)
            # a chunk's blocks at once; a decode's block its lag later
            self._cache_full_blocks(request, table, total if num_new_tokens > 1 else total - hashing.lag)
        return new

    def _cache_full_blocks(self, request: Request, table: list[KVBlock], num_tokens: int) -> None:
        """Index the blocks that ``num_tokens`` fill and whose token ids are known.

        NOTE(crossway): a prompt's blocks are indexed when scheduled, before their KV is written. A
        request hitting them in the same step is safe: every layer writes all new K/V before
        attending. A block filled by decoding is indexed ``lag`` tokens later, a lag that differs
        between requests: requests that started together fill their blocks in the same step, and
        with 128 of them that step took 4-8x a step's median on the CPU VM, about half of it
        hashing (``bench.host_step --cohort``; docs/benchmarks.md, 2026-12-07). ``free`` indexes
        what the lag left.
        """
        hashing = self._hashing[request.request_id]
        start = hashing.num_hashed
        if num_tokens // self.block_size > start:
            hashes = request.update_block_hashes(self.block_size, num_tokens // self.block_size)
            end = min(num_tokens // self.block_size, len(hashes))
            for i in range(start, end):
                self.pool.cache(table[i], hashes[i])
            hashing.num_hashed = max(start, end)

    def free(self, request: Request) -> None:
        """Release all of the request's blocks (idempotent), indexing first its full blocks not yet indexed."""
        table = self._tables.pop(request.request_id, [])
        self._ids.pop(request.request_id, None)
        if table and self.enable_prefix_caching:
            self._cache_full_blocks(request, table, request.num_computed_tokens)
        self._hashing.pop(request.request_id, None)
        self.pool.free(table)
