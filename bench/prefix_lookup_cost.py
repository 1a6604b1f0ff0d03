"""Host time of a prefix-cache lookup that hits: ``KVCacheManager.find_prefix`` on a prompt already cached.

A cached prompt's TTFT on the GPU is a short step plus the engine thread's work in front of it,
and for a long prompt the lookup is much of that work: each full block is hashed (chained
SHA-256) and looked up. This times ``find_prefix`` for prompts of 1k, 4k and 8k tokens whose every
block is cached, beside the lookup it replaced (one ``update_block_hashes`` call a block), the two
alternated in one process. ``find_prefix`` gets the request as the engine builds it, its prompt
packed to int32 once at validation (``pack_token_ids``), and again without (``find_prefix_unpacked``:
it packs the ids itself); beside them, the prompt's range check as ``min()``/``max()`` over the ids
and as the packing plus numpy's min/max that replaced it. No model and no GPU: the code is the
engine's own.

    python -m bench.prefix_lookup_cost --json bench/results/prefix_lookup_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import TYPE_CHECKING

import numpy as np

from selfhost.block_hash import pack_token_ids
from selfhost.kv_cache import KVCacheManager
from selfhost.request import Request
from selfhost.sampling import SamplingParams

BLOCK = 16
VOCAB = 49152

if TYPE_CHECKING:
    from collections.abc import Callable


def one_call_a_block(kv: KVCacheManager, request: Request) -> int:
    """The lookup before 2026-11-26: hash one more block a call, up to the first miss; blocks hit."""
    hits = 0
    for i in range(request.num_tokens // BLOCK):
        if kv.pool.lookup(request.update_block_hashes(BLOCK, i + 1)[i]) is None:
            break
        hits += 1
    return hits


def time_lookups(tokens: int, repeats: int) -> dict[str, float]:
    """Median ms of each lookup and range check over ``repeats`` alternated rounds, for a fully cached prompt."""
    params = SamplingParams(max_tokens=1)
    kv = KVCacheManager(2 * tokens // BLOCK, BLOCK, True)
    prompt = [100 + (i * 7919) % 40000 for i in range(tokens)]
    kv.allocate_slots(Request("first", prompt, params), tokens)  # its full blocks are cached as they are allocated
    packed = pack_token_ids(prompt)
    lookups: dict[str, Callable[[Request], int]] = {
        "find_prefix": lambda twin: len(kv.find_prefix(twin).blocks),
        "find_prefix_unpacked": lambda twin: len(kv.find_prefix(twin).blocks),
        "one_call_a_block": lambda twin: one_call_a_block(kv, twin),
    }
    checks: dict[str, Callable[[], bool]] = {
        "check_min_max": lambda: min(prompt) < 0 or max(prompt) >= VOCAB,
        "check_packed": lambda: bool(np.frombuffer(pack_token_ids(prompt), dtype="<i4").max() >= VOCAB),
    }
    times: dict[str, list[float]] = {name: [] for name in [*lookups, *checks]}
    for r in range(repeats):
        for name, lookup in lookups.items():
            twin = Request(f"{name}-{r}", prompt, params, packed_prompt=packed if name == "find_prefix" else b"")
            t0 = time.perf_counter()
            hits = lookup(twin)
            times[name].append((time.perf_counter() - t0) * 1e3)
            assert hits == tokens // BLOCK, (name, hits)
        for name, check in checks.items():
            t0 = time.perf_counter()
            failed = check()
            times[name].append((time.perf_counter() - t0) * 1e3)
            assert not failed, name
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    results: dict[str, object] = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    for tokens in (1024, 4096, 8192):
        row = time_lookups(tokens, args.repeats)
        results[f"{tokens}_tokens_ms"] = row
        print(f"{tokens} tokens (ms): " + ", ".join(f"{name} {ms:.3f}" for name, ms in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
