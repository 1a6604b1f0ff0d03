"""GPU probe: the split-KV prefill merge (``kernels.paged_prefill``) against the per-split loop it replaced.

Times ``_prefill_merge_kernel`` alone (20 launches a CUDA graph, median of 5 replays, no PDL) at
the shapes the engine gives it, for every heads-per-program and warps choice, beside the earlier
kernel, which walked
the splits in a loop (two dependent L2 round trips per split) over one program per row and
sequence slot. Shapes: SmolLM2 (9 heads of 64) and Llama-3-8B (32 of 128) at a prefix hit's
16-row tail with 32 splits, and mixed steps of 256 and 512 rows whose first 128 are decode rows.

    python -m bench.probe_prefill_merge --json $OUT/probe_prefill_merge.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import TYPE_CHECKING

import torch

from bench.engine_gpu import graph_time_ms
from kernels import paged_prefill
from kernels._common import next_pow2, tl, triton

if TYPE_CHECKING:
    from collections.abc import Callable

if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _loop_merge_kernel(  # type: ignore[no-untyped-def]
        part_out_ptr,
        part_lse_ptr,
        out_ptr,
        qstart_ptr,
        qlen_ptr,
        so_n,
        so_h,
        N_ROWS,
        S,
        NH: tl.constexpr,
        HD: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        """The merge before 2026-11-26: one program per (sequence slot, row), a loop over the splits."""
        b = tl.program_id(0)
        t = tl.program_id(1)
        if t < tl.load(qlen_ptr + b):
            row = tl.load(qstart_ptr + b).to(tl.int64) + t
            h = tl.arange(0, BLOCK_H)
            d = tl.arange(0, HD)
            hmask = h < NH
            gmax = tl.full((BLOCK_H,), float("-inf"), tl.float32)
            for s in range(S):
                lse = tl.load(part_lse_ptr + (s * N_ROWS + row) * NH + h, mask=hmask, other=float("-inf"))
                gmax = tl.maximum(gmax, lse)
            gmax = tl.where(gmax == float("-inf"), 0.0, gmax)
            acc = tl.zeros((BLOCK_H, HD), tl.float32)
            wsum = tl.zeros((BLOCK_H,), tl.float32)
            for s in range(S):
                off = (s * N_ROWS + row) * NH + h
                w = tl.exp2(tl.load(part_lse_ptr + off, mask=hmask, other=float("-inf")) - gmax)
                acc += w[:, None] * tl.load(
                    part_out_ptr + off[:, None] * HD + d[None, :], mask=hmask[:, None], other=0.0
                )
                wsum += w
            out = acc / tl.maximum(wsum, 1e-30)[:, None]
            tl.store(
                out_ptr + row * so_n + (h * so_h)[:, None] + d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=hmask[:, None],
            )


def graph_us(fn: Callable[[], object], launches: int = 20) -> float:
    """Device us of one ``fn`` launch: ``launches`` of them in one CUDA graph (``bench.engine_gpu.graph_time_ms``)."""
    return graph_time_ms(lambda: [fn() for _ in range(launches)]) / launches * 1e3


def case(n: int, s: int, nh: int, hd: int, d0: int) -> dict[str, float]:
    """Device us a launch of the loop kernel and of the tiled one per (heads a program, warps).

    ``n`` rows, ``s`` splits, ``nh`` heads of ``hd``; the one sequence's rows start at ``d0`` (decode rows before it).
    """
    part_out = torch.randn(s, n, nh, hd, device="cuda")
    part_lse = torch.randn(s, n, nh, device="cuda")
    out = torch.zeros(n, nh, hd, device="cuda", dtype=torch.bfloat16)
    starts = torch.zeros(8, dtype=torch.int32, device="cuda")  # 8 sequence slots, one used (a step graph's)
    lens = torch.zeros(8, dtype=torch.int32, device="cuda")
    starts[0], lens[0] = d0, n - d0
    common = (part_out, part_lse, out, starts, lens, out.stride(0), out.stride(1), n, s)

    def loop() -> None:
        _loop_merge_kernel[(8, n)](*common, NH=nh, HD=hd, BLOCK_H=next_pow2(nh), num_warps=4)

    def tiled(bh: int, warps: int) -> None:
        grid = (n, -(-nh // bh))
        paged_prefill._prefill_merge_kernel[grid](
            *common, 8, NH=nh, HD=hd, BLOCK_S=next_pow2(s), BLOCK_H=bh, BLOCK_B=8, num_warps=warps
        )

    row = {"loop": graph_us(loop)}
    for bh in (b for b in (1, 2, 4, 8, 16) if b <= next_pow2(nh)):
        for warps in (1, 2, 4):
            row[f"heads{bh}_warps{warps}"] = graph_us(partial(tiled, bh, warps))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    shapes = (
        (16, 32, 9, 64, 0),
        (512, 7, 9, 64, 128),
        (256, 11, 9, 64, 128),
        (16, 32, 32, 128, 0),
        (256, 3, 32, 128, 128),
    )
    for n, s, nh, hd, d0 in shapes:
        row = case(n, s, nh, hd, d0)
        name = f"rows{n}_splits{s}_heads{nh}_hd{hd}"
        results[name] = row
        best = min((k for k in row if k != "loop"), key=row.__getitem__)
        print(f"{name}: loop {row['loop']:.2f} us, best {best} {row[best]:.2f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "us": results}, f, indent=1)


if __name__ == "__main__":
    main()
