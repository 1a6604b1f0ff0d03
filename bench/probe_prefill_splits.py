"""The paged prefill kernel's tiles and key splits for a chunk behind a long context: which launch is fastest.

A mixed step's prefill launch as the engine makes it: ``--decodes`` one-token rows first, then a
``--chunk``-token chunk of one sequence whose context is ``--context`` tokens, in a ``q`` of
``--pad`` rows. ``--grid chunk`` sizes the grid by the chunk (an eager step: ``max_query_len`` is
the chunk's length); ``--grid pad`` by the padded token count, as ``selfhost.step_graphs`` captures
it (``max_query_len`` is the graph's size, so half the tiles of a 128-token chunk in a 256-token
graph are empty). Each launch is timed as 30 in one CUDA graph (us a launch, the median of 7
replays), beside the default launch, and checked against it; the default launch's kernels (the
attention and the merge) are also timed apart by the profiler. GPU only.

The 30 launches read ``--layers`` distinct caches in turn, as a step's layers do: with one cache
its keys stay in L2 across launches (SmolLM2's 7,680-token context is 5.9 MB), which hides the
HBM latency a key loop that prefetches too little pays in the engine. ``--stages`` sweeps the
pipeline depth beside the tiles and warps.

    python -m bench.probe_prefill_splits --shape llama8b --json $OUT/probe_prefill_splits.json
    python -m bench.probe_prefill_splits --shape smollm2 --grid pad
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kernels import paged_prefill

if TYPE_CHECKING:
    from collections.abc import Callable

SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}
"""Query heads, KV heads and head dim."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama8b")
    ap.add_argument("--context", type=int, default=7680)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--decodes", type=int, default=128)
    ap.add_argument("--pad", type=int, default=256)
    ap.add_argument("--grid", choices=["chunk", "pad"], default="chunk")
    ap.add_argument("--splits", default="1,2,4,6,8,12,16,24")
    ap.add_argument(
        "--split-tokens",
        type=int,
        default=0,
        help="the chunk the default splits are sized for (split_query_len; 0: the grid's), as the step graphs pass it",
    )
    ap.add_argument(
        "--tiles",
        default="64x32,64x64,64x128,128x32,128x64,128x128",
        help="BLOCK_M x BLOCK_N pairs, each at 4 and 8 warps",
    )
    ap.add_argument("--tile-splits", default="4,8,16", help="split counts tried with each tile")
    ap.add_argument(
        "--stages", default="3,5", help="num_stages tried with each tile (the launcher's: 5, or 3 for wide rows)"
    )
    ap.add_argument("--layers", type=int, default=30, help="distinct KV caches the 30 timed launches cycle through")
    ap.add_argument("--json", default="bench/results/probe_prefill_splits.json")
    a = ap.parse_args()
    nh, nkv, hd = SHAPES[a.shape]
    dev, bs = torch.device("cuda"), 16
    gen = torch.Generator(device=dev).manual_seed(0)
    blocks = -(-a.context // bs)
    caches = [
        tuple(torch.randn(blocks + 8, bs, nkv, hd, device=dev, dtype=torch.bfloat16, generator=gen) for _ in "kv")
        for _ in range(max(1, a.layers))
    ]
    q = torch.randn(a.pad, nh, hd, device=dev, dtype=torch.bfloat16, generator=gen)
    tables = torch.randperm(blocks + 8, device=dev, generator=gen)[:blocks].to(torch.int32).view(1, -1)
    starts, lens = (torch.tensor([x], device=dev, dtype=torch.int32) for x in (a.decodes, a.chunk))
    seq_lens = torch.tensor([a.context], device=dev, dtype=torch.int32)
    max_query_len = a.chunk if a.grid == "chunk" else a.pad
    rows = slice(a.decodes, a.decodes + a.chunk)
    default_blocks = paged_prefill._default_blocks

    def run(out: torch.Tensor, spec: dict[str, Any], layer: int = 0) -> None:
        k, v = caches[layer % len(caches)]
        paged_prefill.paged_prefill_attention(
            q, k, v, tables, starts, lens, seq_lens, max_query_len, hd**-0.5, out=out,
            block_m=spec.get("block_m"), block_n=spec.get("block_n"), splits=spec.get("splits"),
            split_query_len=a.split_tokens or None,
        )  # fmt: skip

    def timed(spec: dict[str, Any]) -> dict[str, Any]:
        warps, stages = spec.get("warps"), spec.get("stages", 3)
        if warps is not None:  # the launcher takes tiles and splits; warps and stages come with its default blocks
            paged_prefill._default_blocks = lambda *args: (*default_blocks(*args)[:2], warps, stages)
        try:
            out = torch.zeros_like(q)
            run(out, spec)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for layer in range(30):
                    run(out, spec, layer)
            graph.replay()
            times = []
            for _ in range(7):
                e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
                e0.record()
                graph.replay()
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1) * 1000.0 / 30)
            return spec | {"us": round(sorted(times)[3], 2), "out": out[rows].float()}
        finally:
            paged_prefill._default_blocks = default_blocks

    specs: list[dict[str, Any]] = [{}]
    specs += [{"splits": s} for s in map(int, a.splits.split(","))]
    for tile in a.tiles.split(","):
        bm, bn = map(int, tile.split("x"))
        specs += [
            {"block_m": bm, "block_n": bn, "splits": s, "warps": w, "stages": st}
            for w in (4, 8)
            for st in map(int, a.stages.split(","))
            for s in map(int, a.tile_splits.split(","))
        ]
    results = [timed(spec) for spec in specs]
    out = torch.zeros_like(q)  # made once: a fill kernel in the profiled launches would count as theirs
    kernels = kernel_times(lambda layer: run(out, {}, layer))
    ref = results[0]["out"]
    for r in results:
        r["max_abs_diff"] = (r.pop("out") - ref).abs().max().item()
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(),
        "args": vars(a),
        "default_us": results[0]["us"],
        "default_kernels_us": kernels,
        "fastest": sorted(results, key=lambda r: r["us"])[:8],
        "all": results,
    }
    for r in report["fastest"]:
        print(r)
    print("default", results[0]["us"], "us; its kernels (us a launch, profiler):", kernels)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2))


def kernel_times(launch: Callable[[int], None], launches: int = 30) -> dict[str, float]:
    """Device time a launch of each kernel ``launch(layer)`` runs (the attention kernel and the merge apart), from the profiler."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    launch(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for layer in range(launches):
            launch(layer)
        torch.cuda.synchronize()
    return {
        e.key: round(e.device_time_total / e.count, 2)
        for e in prof.key_averages()
        if e.device_type == DeviceType.CUDA and e.count >= launches
    }


if __name__ == "__main__":
    main()
