"""GPU benchmark: decode tok/s of a Llama-3-8B-shaped decoder on ``kernels/`` in bf16, int8 and int4.

One command on the GPU machine; prints a table last and writes JSON. Measures, in one process:
a device-to-device copy ceiling (bytes read + written); batch-1 decode tok/s per weight format with
its model-bandwidth utilisation (linear weight bytes per token x tok/s over the copy ceiling);
decode tok/s at several batch sizes; and, with ``--hf``, Hugging Face transformers on the same
shape (eager, and static cache + torch.compile). Decode steps replay one CUDA graph each; the KV
context starts at ``--context`` random tokens. Weights are random (``--random-weights``).

    python -m bench.engine_gpu --random-weights --json $OUT/engine_gpu.json [--hf eager,compiled]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import asdict, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from bench.gpu_decoder import KERNEL_KIND, LLAMA3_8B, SMOLLM2_135M, Decoder, DecodeState, QLinear, Shape, capture
from kernels import quant_matmul
from kernels._common import set_pdl
from kernels.dense_gemv import MODEL_ROWS
from kernels.quant_matmul import Config

if TYPE_CHECKING:
    from collections.abc import Callable


SHAPES = {"llama3-8b": LLAMA3_8B, "smollm2-135m": SMOLLM2_135M}


def cuda_time_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median wall time of ``fn`` on the device, in ms (one warm-up call first)."""
    fn()
    times: list[float] = []
    for _ in range(repeats):
        start, end = _event(), _event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _event() -> torch.cuda.Event:
    """A timing event (torch leaves ``Event``'s constructor untyped)."""
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def graph_time_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median device time of ``fn`` captured in a CUDA graph, in ms: launch overhead excluded, as in decode."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return cuda_time_ms(graph.replay, repeats)


