"""CPU benchmark: Crossway engine (fp32, int8, int4 weights) vs HF transformers eager on SmolLM2-135M, same process.

Measures decode tok/s at batch 1, aggregate tok/s at 16 concurrent requests, TTFT of a ~1,000-token
prompt cold vs with its system prompt in the prefix cache, and the quality of each quantization
(teacher-forced perplexity on a fixed text and top-1 agreement with fp32). Every figure is the
median of ``--repeats`` runs; the whole run stays within a few minutes on 2 cores.

    python -m bench.engine_cpu --repeats 3 --json bench/results/engine_cpu.json
    python -m bench.engine_cpu --modes int4 --interleave 7   # batch-1 decode only, HF and ours alternating
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from selfhost.config import EngineConfig, Quantization
from selfhost.engine import LLMEngine
from selfhost.fetch import resolve_model
from selfhost.models.ops import build_attention_metadata
from selfhost.sampling import SamplingParams

if TYPE_CHECKING:
    from collections.abc import Callable

QUALITY_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a practical system. Within a few decades "
    "printing shops had spread to more than two hundred European cities, books became cheaper, and ideas "
    "travelled faster than ever before. Scholars could compare identical copies of a text, which helped "
    "standardise spelling and made scientific results easier to check. The same technology later carried "
    "newspapers, pamphlets and textbooks to a growing reading public, and literacy rose across the continent."
)


def decode_rate(engine: LLMEngine, prompts: list[list[int]], n: int) -> float:
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"d{time.monotonic_ns()}-{i}", p, params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.requests.values()):
        engine.step()  # prefill (+ first token) outside the timed window
    start, produced = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        produced += len(engine.step())
    return produced / (time.perf_counter() - start)


def ttft(engine: LLMEngine, prompt: list[int]) -> float:
    start = time.perf_counter()
    engine.add_request(f"t{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=1, temperature=0))
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def teacher_forced_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """``(n, V)`` logits at every position of ``ids`` (the engine must be idle; overwrites its first KV blocks)."""
    bs = engine.config.block_size
    meta = build_attention_metadata(
        [0, len(ids)], [len(ids)], [list(range(-(-len(ids) // bs)))], bs, engine.runner.device
    )
    with torch.inference_mode():
        model = engine.runner.model
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), engine.runner.kv_caches, meta))


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return float(torch.exp(nll))


def bench_engine(mode: Quantization, args: argparse.Namespace) -> tuple[dict[str, float], torch.Tensor, list[int]]:
    cfg = EngineConfig(
        dtype="float32", quantization=mode, max_num_batched_tokens=1024, num_kv_blocks=512, num_threads=args.threads
    )
    engine = LLMEngine.from_model("smollm2", cfg)
    tok = engine.tokenizer
    assert tok is not None
    prompts = [
        tok.encode_chat([{"role": "user", "content": f"Tell me story number {i} about a dragon."}]) for i in range(16)
    ]
    decode_rate(engine, prompts[:1], 8)  # warm up
    runs: dict[str, list[float]] = {"bs1": [], "bs16": [], "cold": [], "hit": []}
    for r in range(args.repeats):
        runs["bs1"].append(decode_rate(engine, prompts[:1], args.tokens))
        runs["bs16"].append(decode_rate(engine, prompts, args.tokens))
        system = f"Session {r}. " + "You are a careful assistant. " * 170  # ~1,000 tokens, new per repeat: cold
        cold = tok.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
        hit = tok.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": "Hello again"}])
        runs["cold"].append(ttft(engine, cold))
        runs["hit"].append(ttft(engine, hit))
    result = {k: statistics.median(v) for k, v in runs.items()}
    result["prompt_tokens_long"] = len(cold)
    result["weight_mb"] = engine.runner.model.weight_bytes() / 1e6
    ids = tok.encode(QUALITY_TEXT)
    logits = teacher_forced_logits(engine, ids)
    print(f"  {mode}: " + "  ".join(f"{k} {[round(x, 3) for x in v]}" for k, v in runs.items()), flush=True)
    return result, logits, ids


def load_hf() -> torch.nn.Module:
    """HF transformers' SmolLM2 from the same GGUF file, fp32, eager."""
    from transformers import AutoModelForCausalLM

    gguf = resolve_model("smollm2")
    hf: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    return hf.eval()


def hf_decode_rate(hf: torch.nn.Module, prompt: list[int], n: int) -> float:
    """HF's batch-1 greedy decode tok/s after the first token: ``model(next_token, past_key_values=...)`` by hand."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(n):
            out = hf(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return n / (time.perf_counter() - start)


def bench_hf(args: argparse.Namespace, prompt: list[int]) -> float:
    hf = load_hf()
    hf_decode_rate(hf, prompt, 4)  # warm up
    rates = [hf_decode_rate(hf, prompt, args.tokens) for _ in range(args.repeats)]
    print(f"  HF eager bs1: {[round(x, 1) for x in rates]}", flush=True)
    return statistics.median(rates)


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    """``fn()``'s tok/s and the process CPU seconds it took."""
    cpu = time.process_time()
    rate = fn()
    return rate, time.process_time() - cpu


