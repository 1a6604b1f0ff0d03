"""GPU probe: the int4 half2 GEMV with its loads run ahead through shared memory (``Config.stages``).

Each batch-1 GEMV of the 8B shape takes ~12 us a program for down's 7 steps (``probe_handoff``'s
timeline, 2026-11-28): a program keeps one weight tile in flight in registers, so a multiprocessor's
4 programs have ~32 KB in flight, ~19 GB/s at the loaded latency. ``Config.stages`` lets Triton's
software pipeline keep ``stages - 1`` steps of weights, scales and x in flight in shared memory
(``cp.async``) instead, without the registers. Per shape: the default config, then its tile with
stages 2-6 and a few wider tiles, each timed alone over the 32 layers' weights in one CUDA graph
(us a launch); then the decode step with each shape's fastest pinned against the defaults,
alternated. Writes JSON.

    python -m bench.probe_int4_stages --json $OUT/probe_int4_stages.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from functools import partial

import torch

from bench.engine_gpu import SHAPES, _run_all, decode_rate, graph_time_ms
from bench.gpu_decoder import Decoder, QLinear
from kernels import reference
from kernels._matmul_config import Config, set_config


def variants(default: Config, stages: list[int]) -> list[Config]:
    """The default tile with each stage count (no register prefetch), and 1,024- and 2,048-byte steps over 4 and 8 warps."""
    base = dataclasses.replace(default, prefetch=False, ahead=False)
    out = [dataclasses.replace(base, stages=s) for s in stages]
    for bk in (512, 1024, 2048):
        for warps in (4, 8):
            for s in stages[1:3]:
                cfg = dataclasses.replace(base, block_k=bk, num_warps=warps, stages=s, runs=1)
                if cfg not in out and cfg.block_n * bk <= 32768:
                    out.append(cfg)
    return out


def _error(layer: QLinear, x: torch.Tensor, glu: bool, group: int) -> float:
    """Relative error of one layer's output (its pinned config) against ``kernels.reference``."""
    got = layer(x, glu).float()
    packed, scales, zeros = layer.tensors
    want = reference.int4_matmul(x, packed, scales, zeros, group).float()
    if glu:
        want = reference.silu_and_mul(want.to(x.dtype)).float()
    return float((got - want).norm() / want.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--stages", default="2,3,4,6")
    ap.add_argument("--only", default="", help="comma list of shapes (qkv, o, gate_up, down, lm_head)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    shape = SHAPES["llama3-8b"]
    dec = Decoder(shape, "int4", a.group)
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m bench.probe_int4_stages " + " ".join(f"--{k} {v}" for k, v in vars(a).items() if v),
    }
    alone: dict[str, list[tuple[float, dict[str, object]]]] = {}
    best: dict[tuple[int, int], Config] = {}
    for name, layers, glu in dec.layer_groups():
        if a.only and name not in a.only.split(","):
            continue
        n, k = layers[0].n, layers[0].k
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        run = partial(_run_all, layers, x, glu)
        default = layers[0].default_config(1)
        rows: list[tuple[float, Config]] = []
        for cfg in [default, *variants(default, [int(s) for s in a.stages.split(",")]), default]:
            set_config("int4", 1, n, k, cfg)
            try:
                graph_time_ms(run, 1)  # compiles
                err = _error(layers[0], x, glu, a.group)
                rows.append((graph_time_ms(run, 3) / len(layers) * 1e3, cfg))
            except Exception as e:  # noqa: BLE001 (a tile that does not build or fit: report and go on)
                print(f"  {name} {cfg}: {type(e).__name__}: {str(e)[:120]}")
                continue
            print(f"  {name} {cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.split_k} stages {cfg.stages}"
                  f"{' prefetch' if cfg.prefetch else ''}{' ahead' if cfg.ahead else ''} r{cfg.runs}: {rows[-1][0]:.2f} us, error {err:.2e}", flush=True)  # fmt: skip
        set_config("int4", 1, n, k, None)
        alone[name] = [(us, dataclasses.asdict(c)) for us, c in rows]
        top = min(rows, key=lambda t: t[0])
        if top[1] != default:
            best[(n, k)] = top[1]
    res["alone_us"] = alone
    step: dict[str, list[float]] = {"default": [], "fastest alone": []}
    for _ in range(a.rounds):
        for tag in step:
            for (n, k), cfg in best.items():
                set_config("int4", 1, n, k, cfg if tag != "default" else None)
            step[tag].append(decode_rate(dec, shape, 1, 512, 256)[0])
        print(f"step tok/s: {step}", flush=True)
    res["step_tok_s"] = step
    res["pinned"] = [[n, k, dataclasses.asdict(c)] for (n, k), c in best.items()]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