def copy_ceiling_gbs(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written, in GB/s."""
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), repeats=10)
    return 2 * nbytes / ms / 1e6


def candidates(kind: Literal["int8", "int4", "dense"], m: int, group: int) -> list[Config]:
    """Launch configs tried per (shape, rows); each GEMV tile with and without the weight prefetch."""
    out: list[Config] = []
    if kind == "int4" and m <= 4:
        for bn in (2, 4, 8, 16, 32, 64):  # 2: the narrow tiles the small (SmolLM2) shapes tuned to in int8
            for bk in (b for b in (128, 256, 512, 1024) if b % group == 0):
                for warps in (1, 2, 4, 8) if bn >= 32 else (1, 2, 4):
                    for split in (1, 2, 4, 8):
                        out += [Config("gemv", bn, bk, split, num_warps=warps, prefetch=pf) for pf in (False, True)]
    elif m <= 4 or kind == "dense":  # the dense kind has only the GEMV (bigger batches run cuBLAS)
        for bn in (2, 4, 8, 16, 32, 64):
            for bk in (512, 1024, 2048, 4096):
                for warps in (1, 2, 4, 8):
                    # the (bn, bk) fp32 accumulator spills past 64 a thread; under 4 a thread wastes lanes
                    if not 4 * 32 * warps <= bn * bk <= 64 * 32 * warps:
                        continue
                    for split in (1, 2, 4, 8) if bn >= 8 else (1, 2):
                        out += [Config("gemv", bn, bk, split, num_warps=warps, prefetch=pf) for pf in (False, True)]
    if kind == "dense":
        return out
    tiled_bks = (64, 128) if kind == "int8" else tuple(b for b in (32, 64, 128) if group % b == 0)
    few = m <= 16  # one row tile: wider tiles, deeper split-K and 8 warps fill the GPU instead
    for bm in (16,) if few else (16, 32, 64):
        for bn in (32, 64, 128, 256) if few else (32, 64, 128):
            for bk in tiled_bks:
                for split in (1, 2, 4, 8, 16) if few else (1, 2, 4):
                    for warps in (4, 8) if few else (4,):
                        out.append(Config("tiled", bn, bk, split, num_warps=warps, block_m=bm))
    return out


def _run_all(ws: list[QLinear], x: torch.Tensor, glu: bool) -> None:
    for w in ws:
        w(x, glu)


def tune(decoder: Decoder, batches: list[int], log: list[dict[str, object]], *, search: bool = True) -> None:
    """Pin, for every linear shape and batch, the fastest config over all the model's copies of that layer.

    Every shape's default config (the one the engine launches) is timed first; without ``search``,
    that is all (nothing is pinned).

    NOTE(h7): each candidate is timed over the 32 layers' distinct weights in turn, so the weights
    stream from HBM as in a real step instead of sitting in the 50 MB L2, and inside a CUDA graph,
    since Python launch overhead (tens of us per Triton launch) would otherwise hide the kernel.
    """
    kind = KERNEL_KIND[decoder.mode]
    for _, ws, glu in decoder.layer_groups():
        n, k = ws[0].n, ws[0].k
        for m in batches:
            if kind == "dense" and m > MODEL_ROWS:
                continue  # cuBLAS: nothing of ours to tune
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            quant_matmul.set_config(kind, m, n, k, None)  # the launcher's default, as the engine runs it
            run = partial(_run_all, ws, x, glu)
            # NOTE(h7): timed twice, the first discarded: a shape's first timing (after the compile)
            # can read high (dense qkv 19.7 and 18.4 us against 16.8 and 16.9 on two H100s, 2026-11-26)
            first_ms = graph_time_ms(run, repeats=3) / len(ws)
            default_ms = graph_time_ms(run, repeats=3) / len(ws)
            if not search:
                log.append({"kind": kind, "m": m, "n": n, "k": k, "default_ms": default_ms, "first_ms": first_ms})
                print(
                    f"  default {kind} m={m} {n}x{k}: {default_ms * 1e3:.1f} us (first {first_ms * 1e3:.1f})",
                    flush=True,
                )
                continue
            # NOTE(h7): the default is in the race: it holds tiles tuned by the step's rate
            # (bench/tune_step.py) and options the candidates lack (int4's ``ahead``)
            default = ws[0].default_config(m)
            best: tuple[float, Config] = (default_ms, default)
            by_path: dict[str, float] = {default.path: default_ms}  # each path's best time, ms
            for cfg in candidates(kind, m, ws[0].group):
                quant_matmul.set_config(kind, m, n, k, cfg)
                try:
                    ms = graph_time_ms(run, repeats=3) / len(ws)
                except Exception as exc:  # noqa: BLE001 (a config the compiler rejects is skipped)
                    log.append({"kind": kind, "m": m, "n": n, "k": k, "config": asdict(cfg), "error": repr(exc)[:200]})
                    continue
                if ms < best[0]:
                    best = (ms, cfg)
                by_path[cfg.path] = min(ms, by_path.get(cfg.path, ms))
            quant_matmul.set_config(kind, m, n, k, best[1])
            gbs = ws[0].nbytes / best[0] / 1e6
            log.append(
                {
                    "kind": kind,
                    "m": m,
                    "n": n,
                    "k": k,
                    "ms": best[0],
                    "weight_gbs": gbs,
                    "config": asdict(best[1]),
                    "by_path_ms": by_path,
                    "default_ms": default_ms,
                    "first_ms": first_ms,
                }
            )
            paths = ", ".join(f"{p} {t * 1e3:.1f}" for p, t in by_path.items())
            print(f"  tuned {kind} m={m} {n}x{k}: {best[0] * 1e3:.1f} us, {gbs:.0f} GB/s, {best[1]} (best by path, us: {paths}; default {default_ms * 1e3:.1f})", flush=True)  # fmt: skip


def decode_rate(decoder: Decoder, shape: Shape, batch: int, context: int, steps: int) -> tuple[float, list[int], float]:
    """Decode tok/s of ``batch`` rows over ``steps`` graph replays, the first row's greedy ids, and host us a launch.

    The launch time is that of one ``replay`` call made with the device idle (median of 8): the
    host's cost of launching one step's graph.
    """
    st = DecodeState(shape, batch, context, steps + 8)
    graph = capture(decoder, st)
    ids = []
    for _ in range(4):  # greedy ids of row 0 for a cross-format check
        graph.replay()
        ids.append(int(st.ids[0]))
    st.reset()
    torch.cuda.synchronize()
    start, end = _event(), _event()
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    rate = batch * steps / (start.elapsed_time(end) / 1e3)
    launches = []
    for _ in range(8):  # the KV slots past the timed steps: still within the state's capacity
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        launches.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    del graph, st
    return rate, ids, statistics.median(launches)


class Share(NamedTuple):
    """One kernel launch of a step: its share of the critical path and its duration, in us."""

    kernel: str
    share_us: float
    dur_us: float


def critical_path(events: list[tuple[str, float, float]]) -> list[Share]:
    """Each kernel's share of a step's critical path: how much later the step's last end is once it ends.

    ``events``: ``(name, start, end)`` of one step's kernels in launch order. Under programmatic
    dependent launch a kernel starts while the one before it runs and waits for it, so durations
    overlap and their sum overstates the step; the shares sum to its span.
    """
    out: list[Share] = []
    last = events[0][1] if events else 0.0
    for name, start, end in events:
        out.append(Share(name, max(0.0, end - last), end - start))
        last = max(last, end)
    return out


def step_profile(decoder: Decoder, shape: Shape, context: int, replays: int = 4) -> dict[str, object]:
    """One batch-1 decode step's kernels (torch.profiler over graph replays): per name, and one layer in order.

    ``by_kernel``: launches, summed durations and critical-path shares (``critical_path``) a step,
    largest share first. ``layer``: the kernels of the middle layer in launch order with their shares
    (the GEMVs of a format share one name, so this tells them apart). ``span_us``: the step's span.
    """
    from torch.profiler import ProfilerActivity, profile

    st = DecodeState(shape, 1, context, replays + 8)
    graph = capture(decoder, st)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    kernels.sort(key=lambda e: e.time_range.start)
    per = len(kernels) // replays
    step = [(e.name[:80], float(e.time_range.start), float(e.time_range.end)) for e in kernels[per : 2 * per]]
    shares = critical_path(step)
    by: dict[str, dict[str, float]] = {}
    for r in shares:
        agg = by.setdefault(r.kernel, {"launches": 0.0, "dur_us": 0.0, "share_us": 0.0})
        agg["launches"] += 1
        agg["dur_us"] += r.dur_us
        agg["share_us"] += r.share_us
    # a layer runs from its input norm (the first of its two) to the next layer's
    norms = [i for i, (name, _, _) in enumerate(step) if "rms_norm" in name]
    middle = len(norms) // 4  # the middle layer (the final norm is the odd one out)
    layer = shares[norms[2 * middle] : norms[2 * middle + 2]] if len(norms) > 2 * middle + 2 else []
    del graph, st
    ranked = sorted(by.items(), key=lambda kv: -kv[1]["share_us"])
    return {
        "span_us": step[-1][2] - step[0][1] if step else 0.0,
        "by_kernel": [{"kernel": k, **v} for k, v in ranked],
        "layer": [r._asdict() for r in layer],
    }


def print_profile(mode: str, prof: dict[str, Any]) -> None:
    """``step_profile``'s result in a few lines: the largest shares by kernel name, then the middle layer in order."""
    print(f"  {mode} batch-1 step, span {prof['span_us']:.0f} us; critical-path shares:")
    for r in prof["by_kernel"][:8]:
        print(f"    {r['kernel'][:40]:40s} x{r['launches']:.0f}: {r['share_us']:.1f} us")
    print("  one layer:", " ".join(f"{r['kernel'][:14]} {r['share_us']:.1f}" for r in prof["layer"]), flush=True)


def hf_rates(shape: Shape, context: int, steps: int, which: list[str]) -> dict[str, float]:
    """Hugging Face transformers greedy decode tok/s at batch 1 on the same shape, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.inter,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocab,
        rope_theta=shape.rope_theta,  # type: ignore[call-arg]  # a kwarg the v5 stubs do not list
        max_position_embeddings=8192,
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()  # type: ignore[arg-type]  # the v5 stubs type .to as a decorator wrapper
    prompt = torch.randint(0, shape.vocab, (1, context), device="cuda")
    out: dict[str, float] = {}

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.inference_mode():
        if "eager" in which:
            run(2)
            out["hf_eager"] = steps / (run(steps + 1) - run(1))
            print(f"hf eager batch 1: {out['hf_eager']:.1f} tok/s", flush=True)
        if "compiled" in which:
            # NOTE(h7): with a static cache, generate() compiles the forward itself (reduce-overhead,
            # CUDA graphs, with the step marks that a hand-wrapped torch.compile lacks: that failed with
            # "accessing tensor output of CUDAGraphs that has been overwritten").
            model.generation_config.cache_implementation = "static"
            run(steps + 1)  # compile and capture
            run(steps + 1)
            out["hf_compiled"] = steps / (run(steps + 1) - run(1))
            print(f"hf compiled batch 1: {out['hf_compiled']:.1f} tok/s", flush=True)
    return out  # the model is freed with this frame


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random-weights", action="store_true", required=True, help="random weights (no download)")
    p.add_argument("--modes", default="bf16,int8,int4")
    p.add_argument("--batches", default="1,4,16,64", help="batch sizes for int4 and bf16")
    p.add_argument("--int8-batches", default="1", help="batch sizes for int8")
    p.add_argument("--context", type=int, default=512, help="KV context tokens before the first timed step")
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--group", type=int, default=128, help="int4 group size")
    p.add_argument("--shape", choices=tuple(SHAPES), default="llama3-8b", help="the decoder's dimensions")
    p.add_argument("--layers", type=int, default=0, help="fewer layers for a smoke run (0: the shape's own)")
    p.add_argument("--hf", default="", help="comma list of eager,compiled")
    p.add_argument("--json", default="")
    p.add_argument("--profile", action="store_true", help="kernel times of one batch-1 step per format")
    p.add_argument("--torch-argmax", action="store_true", help="greedy picks by torch.argmax (the baseline)")
    p.add_argument("--no-pdl", action="store_true", help="launch the kernels without programmatic dependent launch")
    p.add_argument("--no-pairs", action="store_true", help="int4 GEMVs load x themselves, not as pairs")
    p.add_argument(
        "--no-tune",
        action="store_true",
        help="time the launchers' default configs only (a quick A/B of a kernel change)",
    )
    a = p.parse_args()
    set_pdl(not a.no_pdl)
    shape = SHAPES[a.shape]
    shape = replace(shape, layers=a.layers or shape.layers)
    batches = [int(b) for b in a.batches.split(",")]
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": asdict(shape),
        "context": a.context,
        "steps": a.steps,
        "group_size": a.group,
        "pdl": not a.no_pdl,
        "x_pairs": not a.no_pairs,
        "tuned": not a.no_tune,
        "argmax": "torch" if a.torch_argmax else "kernels.argmax",
        "date": time.strftime("%Y-%m-%d"),
    }
    import triton

    res["triton"] = triton.__version__
    copy = copy_ceiling_gbs()
    res["copy_gbs"] = copy
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    rows: list[dict[str, object]] = []
    tuning: list[dict[str, object]] = []
    ids: dict[str, list[int]] = {}
    profiles: dict[str, dict[str, object]] = {}
    for mode in [m for m in a.modes.split(",") if m in ("bf16", "cublas", "int8", "int4")]:
        t0 = time.perf_counter()
        dec = Decoder(shape, mode, a.group)
        dec.torch_argmax = a.torch_argmax
        dec.pairs = frozenset() if a.no_pairs else dec.pairs
        wbytes = dec.linear_bytes()
        print(
            f"{mode}: weights built in {time.perf_counter() - t0:.1f} s, {wbytes / 1e9:.2f} GB of linears", flush=True
        )
        mode_batches = batches if mode != "int8" else [int(b) for b in a.int8_batches.split(",")]
        if mode != "cublas":
            tune(dec, mode_batches, tuning, search=not a.no_tune)
        for b in mode_batches:
            rate, first, host_us = decode_rate(dec, shape, b, a.context, a.steps)
            row: dict[str, object] = {"mode": mode, "batch": b, "tok_s": rate, "weight_gb": wbytes / 1e9}
            row["host_us_a_launch"] = host_us
            if b == 1:
                row["mbu"] = wbytes * rate / (copy * 1e9)
                ids[mode] = first
            rows.append(row)
            print(
                f"  {mode} batch {b}: {rate:.1f} tok/s; a graph launch takes {host_us:.0f} us of host time", flush=True
            )
        if a.profile:
            try:
                profiles[mode] = step_profile(dec, shape, a.context)
                print_profile(mode, profiles[mode])
            except Exception as exc:  # noqa: BLE001 (the profiler is a diagnostic: never lose the run to it)
                profiles[mode] = {"error": repr(exc)[:300]}
        del dec
        gc.collect()
        torch.cuda.empty_cache()
    res["rows"], res["tuning"], res["first_ids"], res["profile"] = rows, tuning, ids, profiles
    hf = hf_rates(shape, a.context, a.steps, a.hf.split(",")) if a.hf else {}
    res["hf"] = hf
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    bf16_1 = next((r["tok_s"] for r in rows if r["mode"] == "bf16" and r["batch"] == 1), None)
    print(
        f"\n{res['device']}, copy ceiling {copy:.0f} GB/s, context {a.context}, {a.steps} steps, int4 group {a.group}"
    )
    print(f"{'mode':6} {'batch':>5} {'tok/s':>9} {'vs bf16 b1':>10} {'MBU':>6}")
    for r in rows:
        ratio = f"{r['tok_s'] / bf16_1:.2f}x" if bf16_1 and r["batch"] == 1 else ""  # type: ignore[operator]
        mbu = f"{r['mbu']:.0%}" if "mbu" in r else ""
        print(f"{r['mode']:6} {r['batch']:>5} {r['tok_s']:>9.1f} {ratio:>10} {mbu:>6}")
    for k, v in hf.items():
        print(f"{k:12} batch 1 {v:9.1f} tok/s")


if __name__ == "__main__":
    main()
