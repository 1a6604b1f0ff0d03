"""GPU benchmark of the whole engine (``selfhost``) on SmolLM2-135M: latency, throughput, prefix caching, chunking, quality.

One command on the GPU machine; prints each number as it comes and writes JSON. Every section is
timed on the engine's public path (``add_request`` / ``step``): scheduler, KV bookkeeping,
kernels, CUDA graphs and sampling included.

- batch-1 decode ms per token in bf16, int8, int4 and the file's own GGUF blocks (greedy, 256 tokens after a 32-token prompt);
- offline throughput: 256 requests, prompt and output lengths uniform in [100, 1024], random
  token ids, ``ignore_eos`` (the nano-vllm workload), with prefix caching on and off;
- TTFT of a 4,096-token prompt cold, then with its prefix cached;
- inter-token latency of 128 running requests while 8k-token prompts arrive in chunks, at the
  engine's default ``mixed_prefill_tokens`` and without it;
- perplexity of bf16, int8, int4 and GGUF on a fixed English text, and their top-1 agreement with bf16.

    python -m bench.engine_gpu_smollm --json $OUT/engine_gpu_smollm.json
    python -m bench.engine_gpu_smollm --device cpu --smoke   # a small CPU run of the same code
    python -m bench.engine_gpu_smollm --only ttft --ttft-extra 4097,4100,4104   # cached tails of 1, 4 and 8 tokens too
    python -m bench.engine_gpu_smollm --model llama3-8b-random --only ttft,chunked   # the same on an 8B shape
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
import traceback
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bench.gpu_decoder import LLAMA3_8B, SMOLLM2_135M, Shape
from kernels._common import set_pdl
from selfhost import loader
from selfhost.config import DType, EngineConfig, ModelConfig
from selfhost.engine import LLMEngine
from selfhost.models.llama import LlamaForCausalLM
from selfhost.models.ops import build_attention_metadata
from selfhost.sampling import SamplingParams

if TYPE_CHECKING:
    from collections.abc import Callable

TEXT_PATH = Path(__file__).with_name("data") / "declaration.txt"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def model_config(shape: Shape) -> ModelConfig:
    """The engine's config of a ``bench.gpu_decoder`` shape (the decode benchmark's 8B one)."""
    return ModelConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.inter,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.eps,
        max_position_embeddings=8192,
    )


def random_model(model_cfg: ModelConfig, dtype: DType, device: str, max_len: int) -> LlamaForCausalLM:
    """A model of this shape built in ``dtype`` on ``device``: weights N(0, 0.02), norms 1, seed 0."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(loader.torch_dtype(dtype))
    try:
        with torch.device(device):
            model = LlamaForCausalLM(model_cfg, max_len)
    finally:
        torch.set_default_dtype(default)
    gen = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model


def random_engine(model_cfg: ModelConfig, cfg: EngineConfig, name: str) -> LLMEngine:
    """An engine over a model of this shape with random weights (``random_model``), in the engine's dtype on its device."""
    model = random_model(model_cfg, cfg.dtype, cfg.device, cfg.max_model_len or model_cfg.max_position_embeddings)
    return LLMEngine(model, model_cfg, None, cfg, model_name=name)


RANDOM_SHAPES = {"llama3-8b-random": LLAMA3_8B, "smollm2-random": SMOLLM2_135M}
"""``--model`` names of random-weight engines (no download): the 8B shape, and SmolLM2's for the
sections whose timing no weight value changes (``chunked``: fixed lengths, ``ignore_eos``) on a
machine without the GGUF. SmolLM2's tied LM head is a separate random matrix here, of its shape."""


def run_all(engine: LLMEngine) -> tuple[float, int]:
    """Step until every request is done; return (seconds, output tokens)."""
    sync(engine.config.device)
    start = time.perf_counter()
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(out.token_ids) for out in engine.step())
    sync(engine.config.device)
    return time.perf_counter() - start, tokens