def interleave(args: argparse.Namespace, modes: list[Quantization]) -> None:
    """Batch-1 decode of HF eager and each engine mode in turn, ``args.interleave`` rounds in one process.

    Load moves on a shared machine; alternating the contenders round by round exposes each to the
    same load, so the per-round ratio is the figure to read. CPU time per token is reported too
    (it moves less with load than wall time does).
    """
    engines: dict[str, LLMEngine] = {}
    for mode in modes:
        cfg = EngineConfig(dtype="float32", quantization=mode, num_kv_blocks=64, num_threads=args.threads)
        engines[mode] = LLMEngine.from_model("smollm2", cfg)
    hf = load_hf()
    tok = next(iter(engines.values())).tokenizer
    assert tok is not None
    prompt = tok.encode_chat([{"role": "user", "content": "Tell me story number 0 about a dragon."}])
    runners: dict[str, Callable[[], float]] = {"hf": lambda: hf_decode_rate(hf, prompt, args.tokens)}
    for name, engine in engines.items():
        runners[name] = lambda engine=engine: decode_rate(engine, [prompt], args.tokens)  # type: ignore[misc]
    for run in runners.values():
        run()  # warm up
    rates: dict[str, list[float]] = {name: [] for name in runners}
    cpu_ms: dict[str, list[float]] = {name: [] for name in runners}
    print(f"threads {torch.get_num_threads()}; {args.tokens} decode tokens per run; load average {_loadavg()}")
    for r in range(args.interleave):
        for name, run in runners.items():
            rate, cpu = timed(run)
            rates[name].append(rate)
            cpu_ms[name].append(cpu / args.tokens * 1e3)
        print(f"  round {r + 1}: " + "  ".join(f"{n} {rates[n][-1]:.1f} tok/s" for n in runners), flush=True)
    print(f"load average at the end {_loadavg()}")
    print(f"{'engine':8} {'tok/s median':>12} {'x HF (median of rounds)':>24} {'CPU ms/token':>13} {'x HF CPU':>9}")
    hf_cpu = statistics.median(cpu_ms["hf"])
    for name in runners:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["hf"], strict=True))
        cpu = statistics.median(cpu_ms[name])
        print(f"{name:8} {statistics.median(rates[name]):12.1f} {ratio:24.2f} {cpu:13.2f} {hf_cpu / cpu:9.2f}")
    if args.json:
        args.json.write_text(
            json.dumps({"threads": args.threads, "rates": rates, "cpu_ms_per_token": cpu_ms}, indent=2)
        )


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; medians are reported")
    ap.add_argument("--modes", default="none,int8,int4", help="comma-separated quantizations to run")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the engine's and HF's)")
    ap.add_argument(
        "--interleave", type=int, default=0, help="only batch-1 decode: HF and each mode in turn, this many rounds"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    modes: list[Quantization] = [m for m in ("none", "int8", "int4") if m in args.modes.split(",")]
    if args.interleave:
        interleave(args, modes)
        return
    results: dict[str, dict[str, float]] = {}
    ref_logits = None
    for mode in modes:
        result, logits, ids = bench_engine(mode, args)
        ref_logits = logits if mode == "none" else ref_logits
        result["perplexity"] = perplexity(logits, ids)
        if ref_logits is not None:
            result["top1_agree_fp32"] = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
        results[mode] = result
        gc.collect()
    from selfhost.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model("smollm2"))
    hf1 = bench_hf(args, tok.encode_chat([{"role": "user", "content": "Tell me story number 0 about a dragon."}]))
    print(
        f"threads {torch.get_num_threads()}; {args.tokens} decode tokens; medians of {args.repeats}; HF eager bs1 {hf1:.1f} tok/s"
    )
    print(
        f"{'weights':8} {'MB':>6} {'bs1 tok/s':>10} {'xHF':>5} {'bs16 tok/s':>11} {'xHF1':>5} "
        f"{'TTFT cold ms':>13} {'hit ms':>7} {'ratio':>6} {'ppl':>6} {'top1=fp32':>9}"
    )
    for name, r in results.items():
        print(
            f"{name:8} {r['weight_mb']:6.0f} {r['bs1']:10.1f} {r['bs1'] / hf1:5.2f} {r['bs16']:11.1f} {r['bs16'] / hf1:5.2f} "
            f"{r['cold'] * 1e3:13.0f} {r['hit'] * 1e3:7.0f} {r['cold'] / r['hit']:6.1f} {r['perplexity']:6.2f} "
            f"{r.get('top1_agree_fp32', float('nan')):9.3f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"hf_eager_bs1": hf1, "tokens": args.tokens, "repeats": args.repeats, **results}, indent=2)
        )


if __name__ == "__main__":
    main()
