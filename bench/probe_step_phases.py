"""The chunked-prefill bench's steps taken apart on the host: where a slow step's time went.

Runs ``bench.engine_gpu_smollm.chunked_itl`` (128 requests decoding while two 7,680-token prompts
arrive, the engine's default ``mixed_prefill_tokens``) with each engine step's host phases timed:
``schedule``, ``execute`` (the launch of the step's graph, or its eager kernels), ``resolve`` (the
wait for the step before's picks), ``update``, ``outputs``, any garbage-collector pass (and its
generation; a pass inside a phase counts in both, so ``rest`` is then short by it), what is left of
the step outside those (``rest``: the sampler's launch, the metrics), and which graphs the step
replayed (``S`` step graphs, ``D`` decode graphs, empty: eager). Parts of those phases are timed
too (``PARTS``): inside ``execute`` the flattening of a step the decode graphs do not take, each
graph set's ``run`` (staging and replay) and the replay call alone; in ``rest`` the sampler's
launch. Prints the slowest steps and each path's median of every timing; writes every step to
JSON. A step whose ``resolve`` is near zero found its device work done: the host set its pace.
The wrappers add host time to every step, so the ratios it prints are not the bench's. GPU, or
``--device cpu`` to check the code.

    python -m bench.probe_step_phases --json $OUT/step_phases.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.engine_gpu_smollm import CHUNKED_LOAD, chunked_config, chunked_itl, chunked_pool_blocks, engine_config
from selfhost import sampling
from selfhost.engine import LLMEngine

PHASES = ("schedule", "execute", "resolve", "update", "outputs", "gc")
PARTS = ("flatten", "step_graphs", "decode_graphs", "replay", "sample_launch")
"""Timed inside a phase (the first four in ``execute``) or in ``rest`` (the sampler's launch)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--load",
        default=f"{CHUNKED_LOAD[0]},{CHUNKED_LOAD[1]}",
        help="RUNNING,PROMPT as the chunked bench's --chunked-load",
    )
    ap.add_argument("--json", default="bench/results/step_phases.json")
    a = ap.parse_args()
    running, long_len = (int(v) for v in a.load.split(","))
    arrivals, every, steps_a_round = CHUNKED_LOAD[2:]
    cfg = chunked_config(engine_config(a.device, False))  # and below, a pool for its load
    blocks = chunked_pool_blocks(
        cfg.max_num_batched_tokens,
        cfg.mixed_prefill_tokens,
        running,
        long_len,
        arrivals,
        every,
        steps_a_round,
        cfg.block_size,
    )
    assert cfg.max_model_len is not None  # narrowing: engine_config sets it
    blocks = max(blocks, -(-cfg.max_model_len // cfg.block_size))
    engine = LLMEngine.from_model(a.model, replace(cfg, num_kv_blocks=blocks))
    cur: dict[str, Any] = {}

    def timed(obj: object, name: str, key: str) -> None:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                cur[key] = cur.get(key, 0.0) + (time.perf_counter() - t) * 1e3

        setattr(obj, name, wrapper)

    timed(engine.scheduler, "schedule", "schedule")
    timed(engine.scheduler, "update", "update")
    timed(engine.outputs, "process_step", "outputs")
    timed(engine.runner, "execute", "execute")
    timed(sampling.PendingSample, "resolve", "resolve")
    runner = engine.runner
    timed(runner, "_flatten", "flatten")
    if runner.step_graphs is not None:
        timed(runner.step_graphs, "run", "step_graphs")
    if runner.graphs is not None:
        timed(runner.graphs, "run", "decode_graphs")
    timed(torch.cuda.CUDAGraph, "replay", "replay")
    timed(sampling.PendingSample, "__init__", "sample_launch")

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            cur["_gc_start"] = time.perf_counter()
        else:
            cur["gc"] = cur.get("gc", 0.0) + (time.perf_counter() - cur["_gc_start"]) * 1e3
            cur["gc_generation"] = info["generation"]

    gc.callbacks.append(on_gc)
    steps: list[dict[str, Any]] = []
    step = engine.step

    def replays() -> tuple[int, int]:
        sg, dg = engine.runner.step_graphs, engine.runner.graphs
        return (sg.num_replays if sg else 0, dg.num_replays if dg else 0)

    def traced_step() -> Any:
        cur.clear()
        before = replays()
        t = time.perf_counter()
        out = step()
        total = (time.perf_counter() - t) * 1e3
        after = replays()
        rec = {k: round(v, 3) if isinstance(v, float) else v for k, v in cur.items() if not k.startswith("_")}
        rec["rest"] = round(total - sum(cur.get(p, 0.0) for p in PHASES), 3)
        rec["step"] = round(total, 3)
        rec["path"] = ("S" if after[0] > before[0] else "") + ("D" if after[1] > before[1] else "")
        steps.append(rec)
        return out

    engine.step = traced_step  # type: ignore[method-assign]
    try:
        result = chunked_itl(engine, running, long_len, arrivals, every, steps_a_round)
    finally:
        gc.callbacks.remove(on_gc)
    keep = ("round_ratios", "steady_step_ms", "mixed_median_ms", "mixed_slowest")
    print({k: v for k, v in result.items() if k in keep})
    for i in sorted(sorted(range(len(steps)), key=lambda i: -steps[i]["step"])[:12]):
        print(i, steps[i])
    for path in ("D", "S", ""):
        on_path = [s for s in steps[1:] if s["path"] == path]  # the first step compiles
        if on_path:
            keys = [k for k in (*PHASES, "rest", *PARTS, "step") if any(k in s for s in on_path)]
            medians = {k: round(statistics.median(s.get(k, 0.0) for s in on_path), 3) for k in keys}
            print(f"path {path or 'eager'!r}, {len(on_path)} steps, medians (ms):", medians)
    print("gc passes:", [(i, s["gc_generation"], s["gc"]) for i, s in enumerate(steps) if "gc" in s])
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"chunked": result, "steps": steps}, default=str))


if __name__ == "__main__":
    main()
