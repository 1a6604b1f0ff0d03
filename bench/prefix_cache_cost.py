"""What prefix caching costs when nothing hits: the host work it adds to the GPU bench's offline workload.

With no hits, caching changes no kernel: the same tokens run through the same graphs. What it adds
is bookkeeping on the engine thread: each full block is hashed and indexed, each admission looks
its first block up, freed blocks are queued by whether they carry a hash, and allocation evicts
old hashes. This runs exactly that code (``Scheduler`` over ``KVCacheManager``, no model) over the
workload of ``bench.engine_gpu_smollm``'s offline section (256 requests, prompt and output
lengths uniform in [100, 1024], SmolLM2's vocabulary and the GPU run's KV pool), with caching on
and off in alternating rounds, and prints the difference per run.

Set against the offline run's duration on the GPU, the difference bounds the cost from above: on
the GPU the engine thread overlaps the device (async scheduling), so host work costs throughput
only where the host is the critical path.

    python -m bench.prefix_cache_cost --rounds 5 --gpu-seconds 4.39,4.63,5.31,5.10
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from dataclasses import replace

from bench.engine_gpu_smollm import offline_workload
from selfhost.config import EngineConfig
from selfhost.kv_cache import KVCacheManager
from selfhost.request import Request
from selfhost.sampling import SamplingParams
from selfhost.scheduler import Scheduler

VOCAB = 49152
"""SmolLM2's vocabulary."""
GPU_NUM_BLOCKS = 29127
"""The SmolLM2 bf16 engine's pool in the GPU bench: 10 GiB / 368,640 bytes a 16-token block (30 layers, 3 KV heads, head dim 64)."""


def run(cfg: EngineConfig, num_blocks: int, requests: list[tuple[list[int], int]], seed: int) -> dict[str, float]:
    """Drive the scheduler to completion (sampled tokens drawn at random); return seconds, steps and blocks cached."""
    kv = KVCacheManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
    sched = Scheduler(cfg, kv, cfg.max_model_len or 8192, eos_token_ids=())
    rng = random.Random(seed)
    for i, (prompt, out_len) in enumerate(requests):
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        sched.add_request(Request(f"o{i}", prompt, params))
    gc.collect()
    steps = 0
    start = time.perf_counter()
    while sched.has_unfinished():
        batch = sched.schedule()
        sampling = batch.sampling_requests
        sched.update(sampling, [rng.randrange(100, VOCAB - 100) for _ in sampling])
        steps += 1
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "steps": steps,
        "preemptions": sched.num_preemptions,
        "cached_blocks_indexed": len(kv.pool.cached_block_ids()),
        "prefix_hit_tokens": kv.prefix_hit_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternated on/off pairs")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--num-blocks", type=int, default=GPU_NUM_BLOCKS)
    ap.add_argument("--gpu-seconds", default="", help="comma list: offline run durations measured on the GPU")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    base = EngineConfig(
        device="cpu", max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, mixed_prefill_tokens=0
    )
    reqs = offline_workload(VOCAB, a.requests, 100, 1024, seed=2)
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    for enabled in (True, False):  # warm-up: the first runs pay for imports and allocator growth
        run(replace(base, enable_prefix_caching=enabled), a.num_blocks, reqs, seed=99)
    for r in range(a.rounds):
        # alternate which goes first, so that warming up is not read as the cost of caching
        order = ((True, on), (False, off)) if r % 2 == 0 else ((False, off), (True, on))
        for enabled, bucket in order:
            bucket.append(run(replace(base, enable_prefix_caching=enabled), a.num_blocks, reqs, seed=r))
    diffs = [x["seconds"] - y["seconds"] for x, y in zip(on, off, strict=True)]
    res: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "on": on,
        "off": off,
        "diff_s": diffs,
        "median_diff_s": statistics.median(diffs),
    }
    print(f"{'round':>5} {'on s':>8} {'off s':>8} {'on - off ms':>12} {'steps':>6} {'blocks indexed':>15}")
    for r, (x, y, d) in enumerate(zip(on, off, diffs, strict=True)):
        print(
            f"{r:>5} {x['seconds']:>8.3f} {y['seconds']:>8.3f} {d * 1e3:>12.1f} {x['steps']:>6} {x['cached_blocks_indexed']:>15}"
        )
    print(f"median on - off: {statistics.median(diffs) * 1e3:.1f} ms per offline run")
    if a.gpu_seconds:
        gpu = [float(s) for s in a.gpu_seconds.split(",")]
        share = statistics.median(diffs) / min(gpu)
        res["gpu_seconds"], res["bound_share_of_shortest_gpu_run"] = gpu, share
        print(f"against the shortest GPU offline run ({min(gpu):.2f} s): at most {share:.2%} of its throughput")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
