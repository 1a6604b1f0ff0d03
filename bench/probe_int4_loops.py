"""GPU probe: the int4 GEMV's two inner loops (``kernels.int4_gemv``), fp32 and half2 FMAs, per shape and tile.

For each linear shape of a model at batch 1 it times the GEMV over all the layers' distinct random
weights in one CUDA graph (as ``bench.engine_gpu``'s tuning does), with each loop forced in turn
(``kernels.int4_gemv.HALF2_MIN_BYTES`` set to 0 or past any row), over a set of tiles with and
without the weight prefetch, and checks both loops' outputs against ``kernels.reference``. Prints
each loop's default and best tiles per shape; writes every timing to JSON.

    python -m bench.probe_int4_loops --json $OUT/probe_int4_loops_8b.json
    python -m bench.probe_int4_loops --shape smollm2-135m --group 32 --json $OUT/probe_int4_loops_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from functools import partial
from typing import Any

import torch

from bench.engine_gpu import SHAPES, _run_all, graph_time_ms
from bench.gpu_decoder import QLinear
from kernels import int4_gemv, quant_matmul, reference
from kernels._matmul_config import config_for
from kernels.quant_matmul import Config

LOOPS = {"fp32": 1 << 62, "half2": 0}  # HALF2_MIN_BYTES forcing each loop


def _tiles(small: bool) -> list[tuple[int, int, int]]:
    """(rows, bytes a step, warps) tried: narrower tiles for the short rows of a small model."""
    if small:
        return [(bn, bk, w) for bn in (2, 4, 16) for bk in (128, 512) for w in (1, 4)]
    return [(bn, bk, w) for bn in (8, 16, 32) for bk in (256, 512) for w in (1, 2, 4)] + [(16, 1024, 4), (8, 1024, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--group", type=int, default=128, help="int4 group size")
    ap.add_argument("--json", default="bench/results/probe_int4_loops.json")
    args = ap.parse_args()
    s = SHAPES[args.shape]
    small = s.hidden < 2048
    linears = [(name, n, k, 1 if name == "lm_head" else s.layers, name == "gate_up") for name, n, k in s.linear_dims()]
    torch.manual_seed(0)
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "shape": args.shape,
        "group": args.group,
        "rows": [],
    }
    rows: list[dict[str, object]] = []
    out["rows"] = rows
    min_bytes = int4_gemv.HALF2_MIN_BYTES
    try:
        for name, n, k, layers, glu in linears:
            ws = [
                QLinear((torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16), "int4", args.group)
                for _ in range(layers)
            ]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            packed, scales, zeros = ws[0].tensors
            ref = reference.int4_matmul(x.float(), packed, scales, zeros, args.group)
            if glu:
                gate, up = ref.chunk(2, dim=-1)
                ref = gate / (1 + torch.exp(-gate)) * up
            base = config_for("int4", 1, n, k, k // 2, args.group, x.device)
            splits = sorted({base.split_k, 2 * base.split_k}) if n <= 8192 else [base.split_k]
            cfgs = [base] + [
                Config("gemv", bn, bk, split, num_warps=w, prefetch=pf)
                for bn, bk, w in _tiles(small)
                for split in splits
                for pf in (False, True)
                if bk % args.group == 0
            ]
            row: dict[str, object] = {"name": name, "n": n, "k": k}
            for loop, bound in LOOPS.items():
                int4_gemv.HALF2_MIN_BYTES = bound
                quant_matmul.set_config("int4", 1, n, k, None)
                row[f"{loop}_rel_err"] = float((ws[0](x, glu).float() - ref).norm() / ref.norm())
                times: list[dict[str, Any]] = []
                run = partial(_run_all, ws, x, glu)
                for cfg in cfgs:
                    quant_matmul.set_config("int4", 1, n, k, cfg)
                    try:
                        graph_time_ms(run, repeats=1)  # the compile and a first timing, discarded
                        us = graph_time_ms(run, repeats=3) / layers * 1e3
                    except Exception as exc:  # noqa: BLE001 (a tile the compiler rejects is skipped)
                        times.append({"config": asdict(cfg), "error": repr(exc)[:200]})
                        continue
                    times.append({"config": asdict(cfg), "us": us})
                quant_matmul.set_config("int4", 1, n, k, None)
                row[loop] = times
                ok = [t for t in times[1:] if "us" in t]
                best = min(ok, key=lambda t: t["us"])
                c = best["config"]
                default = f"{times[0]['us']:.2f}" if "us" in times[0] else "failed"
                print(
                    f"{name} {n}x{k} {loop}: default {default} us, best {best['us']:.2f} us "
                    f"({c['block_n']} x {c['block_k']}, split {c['split_k']}, {c['num_warps']} warps, "
                    f"prefetch {c['prefetch']}); rel err {row[f'{loop}_rel_err']:.2e}",
                    flush=True,
                )
            rows.append(row)
            ws.clear()
            torch.cuda.empty_cache()
    finally:
        int4_gemv.HALF2_MIN_BYTES = min_bytes
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