def batch1_ms_per_token(engine: LLMEngine, new_tokens: int) -> float:
    """Median-free plain mean over ``new_tokens`` decode steps of one request (its first token excluded)."""
    engine.add_request("warm", list(range(1000, 1032)), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    run_all(engine)
    engine.add_request(
        "b1", list(range(2000, 2032)), SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    )
    while not engine.step():  # prefill + first token (one call later under async scheduling)
        pass
    seconds, tokens = run_all(engine)
    return 1000.0 * seconds / tokens


def offline_workload(vocab: int, n: int, lo: int, hi: int, seed: int) -> list[tuple[list[int], int]]:
    """``n`` (random prompt, output length) pairs, both lengths uniform in [lo, hi] (nano-vllm's workload)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(100, vocab - 100) for _ in range(rng.randint(lo, hi))]
        out.append((prompt, rng.randint(lo, hi)))
    return out


def _add_workload(engine: LLMEngine, tag: str, n: int, lo: int, hi: int, seed: int, *, stream: bool = False) -> int:
    """Queue ``offline_workload``'s requests (greedy, EOS ignored); return their prompt tokens.

    Not streamed by default (one output each, at the end), as an offline run's callers want them;
    ``stream`` gives each an output every step, as a server's streaming clients get them.
    """
    total_in = 0
    for i, (prompt, out_len) in enumerate(offline_workload(engine.model_config.vocab_size, n, lo, hi, seed)):
        total_in += len(prompt)
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        engine.add_request(f"{tag}{seed}-{i}", prompt, params, stream=stream)
    return total_in


def prefills_done(engine: LLMEngine) -> bool:
    """Whether every request is admitted and past its prompt (so each step is all decodes)."""
    sched = engine.scheduler
    return not sched.waiting and all(r.num_computed_tokens >= r.num_prompt_tokens for r in sched.running)


def offline(engine: LLMEngine, n: int, lo: int, hi: int, seed: int) -> dict[str, float]:
    """Throughput of ``n`` requests with prompt and output lengths uniform in [lo, hi], and the prompt tokens that hit the prefix cache."""
    hits = engine.kv.prefix_hit_tokens
    total_in = _add_workload(engine, "o", n, lo, hi, seed)
    seconds, tokens = run_all(engine)
    return {
        "requests": n,
        "seconds": seconds,
        "output_tokens": tokens,
        "input_tokens": total_in,
        "output_tok_s": tokens / seconds,
        "prefix_hit_tokens": engine.kv.prefix_hit_tokens - hits,
    }


def covered_us(spans: list[tuple[float, float]]) -> float:
    """Time covered by sorted ``(start, end)`` intervals: overlapping kernels (PDL) count once."""
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def top_by_name(events: list[Any], n: int = 15) -> list[dict[str, Any]]:
    """The ``n`` event names with the largest total duration: count and total us each."""
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name[:70], []).append(e.time_range.end - e.time_range.start)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": k, "count": len(v), "total_us": round(sum(v), 1)} for k, v in top]


def gpu_busy(
    engine: LLMEngine, n: int, lo: int, hi: int, seed: int, window: int, *, stream: bool = False
) -> dict[str, Any]:
    """Share of time the GPU runs kernels while ``n`` requests decode together (an offline-style load).

    The steps of a window in mid-run (every request admitted, prefills done) run under
    torch.profiler's CUDA activity; the union of the kernel and copy intervals, over the span from
    the first one's start to the last one's end, is the busy share (one GPU clock for both, so host
    timing and profiler overhead on the host stay out of it, except as the idle gaps they cause).
    """
    from torch.profiler import DeviceType, ProfilerActivity, profile

    _add_workload(engine, "busy", n, lo, hi, seed, stream=stream)
    while not prefills_done(engine):
        engine.step()
    running = len(engine.scheduler.running)
    sync(engine.config.device)
    on_gpu = engine.config.device.startswith("cuda")
    kind = DeviceType.CUDA if on_gpu else DeviceType.CPU  # CPU ops only in a --smoke check of the code
    with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(window):
            engine.step()
        sync(engine.config.device)
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == kind)
    run_all(engine)  # the rest of the load, untimed
    busy = covered_us(spans)
    total = spans[-1][1] - spans[0][0] if spans else 0.0
    return {
        "requests": n,
        "streamed": stream,
        "running_in_window": running,
        "steps": window,
        "device_events": len(spans),
        "busy_us": busy,
        "span_us": total,
        "busy_share": busy / total if total else None,
    }


def ttft(engine: LLMEngine, prompt_len: int, repeats: int) -> dict[str, Any]:
    """Time to first token of a fresh prompt, then of the same prompt again (its prefix cached)."""
    cold: list[float] = []
    warm: list[float] = []
    parts: dict[str, list[list[float]]] = {"cold": [], "warm": []}
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for r in range(repeats + 1):
        prompt = [100 + (r * 7919 + i * 31) % 40000 for i in range(prompt_len)]
        for bucket, tag in ((cold, "cold"), (warm, "warm")):
            sync(engine.config.device)
            t0 = time.perf_counter()
            engine.add_request(f"t{r}{tag}", prompt, params)
            marks = [time.perf_counter()]
            while engine.has_unfinished_requests():
                engine.step()
                marks.append(time.perf_counter())
            sync(engine.config.device)
            marks.append(time.perf_counter())
            if r:  # the first round compiles kernels for the shapes
                bucket.append((marks[-1] - t0) * 1000.0)
                # add_request, then each step() call, then the final device sync (ms)
                parts[tag].append([round((b - a) * 1000.0, 3) for a, b in zip([t0, *marks], marks, strict=False)])
    c, w = statistics.median(cold), statistics.median(warm)
    return {
        "prompt_tokens": prompt_len,
        "cold_ms": c,
        "cached_ms": w,
        "speedup": c / w,
        "cold_all": cold,
        "cached_all": warm,
        "cold_parts_ms": parts["cold"],
        "cached_parts_ms": parts["warm"],
    }


def ttft_profile(engine: LLMEngine, prompt_len: int) -> dict[str, Any]:
    """Where a cached prompt's TTFT goes: host spans of ``add_request`` and each ``step``, and the device's kernels.

    A diagnostic beside ``ttft``: one cold run, then the same prompt again under torch.profiler (CPU
    and CUDA activity; the profiler's own overhead lengthens the host spans).
    """
    from torch.profiler import DeviceType, ProfilerActivity, profile, record_function

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = [100 + (i * 7919) % 40000 for i in range(prompt_len)]
    engine.add_request("prof-cold", prompt, params)
    run_all(engine)
    sync(engine.config.device)
    on_gpu = engine.config.device.startswith("cuda")
    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=acts) as prof:
        with record_function("ttft.add_request"):
            engine.add_request("prof-warm", prompt, params)
        i = 0
        while engine.has_unfinished_requests():
            with record_function(f"ttft.step{i}"):
                engine.step()
            i += 1
        sync(engine.config.device)
    events = list(prof.events())
    t0 = min(e.time_range.start for e in events)
    host = {
        e.name: [round((e.time_range.start - t0) / 1e3, 3), round((e.time_range.end - t0) / 1e3, 3)]
        for e in events
        if e.name.startswith("ttft.")
    }
    kind = DeviceType.CUDA if on_gpu else DeviceType.CPU
    dev = [e for e in events if e.device_type == kind and not e.name.startswith("ttft.")]
    spans = sorted((e.time_range.start, e.time_range.end) for e in dev)
    host_calls = [e for e in events if on_gpu and e.device_type == DeviceType.CPU and not e.name.startswith("ttft.")]
    return {
        "prompt_tokens": prompt_len,
        "host_spans_ms": host,
        "device_first_last_ms": [round((spans[0][0] - t0) / 1e3, 3), round((spans[-1][1] - t0) / 1e3, 3)]
        if spans
        else None,
        "device_events": len(spans),
        "device_busy_ms": covered_us(spans) / 1e3,
        "top_device_us": top_by_name(dev),
        "top_host_us": top_by_name(host_calls),
    }


RUNNING_PROMPT = 64
"""Prompt tokens of each running request in ``chunked_itl``."""
WARMUP_STEPS = 5
"""Untimed all-decode steps ``chunked_itl`` runs before its first round."""
CHUNKED_LOAD = (128, 7680, 2, 20, 50)
"""The chunked section's running requests, long-prompt tokens, arrivals a round, steps between
arrivals and steady steps a round (``chunked_itl``'s arguments)."""
CHUNKED_MAX_SEQS = 160
"""The chunked section's engine's ``max_num_seqs``: room for the running requests and the prompts."""


def chunked_config(cfg: EngineConfig) -> EngineConfig:
    """``cfg`` as the chunked section runs it at the engine's defaults: their budget and chunk cap, ``CHUNKED_MAX_SEQS``."""
    default = EngineConfig()
    return replace(
        cfg,
        max_num_batched_tokens=default.max_num_batched_tokens,
        mixed_prefill_tokens=default.mixed_prefill_tokens,
        max_num_seqs=CHUNKED_MAX_SEQS,
    )


def chunked_window(budget: int, mixed: int, running: int, long_len: int, arrivals: int, every: int) -> int:
    """Most steps a mixed window of ``chunked_itl`` runs: its arrivals, then twice the steps its long prompts need."""
    chunk = max(1, budget - running)  # prompt tokens a step beside the running requests' decodes
    chunk = min(chunk, mixed or chunk)  # and ``mixed_prefill_tokens``, where set
    return max(arrivals * every + every, 2 * -(-arrivals * long_len // chunk))


def chunked_pool_blocks(
    budget: int,
    mixed: int,
    running: int,
    long_len: int,
    arrivals: int,
    every: int,
    steps: int,
    block_size: int,
    rounds: int = 3,
) -> int:
    """KV blocks that hold every running request's context to ``chunked_itl``'s end and one round's long prompts.

    NOTE(crossway): the running requests decode through every window, so their contexts grow by
    a steady and a mixed window a round. On the 8B shape the bench's 10 GiB pool (81,920 tokens)
    ran out in the third round at a 256-token budget, and the long prompts were preempted, admitted
    and preempted again for 15,000 steps (2026-11-28): the bench measures chunking, so its pool fits.
    """
    window = chunked_window(budget, mixed, running, long_len, arrivals, every)
    tokens = running * (RUNNING_PROMPT + WARMUP_STEPS + rounds * (steps + window)) + arrivals * long_len
    return -(-tokens // block_size) + running + arrivals  # a partial last block each


def chunked_itl(
    engine: LLMEngine, running: int, long_len: int, arrivals: int, every: int, steps: int, rounds: int = 3
) -> dict[str, Any]:
    """Step times of ``running`` decoding requests, steady and while long prompts arrive every ``every`` steps.

    NOTE(crossway): ``rounds`` times a steady window of ``steps`` steps, then a mixed one with
    ``arrivals`` fresh long prompts (new ids each round, so no round hits an earlier one's prefix).
    On the GPU machines the steady median moved between ~1.25 and ~2.0-2.4 ms from one window to
    the next in runs of the same code (2026-11-26), so each mixed window is judged against the
    steady window just before it (``round_ratios``; ``ratio`` is the worst of them), beside the
    pooled figures. A mixed window lasts until its long prompts have all run (at most
    ``chunked_window`` steps; ``prompts_finished`` says whether they did): beside 128 decodes a
    256-token budget leaves 128 prompt tokens a step, so two 7,680-token prompts take 120 steps,
    and a window of ``arrivals * every + every`` steps left their chunks to the next steady window
    (timed as steady steps on the 8B shape, 2026-11-28). The engine's pool should hold
    ``chunked_pool_blocks``.
    """
    params = SamplingParams(max_tokens=engine.max_model_len - RUNNING_PROMPT, temperature=0.0, ignore_eos=True)
    for i in range(running):
        engine.add_request(f"run{i}", [200 + (i * 13 + j) % 30000 for j in range(RUNNING_PROMPT)], params)
    while not prefills_done(engine):
        engine.step()

    def timed_steps(k: int, arrive: Callable[[int], None] | None = None) -> list[float]:
        # NOTE(crossway): the gap between one step's outputs and the next, as a streaming client
        # sees it; no device sync in between, so async scheduling's overlap counts.
        times = []
        t0 = time.perf_counter()
        for s in range(k):
            if arrive is not None:
                arrive(s)
            engine.step()
            t1 = time.perf_counter()
            times.append((t1 - t0) * 1000.0)
            t0 = t1
        return times

    def p99(xs: list[float]) -> float:
        return sorted(xs)[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]

    long_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    timed_steps(WARMUP_STEPS)
    steady: list[float] = []
    mixed: list[float] = []
    round_ratios: list[float] = []
    mixed_steps: list[int] = []
    finished: list[bool] = []
    cfg = engine.config
    window = chunked_window(cfg.max_num_batched_tokens, cfg.mixed_prefill_tokens, running, long_len, arrivals, every)
    for r in range(rounds):
        steady_r = timed_steps(steps)
        # built beforehand: a client's list, not the engine's work
        prompts = {
            s: [300 + (s * 17 + r * 7919 + j * 7) % (vocab - 300) for j in range(long_len)]
            for s in range(0, arrivals * every, every)
        }

        def arrive(s: int, prompts: dict[int, list[int]] = prompts, r: int = r) -> None:
            if s in prompts:
                engine.add_request(f"long{r}-{s}", prompts[s], long_params)

        def prompts_left(r: int = r) -> bool:
            return any(request_id.startswith(f"long{r}-") for request_id in engine.scheduler.requests)

        mixed_r = timed_steps(arrivals * every + every, arrive)
        while prompts_left() and len(mixed_r) < window:
            mixed_r += timed_steps(1)
        finished.append(not prompts_left())
        round_ratios.append(p99(mixed_r) / statistics.median(steady_r))
        mixed_steps.append(len(mixed_r))
        steady += steady_r
        mixed += mixed_r
    engine.abort([f"run{i}" for i in range(running)])
    return {
        "running": running,
        "long_prompt_tokens": long_len,
        "arrivals": arrivals,
        "rounds": rounds,
        "budget": cfg.max_num_batched_tokens,
        "mixed_prefill_tokens": cfg.mixed_prefill_tokens,
        "ratio": max(round_ratios),
        "round_ratios": round_ratios,
        "mixed_steps": mixed_steps,
        "prompts_finished": finished,
        "kv_blocks": engine.kv.pool.num_blocks,
        "steady_step_ms": statistics.median(steady),
        "itl_p99_ms": p99(mixed),
        "pooled_ratio": p99(mixed) / statistics.median(steady),
        "mixed_max_ms": max(mixed),
        "mixed_median_ms": statistics.median(mixed),
        "mixed_slowest": sorted(((round(t, 2), i) for i, t in enumerate(mixed)), reverse=True)[:3],  # (ms, step)
    }


@torch.inference_mode()
def text_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """``(L, V)`` fp32 next-token logits for every position of ``ids`` in one prefill (no sampling)."""
    runner = engine.runner
    bs = runner.block_size
    table = list(range(-(-len(ids) // bs)))  # blocks 0.. of a pool no request holds now
    meta = build_attention_metadata([0, len(ids)], [len(ids)], [table], bs, runner.device)
    t = torch.tensor(ids, device=runner.device)
    hidden = runner.model(
        t, torch.arange(len(ids), device=runner.device), runner.kv_caches, meta, kernels=runner.use_kernels
    )
    return runner.model.compute_logits(hidden)


def quality(engines: dict[str, LLMEngine], text: str) -> dict[str, Any]:
    first = next(iter(engines.values()))
    assert first.tokenizer is not None
    ids = first.tokenizer.encode(text)[: min(2048, first.max_model_len)]
    out: dict[str, Any] = {"tokens": len(ids)}
    base_top1 = None
    for name, engine in engines.items():
        logits = text_logits(engine, ids)[:-1]  # predicts ids[1:]
        target = torch.tensor(ids[1:], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits, target)
        top1 = logits.argmax(-1)
        base_top1 = top1 if base_top1 is None else base_top1
        out[name] = {
            "perplexity": math.exp(float(nll)),
            "top1_agree_with_unquantized": float((top1 == base_top1).float().mean()),
        }
    return out


def section(results: dict[str, Any], name: str, fn: Callable[[], Any], path: Path) -> None:
    """Run one measurement into ``results[name]`` (its error instead, if it fails) and rewrite the JSON."""
    t0 = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 (one failed section must not lose the others)
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    print(f"{name} ({time.perf_counter() - t0:.1f} s): {json.dumps(results[name], default=str)[:600]}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))  # a killed run keeps what it measured


def engine_config(device: str, smoke: bool) -> EngineConfig:
    """The bf16 engine every section starts from (fp32 on the CPU); ``smoke`` shrinks it for a CPU run."""
    cuda = device.startswith("cuda")
    dtype: DType = "bfloat16" if cuda else "float32"
    return EngineConfig(
        device=device,
        dtype=dtype,
        max_num_seqs=256 if not smoke else 8,
        max_num_batched_tokens=8192 if not smoke else 256,
        max_model_len=8192 if not smoke else 512,
        kv_cache_memory_bytes=(10 << 30) if cuda else ((256 << 20) if smoke else (1 << 30)),  # 8k tokens: 0.4 GiB fp32
        cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256),
        mixed_prefill_tokens=0,  # throughput-bound sections; ``chunked`` sets the engine's default
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2", help=f"a model name or path, or one of {', '.join(RANDOM_SHAPES)}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny counts (a CPU check of the code)")
    ap.add_argument("--only", default="", help="comma-separated sections")
    ap.add_argument("--json", default="bench/results/engine_gpu_smollm.json")
    ap.add_argument("--offline-pairs", type=int, default=2, help="alternated prefix-cache on/off offline runs")
    ap.add_argument("--no-pdl", action="store_true", help="launch the kernels without programmatic dependent launch")
    ap.add_argument(
        "--ttft-extra",
        default="",
        help="comma-separated prompt lengths timed like the 4k one (ttft_<n>), e.g. 4097,4104 for a cached tail of 1 and 8",
    )
    ap.add_argument(
        "--chunked-mixed",
        default=f"{EngineConfig().mixed_prefill_tokens},0",
        help="comma-separated mixed_prefill_tokens the chunked section runs (0: the step budget alone)",
    )
    ap.add_argument(
        "--chunked-load",
        default="",
        help="RUNNING,PROMPT: decoding requests and long-prompt tokens of the chunked section (default 128,7680)",
    )
    args = ap.parse_args()
    set_pdl(not args.no_pdl)
    smoke = args.smoke
    cuda = args.device.startswith("cuda")
    base = engine_config(args.device, smoke)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "smoke": smoke,
        "pdl": not args.no_pdl,
    }
    only = set(filter(None, args.only.split(",")))
    json_path = Path(args.json)

    def run(name: str, fn: Callable[[], Any]) -> None:
        section(results, name, fn, json_path)

    def want(name: str) -> bool:
        return not only or name in only

    engines: dict[str, LLMEngine] = {}

    def engine(quant: str = "none", **overrides: Any) -> LLMEngine:
        if quant not in engines:
            t0 = time.perf_counter()
            # NOTE(crossway): only the bf16 engine runs the big workloads; the quantized ones get a
            # small KV pool and few graphs, so three models fit on one GPU together.
            small = {} if quant == "none" else {"kv_cache_memory_bytes": 1 << 30, "max_num_seqs": 8}
            cfg = replace(base, quantization=quant, **small)  # type: ignore[arg-type]
            if args.model in RANDOM_SHAPES:
                engines[quant] = random_engine(model_config(RANDOM_SHAPES[args.model]), cfg, args.model)
            else:
                engines[quant] = LLMEngine.from_model(args.model, cfg)
            results.setdefault("load_s", {})[quant] = time.perf_counter() - t0
        e = engines[quant]
        e.kv.pool.reset_prefix_cache()
        return (
            e
            if not overrides
            else LLMEngine(e.runner.model, e.model_config, e.tokenizer, replace(e.config, **overrides))
        )

    n_tok = 16 if smoke else 256
    for quant in ("none", "int8", "int4", "gguf"):
        if want("batch1"):
            run(f"batch1_{quant}", partial(lambda q: {"ms_per_token": batch1_ms_per_token(engine(q), n_tok)}, quant))
    if want("offline"):
        n, lo, hi = (6, 10, 40) if smoke else (256, 100, 1024)
        # NOTE(crossway): the warm-up runs the timed workload itself once (``engine()`` empties the
        # prefix cache, so the timed runs still hit nothing): Triton compiles a kernel per new
        # specialization (a merge's power-of-two splits or sequences, an int argument's divisibility
        # by 16), and a warm-up on another seed's lengths left some to the first timed run. On a fresh
        # H100 (2026-12-07) that run read 27.9k output tok/s, the same tree's next process 48.1k.
        # Then on/off alternate on that seed.
        run("offline_warmup", lambda: offline(engine(), n, lo, hi, seed=0))
        for rep in range(1, args.offline_pairs + 1):
            on = partial(run, f"offline_{rep}", lambda: offline(engine(), n, lo, hi, seed=0))
            off = partial(
                run,
                f"offline_no_prefix_cache_{rep}",
                lambda: offline(engine("none", enable_prefix_caching=False), n, lo, hi, seed=0),
            )
            # NOTE(crossway): every other pair runs "off" first, so a cost of going first or second
            # (the warm engine's pool full of cached blocks, a fresh engine's new allocations)
            # does not read as the cost of prefix caching
            for half in (on, off) if rep % 2 else (off, on):
                half()
        ratios = [
            results[f"offline_{r}"]["output_tok_s"] / results[f"offline_no_prefix_cache_{r}"]["output_tok_s"]
            for r in range(1, args.offline_pairs + 1)
            if "output_tok_s" in results.get(f"offline_{r}", {})
            and "output_tok_s" in results.get(f"offline_no_prefix_cache_{r}", {})
        ]
        if ratios:  # prefix caching on / off, pair by pair: its cost when nothing hits
            results["offline_prefix_on_off"] = {"ratios": ratios, "median": statistics.median(ratios)}
            print("offline_prefix_on_off", results["offline_prefix_on_off"])
    if want("busy"):
        # 32 requests on the 8B shape: 256 would not fit its KV pool, and preemption is not the load meant
        n, lo, hi = (6, 10, 40) if smoke else (32 if args.model == "llama3-8b-random" else 256, 100, 1024)
        run("gpu_busy", lambda: gpu_busy(engine(), n, lo, hi, seed=3, window=5 if smoke else 40))
        run("gpu_busy_streamed", lambda: gpu_busy(engine(), n, lo, hi, seed=3, window=5 if smoke else 40, stream=True))
    if want("ttft"):
        run("ttft_4k", lambda: ttft(engine(), 128 if smoke else 4096, 1 if smoke else 3))
        for n in (int(v) for v in args.ttft_extra.split(",") if v):
            run(f"ttft_{n}", partial(lambda n: ttft(engine(), n, 1 if smoke else 3), n))
    if "ttft_profile" in only:  # a diagnostic, only when asked for by name
        run("ttft_4k_profile", lambda: ttft_profile(engine(), 128 if smoke else 4096))
    if want("chunked"):
        # the engine's step budget (512) with each mixed_prefill_tokens asked for: the default
        # (128 prompt tokens a step beside 128 decodes) and 0, where the budget alone sets the
        # chunk (384 tokens); chunked_itl is the default's
        running, long_len, arrivals, every, steps = (4, 200, 2, 4, 5) if smoke else CHUNKED_LOAD
        if args.chunked_load:
            running, long_len = (int(v) for v in args.chunked_load.split(","))
        default = EngineConfig()
        b = default.max_num_batched_tokens // 8 if smoke else default.max_num_batched_tokens
        for mixed in (int(v) for v in args.chunked_mixed.split(",")):
            m = mixed // 8 if smoke else mixed
            name = "chunked_itl" if mixed == default.mixed_prefill_tokens else f"chunked_itl_mixed{mixed}"
            blocks = chunked_pool_blocks(b, m, running, long_len, arrivals, every, steps, base.block_size)
            run(
                name,
                partial(
                    lambda m, blocks: chunked_itl(
                        engine(
                            "none",
                            max_num_batched_tokens=b,
                            mixed_prefill_tokens=m,
                            max_num_seqs=8 if smoke else CHUNKED_MAX_SEQS,
                            num_kv_blocks=blocks,
                        ),
                        running=running,
                        long_len=long_len,
                        arrivals=arrivals,
                        every=every,
                        steps=steps,
                    ),
                    m,
                    blocks,
                ),
            )
    if want("quality"):
        text = TEXT_PATH.read_text()
        run("quality", lambda: quality({q: engine(q) for q in ("none", "int8", "int4", "gguf")}, text))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
