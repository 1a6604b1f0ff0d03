"""GPU probe: the device kernels of a chunked-prefill step, at a long prompt's first, middle and last chunk.

The chunked bench's slowest steps are those that run a 7,680-token prompt's last chunks beside 128
decodes, and the step-phase probe (``bench.probe_step_phases``) found them waiting on the device
(``resolve`` 0.4 ms at the first chunk, 1.5 at the last). This probe sets up that load
(``bench.engine_gpu_smollm``'s chunked section: ``RUNNING_PROMPT``-token requests decoding, one long
prompt arriving, the engine's default budget and chunk cap) and profiles single engine steps with
``torch.profiler``, a device sync after each: a step that only decodes, then the steps whose chunk
starts at the prompt's first token, its middle and its last chunk. Per step it prints the step's
device span and the kernels' critical-path shares by kind (prefill attention and its merge, decode
attention, matmuls, norms, the rest), and the largest kernels.

    python -m bench.probe_mixed_kernels --model smollm2-random --json $OUT/mixed_kernels.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench.engine_gpu import critical_path
from bench.engine_gpu_smollm import (
    CHUNKED_LOAD,
    RANDOM_SHAPES,
    RUNNING_PROMPT,
    chunked_config,
    chunked_pool_blocks,
    engine_config,
    model_config,
    prefills_done,
    random_engine,
)
from selfhost.engine import LLMEngine
from selfhost.sampling import SamplingParams

KINDS = (
    ("prefill", ("_prefill_kernel", "_prefill_merge")),
    ("decode attention", ("_decode_split", "_decode_reduce")),
    ("matmul", ("gemm", "gemv", "_int4_kernel", "_int8_kernel", "cutlass", "sm90_xmma", "nvjet")),
    ("norm", ("rms_norm",)),
    ("rope + kv write", ("rope",)),
)


def kind_of(name: str) -> str:
    """The kind a kernel name belongs to (``KINDS``), else ``other``."""
    return next((k for k, keys in KINDS if any(key in name for key in keys)), "other")


def profiled_step(engine: LLMEngine) -> dict[str, Any]:
    """One engine step under the profiler, with a device sync: its span, critical-path shares by kind and of the largest kernels.

    Shares (``bench.engine_gpu.critical_path``), not durations: under programmatic dependent launch
    a kernel's span includes its wait for the one before, so durations overlap.
    """
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    events = [(e.name[:60], float(e.time_range.start), float(e.time_range.end)) for e in kernels]
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for share in critical_path(events):
        by_kind[kind_of(share.kernel)] = by_kind.get(kind_of(share.kernel), 0.0) + share.share_us
        agg = by_name.setdefault(share.kernel, [0.0, 0.0, 0.0])
        agg[0] += 1
        agg[1] += share.share_us
        agg[2] += share.dur_us
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:8]
    return {
        "span_us": events[-1][2] - events[0][1] if events else 0.0,
        "by_kind_share_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "top": [{"kernel": k, "launches": int(n), "share_us": us, "dur_us": dur} for k, (n, us, dur) in top],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-random", help=f"one of {', '.join(RANDOM_SHAPES)}, or a model name")
    ap.add_argument("--json", default="bench/results/probe_mixed_kernels.json")
    a = ap.parse_args()
    running, long_len = CHUNKED_LOAD[0], CHUNKED_LOAD[1]
    cfg = chunked_config(engine_config("cuda", False))
    # one prompt arriving once; the bench's three rounds of pool (16 steady steps each) leave room to spare
    blocks = chunked_pool_blocks(
        cfg.max_num_batched_tokens,
        cfg.mixed_prefill_tokens,
        running,
        long_len,
        arrivals=1,
        every=1,
        steps=16,
        block_size=cfg.block_size,
    )
    cfg = replace(cfg, num_kv_blocks=blocks)
    if a.model in RANDOM_SHAPES:
        engine = random_engine(model_config(RANDOM_SHAPES[a.model]), cfg, a.model)
    else:
        engine = LLMEngine.from_model(a.model, cfg)
    params = SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True)
    for i in range(running):
        engine.add_request(f"run{i}", [200 + (i * 13 + j) % 30000 for j in range(RUNNING_PROMPT)], params)
    while not prefills_done(engine):
        engine.step()
    for _ in range(8):
        engine.step()
    steps: dict[str, dict[str, Any]] = {"decode only": profiled_step(engine)}
    vocab = engine.model_config.vocab_size
    prompt = [300 + (j * 7) % (vocab - 300) for j in range(long_len)]
    engine.add_request("long", prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    cap = cfg.mixed_prefill_tokens
    wanted = {0: "first chunk", (long_len // 2) // cap * cap: "middle chunk", long_len - cap: "last chunk"}
    while "long" in engine.scheduler.requests:
        request = engine.scheduler.requests["long"]
        # the chunk the next step runs starts at this request's computed tokens (once admitted)
        at = request.num_computed_tokens if request in engine.scheduler.running else 0
        name = wanted.get(at)
        if name is not None and name not in steps:
            steps[name] = profiled_step(engine)
        else:
            engine.step()
    for name, r in steps.items():
        kinds = ", ".join(f"{k} {us:.0f}" for k, us in r["by_kind_share_us"].items())
        print(f"{name}: span {r['span_us']:.0f} us ({kinds})", flush=True)
        for t in r["top"]:
            print(
                f"    {t['kernel'][:50]:50s} x{t['launches']:<3d} share {t['share_us']:7.1f} us, spans {t['dur_us']:7.1f}"
            )
    out = {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": a.model,
        "running": running,
        "long_prompt_tokens": long_len,
        "steps": steps,
    }
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
