"""GPU probe: the int8 GEMV with exact products against the lane-bias form, on the 8B shapes at batch 1.

``kernels.quant_matmul._int8_gemv_step`` has two forms for the same weight: exact products of the
weight byte (converted with a byte permute and an FADD) with x, or the byte placed in the mantissa
of 1.0 (a byte permute alone) with the bias taken off per accumulator lane after the loop. This
times both over every GEMV config the tuner tries, the two forms back to back per config, over 32
layers' distinct weights in one CUDA graph (so they stream from HBM; the LM head has 2 copies, each
far over L2), and reports each form's best config per shape and its error against fp32.

    python -m bench.probe_int8_lanes --json $OUT/probe_int8_lanes.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

from bench.engine_gpu import candidates, graph_time_ms
from kernels import reference
from kernels._matmul_launch import Config, launch
from kernels.quant_matmul import _int8_kernel

# name: (N, K, copies, gated) of Llama-3-8B at batch 1
SHAPES = {
    "qkv": (6144, 4096, 32, False),
    "o": (4096, 4096, 32, False),
    "gate_up": (28672, 4096, 32, False),
    "down": (4096, 14336, 32, True),
    "lm_head": (128256, 4096, 2, False),
}


def run(ws: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor, cfg: Config, gated: bool, exact: bool) -> None:
    for qw, s in ws:
        n, k = qw.shape
        launch(_int8_kernel, x, n, k, cfg, (qw, s), (x.stride(0), qw.stride(0), 0), gated, G=0, EXACT=exact, ASM=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    results: dict[str, object] = {"device": torch.cuda.get_device_name()}
    for name in args.shapes.split(","):
        n, k, copies, gated = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        ws = [reference.quantize_int8(torch.randn(n, k, generator=g, device="cuda") * 0.02) for _ in range(copies)]
        x = torch.randn(1, 2 * k if gated else k, generator=g, device="cuda").to(torch.bfloat16)
        best: dict[bool, tuple[float, Config]] = {}
        for cfg in candidates("int8", 1, 0):
            if cfg.path != "gemv":
                continue
            for exact in (True, False):
                try:
                    us = graph_time_ms(partial(run, ws, x, cfg, gated, exact), repeats=3) / copies * 1e3
                except Exception:  # noqa: BLE001 (a config the compiler rejects is skipped)
                    continue
                if exact not in best or us < best[exact][0]:
                    best[exact] = (us, cfg)
        xin = reference.silu_and_mul(x.float()) if gated else x.float()
        ref = reference.int8_matmul(xin, *ws[0])
        row: dict[str, object] = {"n": n, "k": k, "gated": gated, "weight_mb": ws[0][0].numel() / 1e6}
        for exact, label in ((True, "exact"), (False, "lanes")):
            us, cfg = best[exact]
            out = launch(_int8_kernel, x, n, k, cfg, ws[0], (x.stride(0), ws[0][0].stride(0), 0), gated, G=0, EXACT=exact, ASM=True)  # fmt: skip
            err = float((out.float() - ref).norm() / ref.norm())
            row[label] = {"us": us, "tbs": n * k / us / 1e6, "config": str(cfg), "rel_err": err}
        ratio = best[False][0] / best[True][0]
        print(f"{name}: exact {best[True][0]:.2f} us, lanes {best[False][0]:.2f} us ({ratio:.3f}); {row}", flush=True)
        results[name] = row
        del ws
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
