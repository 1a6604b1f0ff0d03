"""Where a prompt's time to first token goes on the host, cold and cached, function by function, without a profiler.

``bench.engine_gpu_smollm``'s TTFT section splits a cached request into ``add_request``, the step
that plans and launches and the step that waits; ``ttft_profile`` there names the kernels but
inflates every host span. This wraps the engine's own functions (validation, prefix lookup, slot
allocation, the graph runs and their replay, sampling) in ``perf_counter`` pairs and prints the
median of each over the cold and the cached runs of every prompt length, beside the TTFT itself (the bench's
``ttft``, timed before the wrappers go in) and the batch-1 decode rate.

    python -m bench.ttft_host --lengths 4096,4097,4100,4112 --json $OUT/ttft_host.json
    python -m bench.ttft_host --device cpu --lengths 48,49   # a small CPU run of the same code
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.engine_gpu_smollm import batch1_ms_per_token, engine_config, ttft
from selfhost import graphs, kv_cache, runner, sampling, scheduler, step_graphs
from selfhost.engine import LLMEngine
from selfhost.sampling import SamplingParams

# (owner, attribute, label): the label's indent shows what calls what
WRAPPED: list[tuple[Any, str, str]] = [
    (LLMEngine, "add_request", "add_request"),
    (LLMEngine, "_validate", "  validate"),
    (scheduler.Scheduler, "schedule", "schedule"),
    (kv_cache.KVCacheManager, "find_prefix", "  find_prefix"),
    (kv_cache.KVCacheManager, "allocate_slots", "  allocate_slots"),
    (kv_cache.BlockPool, "allocate", "    pool.allocate"),
    (kv_cache.KVCacheManager, "_cache_full_blocks", "    cache_full_blocks"),
    (LLMEngine, "_launch", "launch"),
    (runner.ModelRunner, "execute", "  execute"),
    (runner.ModelRunner, "_flatten", "    flatten"),
    (graphs.DecodeGraphs, "run", "    decode_graphs.run"),
    (step_graphs.StepGraphs, "run", "    step_graphs.run"),
    (graphs.TableRows, "put", "      TableRows.put"),
    (torch.cuda.CUDAGraph, "replay", "      replay"),
    (sampling.PendingSample, "__init__", "  PendingSample"),
    (runner.ModelRunner, "record_sampled", "  record_sampled"),
    (LLMEngine, "_finish", "finish"),
    (sampling.PendingSample, "resolve", "  resolve"),
]


def wrap_all(times: dict[str, list[float]], recording: list[bool]) -> None:
    """Time every call of the ``WRAPPED`` functions into ``times`` (us) while ``recording[0]`` holds."""
    for owner, name, label in WRAPPED:
        inner = getattr(owner, name)

        def timed(*args: Any, _inner: Any = inner, _label: str = label, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = _inner(*args, **kwargs)
            if recording[0]:
                times[_label].append((time.perf_counter() - t0) * 1e6)
            return out

        setattr(owner, name, timed)


def breakdown(
    engine: LLMEngine, prompt_len: int, rounds: int, times: dict[str, list[float]], recording: list[bool], phase: str
) -> dict[str, Any]:
    """Median us of each wrapped function over ``rounds`` runs of fresh prompts, ``cold`` or ``cached`` (after one warm-up round)."""
    times.clear()
    engine.kv.pool.reset_prefix_cache()  # the other phase ran the same prompts
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    totals: list[float] = []
    for r in range(rounds + 1):
        prompt = [100 + (r * 7919 + i * 31 + prompt_len) % 40000 for i in range(prompt_len)]
        for cached in (False, True):
            if engine.config.device.startswith("cuda"):
                torch.cuda.synchronize()
            recording[0] = cached == (phase == "cached") and r > 0
            t0 = time.perf_counter()
            engine.add_request(f"{prompt_len}-{r}-{cached}", prompt, params)
            while engine.has_unfinished_requests():
                engine.step()
            if engine.config.device.startswith("cuda"):
                torch.cuda.synchronize()
            if recording[0]:
                totals.append((time.perf_counter() - t0) * 1e6)
            recording[0] = False
    return {
        "total_us": statistics.median(totals),
        **{label: statistics.median(v) for label, v in times.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--lengths", default="4096,4097,4100,4112", help="prompt lengths (their cached tails: 4096 -> 1 token)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="bench/results/ttft_host.json")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    # the TTFT section's engine; on the CPU the smoke one, whose 512-token context takes short prompts
    cfg = engine_config(args.device, smoke=not cuda)
    engine = LLMEngine.from_model(args.model, cfg)
    lengths = [int(x) for x in args.lengths.split(",")]
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }
    for n in lengths:
        engine.kv.pool.reset_prefix_cache()
        r = ttft(engine, n, 3)
        results[f"ttft_{n}"] = r
        print(f"ttft {n}: cold {r['cold_ms']:.3f} ms, cached {r['cached_ms']:.3f} ms ({r['speedup']:.2f}x)", flush=True)
    results["batch1_ms_per_token"] = [batch1_ms_per_token(engine, 256) for _ in range(2)]
    print("batch-1 ms a token", results["batch1_ms_per_token"], flush=True)
    times: dict[str, list[float]] = defaultdict(list)
    recording = [False]
    wrap_all(times, recording)
    for phase in ("cached", "cold"):
        for n in lengths:
            row = breakdown(engine, n, args.rounds, times, recording, phase)
            results[f"host_us_{phase}_{n}"] = row
            print(f"{n} {phase}: {row['total_us']:.1f} us")
            for _, _, label in WRAPPED:
                if label in row:
                    print(f"  {label:28s} {row[label]:9.1f} us")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
