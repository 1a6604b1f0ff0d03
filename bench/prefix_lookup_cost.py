"""Host time of a prefix-cache lookup that hits: ``KVCacheManager.find_prefix`` on a prompt already cached.

A cached prompt's TTFT on the GPU is a short step plus the engine thread's work in front of it,
and for a long prompt the lookup is much of that work: each full block is hashed (chained
SHA-256) and looked up. This times ``find_prefix`` for prompts of 1k, 4k and 8k tokens whose every
block is cached, beside the lookup it replaced (one ``update_block_hashes`` call a block), the two
alternated in one process. No model and no GPU: the code is the engine's own.

    python -m bench.prefix_lookup_cost --json bench/results/prefix_lookup_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from selfhost.kv_cache import KVCacheManager
from selfhost.request import Request
from selfhost.sampling import SamplingParams

BLOCK = 16


def one_call_a_block(kv: KVCacheManager, request: Request) -> int:
    """The lookup before 2026-11-26: hash one more block a call, up to the first miss; blocks hit."""
    hits = 0
    for i in range((request.num_tokens - 1) // BLOCK):
        if kv.pool.lookup(request.update_block_hashes(BLOCK, i + 1)[i]) is None:
            break
        hits += 1
    return hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    params = SamplingParams(max_tokens=1)
    results: dict[str, object] = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    for tokens in (1024, 4096, 8192):
        kv = KVCacheManager(2 * tokens // BLOCK, BLOCK, True)
        prompt = [100 + (i * 7919) % 40000 for i in range(tokens)]
        first = Request("first", prompt, params)
        kv.allocate_slots(first, tokens)  # its full blocks are cached as they are allocated
        times: dict[str, list[float]] = {"find_prefix": [], "one_call_a_block": []}
        for r in range(args.repeats):
            for name in times:
                twin = Request(f"{name}-{r}", prompt, params)
                t0 = time.perf_counter()
                hits = len(kv.find_prefix(twin).blocks) if name == "find_prefix" else one_call_a_block(kv, twin)
                times[name].append((time.perf_counter() - t0) * 1e3)
                assert hits == (tokens - 1) // BLOCK, (name, hits)
        row = {name: statistics.median(v) for name, v in times.items()}
        results[f"{tokens}_tokens_ms"] = row
        print(
            f"{tokens} tokens: find_prefix {row['find_prefix']:.3f} ms, one call a block {row['one_call_a_block']:.3f} ms"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
