"""GPU probe: the 8B down projection at batch 1 with SiLU-and-mul fused into its x loads, or run first.

The GEMVs can apply SiLU-and-mul as they load x (``gated``), which saves the activation's launch,
but every program recomputes it (and loads both halves of x) for its own K range; the narrower the
tile, the more programs share each x element. This times, over 32 layers' distinct weights (so
they stream from HBM) in one CUDA graph, the best tuned config of each: gated, and ungated after
``silu_and_mul``'s own kernel, in bf16, int8 and int4.

    python -m bench.probe_gated_down --json $OUT/probe_gated_down.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Literal

import torch

from bench.engine_gpu import candidates, graph_time_ms
from bench.gpu_decoder import QLinear
from kernels import quant_matmul
from kernels.activation import silu_and_mul

N, K, LAYERS = 4096, 14336, 32


def run(ws: list[QLinear], x: torch.Tensor, gated: bool, activation_first: bool) -> None:
    for w in ws:
        w(silu_and_mul(x) if activation_first else x, gated)


def best_us(ws: list[QLinear], kind: Literal["int8", "int4", "dense"], x: torch.Tensor, gated: bool, first: bool) -> tuple[float, str]:  # fmt: skip
    """The fastest GEMV config's us a layer (activation kernel included when ``first``), and the config."""
    best: tuple[float, str] | None = None
    for cfg in candidates(kind, 1, ws[0].group):
        if cfg.path != "gemv":
            continue
        quant_matmul.set_config(kind, 1, N, K, cfg)
        try:
            us = graph_time_ms(partial(run, ws, x, gated, first), repeats=3) / len(ws) * 1e3
        except Exception:  # noqa: BLE001 (a config the compiler rejects is skipped)
            continue
        if best is None or us < best[0]:
            best = (us, str(cfg))
    quant_matmul.set_config(kind, 1, N, K, None)
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="")
    ap.add_argument("--modes", default="int8,int4,bf16")
    args = ap.parse_args()
    results: dict[str, object] = {"device": torch.cuda.get_device_name(), "shape": [N, K], "layers": LAYERS}
    kinds: dict[str, Literal["int8", "int4", "dense"]] = {"int8": "int8", "int4": "int4", "bf16": "dense"}
    x = torch.randn(1, 2 * K, device="cuda", dtype=torch.bfloat16)
    act = graph_time_ms(lambda: [silu_and_mul(x) for _ in range(LAYERS)], repeats=5) / LAYERS * 1e3
    results["silu_and_mul_us"] = act
    print(f"silu_and_mul alone: {act:.2f} us", flush=True)
    for mode in args.modes.split(","):
        g = torch.Generator(device="cuda").manual_seed(0)
        ws = [
            QLinear((torch.randn(N, K, generator=g, device="cuda") * 0.02).to(torch.bfloat16), mode, 128)
            for _ in range(LAYERS)
        ]
        gated = best_us(ws, kinds[mode], x, gated=True, first=False)
        first = best_us(ws, kinds[mode], x, gated=False, first=True)
        results[mode] = {"gated_us": gated[0], "gated_config": gated[1], "activation_first_us": first[0], "first_config": first[1]}  # fmt: skip
        print(
            f"{mode}: gated {gated[0]:.2f} us ({gated[1]}); activation first {first[0]:.2f} us ({first[1]})", flush=True
        )
        del ws
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
