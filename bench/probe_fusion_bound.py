"""GPU probe: how much a batch-1 decode step would gain if its norms or its rotary launches were fused away.

Times ``bench.gpu_decoder``'s step with work left out (``Decoder.skip``): the residual RMSNorms
(65 launches on the 8B shape), the rotary + KV write (32 launches until the qkv GEMV took it as its
epilogue on 2026-11-27; since then its share of that GEMV), or both. Leaving a kernel out bounds
what fusing it into a neighbour can save: the fused neighbour does that work too.
Variants alternate within one process, per weight format, so the ratios compare like with like.

    python -m bench.probe_fusion_bound --json $OUT/probe_fusion_bound.json
    python -m bench.probe_fusion_bound --shape smollm2-135m --group 32 --modes bf16,int8,int4
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from bench.engine_gpu import SHAPES, decode_rate
from bench.gpu_decoder import Decoder

VARIANTS = {"all": frozenset(), "no-norm": frozenset({"norm"}), "no-rope": frozenset({"rope"}), "neither": frozenset({"norm", "rope"})}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama3-8b")
    ap.add_argument("--modes", default="bf16,int8")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    res: dict[str, object] = {"device": torch.cuda.get_device_name(), "shape": args.shape, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    rates: dict[str, dict[str, list[float]]] = {}
    for mode in args.modes.split(","):
        dec = Decoder(shape, mode, args.group)
        rates[mode] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for name, skip in VARIANTS.items():
                dec.skip = skip
                rates[mode][name].append(decode_rate(dec, shape, 1, args.context, args.steps)[0])
        for name in VARIANTS:
            print(f"{mode} {name}: {', '.join(f'{r:.1f}' for r in rates[mode][name])} tok/s", flush=True)
        del dec
        gc.collect()
        torch.cuda.empty_cache()
    res["tok_s"] = rates
    if "bf16" in rates:
        for mode in rates:
            if mode != "bf16":
                for name in VARIANTS:
                    ratio = statistics.median(rates[mode][name]) / statistics.median(rates["bf16"][name])
                    print(f"{mode} / bf16, {name}: {ratio:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
