"""The engine's 8B-shaped int4 batch-1 decode with its LM head reading the final norm's pairs, and reading x.

One model (random weights, int4 groups of 128), two engines over it: one captured as the engine
runs (``LlamaForCausalLM.forward_logits`` hands the LM head the pairs), one captured with the LM
head's ``x_pairs`` refusing, so its GEMV reads x. Greedy ids of both on two prompts, then batch-1
ms a token (``engine_gpu_smollm.batch1_ms_per_token``), the two alternated round by round. GPU only.

    python -m bench.probe_engine_head_pairs --rounds 6 --json $OUT/engine_lm_head_pairs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.engine_gpu_smollm import batch1_ms_per_token, model_config, random_model
from bench.gpu_decoder import LLAMA3_8B
from selfhost.config import EngineConfig
from selfhost.engine import LLMEngine
from selfhost.sampling import SamplingParams

GROUP = 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--json", default="bench/results/engine_lm_head_pairs.json")
    a = ap.parse_args()
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        quantization="int4",
        quant_group_size=GROUP,
        max_num_seqs=8,
        max_model_len=4096,
        kv_cache_memory_bytes=1 << 30,
        cuda_graph_batch_sizes=(1, 2, 4, 8),
    )
    mc = model_config(LLAMA3_8B)
    model = random_model(mc, "bfloat16", "cuda", 4096)
    model.quantize("int4", GROUP, kernels=True)
    if model.lm_head.x_pairs(1, torch.bfloat16) is None:
        raise SystemExit("the LM head's GEMV reads x here (no half2 loop): nothing to compare")
    engines = {"pairs": LLMEngine(model, mc, None, cfg, model_name="pairs")}
    model.lm_head.x_pairs = lambda m, dtype: None  # type: ignore[method-assign]  # captured with x
    engines["x"] = LLMEngine(model, mc, None, cfg, model_name="x")
    del model.lm_head.x_pairs
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name()}
    greedy = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    prompts = [list(range(3000, 3040)), list(range(5000, 5017))]
    ids = {name: e.generate(prompts, greedy) for name, e in engines.items()}
    out["first_difference"] = [
        next((i for i, (p, q) in enumerate(zip(a_ids, b_ids, strict=True)) if p != q), None)
        for a_ids, b_ids in zip(ids["pairs"], ids["x"], strict=True)
    ]
    rounds: list[dict[str, float]] = []
    for r in range(a.rounds):
        order = ("pairs", "x") if r % 2 == 0 else ("x", "pairs")
        rounds.append({name: batch1_ms_per_token(engines[name], a.tokens) for name in order})
        print(r, {k: round(v, 4) for k, v in rounds[-1].items()}, flush=True)
    out["rounds_ms_per_token"] = rounds
    for name in engines:
        out[f"median_ms_{name}"] = statistics.median(r[name] for r in rounds)
    out["speedup"] = out["median_ms_x"] / out["median_ms_pairs"]
    print(json.dumps({k: v for k, v in out.items() if k != "rounds_ms_per_token"}))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
