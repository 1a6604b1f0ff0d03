# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: how fast the int4 GEMVs' grids can stream their packed weights with no arithmetic at all.

For each 8B linear shape at batch 1 a Triton kernel reads the packed weight (``K / 2`` bytes a row, as
int32 words) over the GEMV's grid and tile (rows, bytes a step, warps, K split), XORs the words and
stores one word a row: the loads of ``kernels.int4_matmul``'s GEMV without its scales, x,
products or split-K finish. Timed as ``bench.engine_gpu``'s tuning times a GEMV (the 32 layers'
distinct weights in one CUDA graph, so they stream from HBM), with the weights evicted first or
normally, and with or without the next step's tile in flight. The gap between these times and the
GEMV's is what its arithmetic and other loads cost. Prints each case; writes JSON.

    python -m bench.probe_gemv_stream --json $OUT/probe_gemv_stream.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

from bench.engine_gpu import copy_ceiling_gbs, graph_time_ms
from bench.gpu_decoder import LLAMA3_8B


@triton.jit
def _stream_kernel(w_ptr, out_ptr, N, K4, K_SPLIT4, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVICT: tl.constexpr, AHEAD: tl.constexpr):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.program_id(1)
    w32 = w_ptr + rn[:, None] * K4  # (BLOCK_N, 1) row starts, in words
    k_lo = ks * K_SPLIT4
    k_end = tl.minimum(k_lo + K_SPLIT4, K4)
    acc = tl.zeros((BLOCK_N, BLOCK_W), tl.int32)
    if AHEAD:
        rc = k_lo + tl.arange(0, BLOCK_W)
        nxt = tl.load(w32 + rc[None, :], mask=(rc < k_end)[None, :], other=0, eviction_policy=EVICT)
    for k0 in range(k_lo, k_end, BLOCK_W):
        if AHEAD:
            cur = nxt
            rc = k0 + BLOCK_W + tl.arange(0, BLOCK_W)
            nxt = tl.load(w32 + rc[None, :], mask=(rc < k_end)[None, :], other=0, eviction_policy=EVICT)
        else:
            rc = k0 + tl.arange(0, BLOCK_W)
            cur = tl.load(w32 + rc[None, :], mask=(rc < k_end)[None, :], other=0, eviction_policy=EVICT)
        acc ^= cur
    tl.store(out_ptr + ks * N + rn, tl.xor_sum(acc, axis=1))


SHAPES = {name: (n, k) for name, n, k in LLAMA3_8B.linear_dims() if name != "lm_head"}
"""The 8B layers' linears: (output rows, K)."""

TILES = {  # (rows, bytes a step, warps, K split): the GEMV defaults of 2026-11-27 and their neighbours
    "qkv": [(16, 1024, 4, 1), (8, 1024, 2, 1), (16, 512, 4, 2), (32, 512, 4, 1), (8, 512, 1, 1)],
    "o": [(32, 512, 4, 4), (8, 512, 4, 1), (16, 1024, 4, 1), (8, 1024, 2, 1), (16, 512, 2, 2), (16, 2048, 4, 1)],
    "gate_up": [(8, 1024, 2, 1), (16, 1024, 4, 1), (8, 2048, 4, 1), (16, 512, 2, 1), (4, 1024, 1, 1), (32, 512, 4, 1)],
    "down": [(32, 512, 4, 4), (16, 1024, 4, 2), (8, 1024, 2, 1), (16, 2048, 4, 1), (32, 256, 2, 8), (16, 512, 4, 2)],
}


def stream_us(ws: list[torch.Tensor], tile: tuple[int, int, int, int], evict: str, ahead: bool) -> float:
    """Device us a launch of the streaming kernel over each of ``ws`` (``(N, K / 8)`` int32) in turn."""
    bn, bytes_k, warps, split = tile
    n, k4 = ws[0].shape
    bw = bytes_k // 4
    per = -(-k4 // split)
    k_split = -(-per // bw) * bw  # a multiple of the loop step, as the GEMV's launcher rounds it
    splits = -(-k4 // k_split)
    out = torch.empty(splits * n, dtype=torch.int32, device="cuda")

    def run() -> None:
        for w in ws:
            _stream_kernel[(n // bn, splits)](
                w, out, n, k4, k_split, BLOCK_N=bn, BLOCK_W=bw, EVICT=evict, AHEAD=ahead, num_warps=warps
            )

    return graph_time_ms(run, repeats=5) / len(ws) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32, help="distinct weight copies a graph streams")
    ap.add_argument("--json", default="bench/results/probe_gemv_stream.json")
    a = ap.parse_args()
    res: dict[str, object] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
    res["copy_gbs"] = copy_ceiling_gbs()
    rows: list[dict[str, object]] = []
    for name, (n, k) in SHAPES.items():
        hi = 2**31 - 1
        ws = [torch.randint(-hi, hi, (n, k // 8), dtype=torch.int32, device="cuda") for _ in range(a.layers)]
        for tile in TILES[name]:
            for evict in ("evict_first", ""):
                for ahead in (False, True):
                    us = stream_us(ws, tile, evict, ahead)
                    gbs = n * k / 2 / us / 1e3
                    rows.append({"shape": name, "tile": tile, "evict": evict, "ahead": ahead, "us": us, "gbs": gbs})
                    print(f"{name} {tile} {evict or 'normal'} ahead={ahead}: {us:.2f} us, {gbs:.0f} GB/s", flush=True)
        del ws
        torch.cuda.empty_cache()
    res["rows"] = rows
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
