"""GPU tool: tune the batch-1 GEMV tiles by the decode step's rate, not by each GEMV timed alone.

``bench.engine_gpu``'s tuning times each shape's GEMV alone (the layers' weights in one CUDA graph).
In the step a GEMV also runs its epilogue (rotary and the KV write, SiLU-and-mul) and loads its first
tile while the kernel before it runs, so the fastest tile alone is not always the fastest in the
step (2026-11-27: three int4 tiles faster alone made the 8B step 1.9 % slower). Per shape, in turn
(one pass of coordinate descent): rank the grid of GEMV tiles by time alone, time the whole decode
step (``bench.engine_gpu.decode_rate``) with each of the ``--top`` fastest pinned, the other shapes at
their current choice, and keep the fastest if it beats the current one by more than ``--margin``.
Last, the defaults against the tiles kept, alternated twice. Prints each trial; writes JSON after each shape.
``--tiles`` names the tiles to try in the step instead, with no round alone (a tile slow alone may
still be the fastest in the step), and only for the GEMVs it names.

    python -m bench.tune_step --mode int4 --json $OUT/tune_step_int4.json
    python -m bench.tune_step --mode int4 --tiles 'down=16x1024w8pau2,16x512w4s2pau2;o=16x2048w8p' --json $OUT/t.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import asdict
from functools import partial

import torch

from bench.engine_gpu import SHAPES, _run_all, decode_rate, graph_time_ms
from bench.gpu_decoder import KERNEL_KIND, Decoder, Shape
from bench.probe_int4_xpack import Tile, tile_specs
from kernels import int4_gemv, quant_matmul
from kernels._matmul_config import Config


def grid(kind: str, n: int, k_iter: int, group: int) -> list[Config]:
    """GEMV tiles tried (a tile in flight): wide weights get fewer, unsplit ones (their grid fills the GPU).

    int4 rows long enough for the half2 loop keep to the tiles it takes (the others would run the fp32
    loop), each with and without its scales and x a step ahead (``Config.ahead``), with 1, 2 and 4
    runs of a group a thread (``Config.runs``), and for the wide weights each also without the tile
    in flight.
    """
    wide = n > 8192
    half2 = kind == "int4" and k_iter >= int4_gemv.HALF2_MIN_BYTES
    # (prefetch, ahead): a tile in flight, and scales and x a step ahead; wide shapes also without the tile
    loads = [(True, False), (True, True)] if half2 else [(True, False)]
    if half2 and wide:
        loads += [(False, False), (False, True)]
    # the half2 loop's runs of a group a thread (Config.runs): each a whole number of 4-word vectors
    runs_tried = [r for r in (1, 2, 4) if group % (16 * r) == 0] if half2 else [1]
    out = []
    for bn in (8, 16) if wide else (8, 16, 32):
        for bk in (512, 1024, 2048):
            for warps in (2, 4, 8):
                for split in (1,) if wide else (1, 2, 4, 8):
                    for (prefetch, ahead), runs in itertools.product(loads, runs_tried):
                        cfg = Config("gemv", bn, bk, split, num_warps=warps, prefetch=prefetch, ahead=ahead, runs=runs)
                        # tiles over 32 KB hold too many registers a thread to be worth a trial
                        if bk % max(group, 1) or k_iter // split < bk or bn * bk > 32768:
                            continue
                        if not half2 or int4_gemv.takes_half2(cfg, k_iter, 0):
                            out.append(cfg)
    return out


def named_tiles(spec: str) -> dict[str, list[Config]]:
    """``--tiles``: ``"down=16x1024w8pau2,16x512w4s2pau2;o=16x2048w8p"`` -> each GEMV's configs (``Tile`` specs)."""
    configs = {name: [Tile(t).config() for t in specs] for name, specs in tile_specs(spec).items()}
    return {name: [c for c in cs if c is not None] for name, cs in configs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--mode", default="int4", choices=sorted(KERNEL_KIND))
    ap.add_argument("--group", type=int, default=128, help="int4 group size")
    ap.add_argument("--top", type=int, default=5, help="tiles a shape tried in the step")
    ap.add_argument("--margin", type=float, default=0.005, help="gain over the current choice needed to keep a tile")
    ap.add_argument("--steps", type=int, default=128, help="decode steps a trial times")
    ap.add_argument(
        "--tiles", default="", help="NAME=TILE,...;... tried in the step directly (bench.probe_int4_xpack.Tile specs)"
    )
    ap.add_argument("--json", default="bench/results/tune_step.json")
    a = ap.parse_args()
    s: Shape = SHAPES[a.shape]
    kind = KERNEL_KIND[a.mode]
    dec = Decoder(s, a.mode, a.group)

    def rate(steps: int = a.steps) -> float:
        return decode_rate(dec, s, 1, 512, steps)[0]

    log: list[dict[str, object]] = []
    kept: dict[tuple[int, int], Config] = {}
    final: dict[str, list[float]] = {"default": [], "kept": []}

    def write() -> None:
        """The JSON so far: written after every shape, so a run cut short keeps what it measured."""
        out = {
            "device": torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d"),
            "shape": a.shape,
            "mode": a.mode,
            "log": log,
            "final_tok_s": final,
            "kept": [[n, k, asdict(c)] for (n, k), c in kept.items()],
        }
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)

    named = named_tiles(a.tiles)
    print(f"{a.shape} {a.mode}: start {rate():.1f} tok/s", flush=True)
    for name, layers, glu in dec.layer_groups():
        if named and name not in named:
            continue
        n, k = layers[0].n, layers[0].k
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        default = layers[0].default_config(1)
        run = partial(_run_all, layers, x, glu)
        alone: list[tuple[float, Config]] = []
        if not named:
            for cfg in grid(kind, n, layers[0].k_iter, layers[0].scale_group):
                quant_matmul.set_config(kind, 1, n, k, cfg)
                graph_time_ms(run, 1)  # compiles
                alone.append((graph_time_ms(run, 3) / len(layers) * 1e3, cfg))
            alone.sort(key=lambda t: t[0])
        picks = named.get(name) or [c for _, c in alone if c != default][: a.top]
        trials = []
        for cfg in picks:
            quant_matmul.set_config(kind, 1, n, k, cfg)
            if named:
                rate(16)  # compiles (the round alone has compiled the others)
            trials.append((rate(), cfg))
            print(
                f"  {name} {cfg.block_n} x {cfg.block_k} split {cfg.split_k} {cfg.num_warps} warps"
                f"{' ahead' if cfg.ahead else ''}{f' runs {cfg.runs}' if cfg.runs > 1 else ''}: {trials[-1][0]:.1f}"
            )
        quant_matmul.set_config(kind, 1, n, k, kept.get((n, k)))
        current = rate()  # re-timed beside the trials
        best = max(trials, key=lambda t: t[0], default=None)
        keep = best is not None and best[0] > (1 + a.margin) * current
        if keep and best is not None:
            kept[(n, k)] = best[1]
            quant_matmul.set_config(kind, 1, n, k, best[1])
        print(
            f"{name}: current {current:.1f} tok/s; {'kept the best' if keep else 'the current one stays'}", flush=True
        )
        log.append(
            {
                "name": name,
                "default": asdict(default),
                "current_tok_s": current,
                "alone_us": [[us, asdict(c)] for us, c in alone],
                "trials": [[r, asdict(c)] for r, c in trials],
                "kept": keep,
            }
        )
        write()
    for _ in range(2):
        for tag in final:
            for (n, k), cfg in kept.items():
                quant_matmul.set_config(kind, 1, n, k, cfg if tag == "kept" else None)
            final[tag].append(rate(256))
    print(f"defaults {final['default']} tok/s, kept tiles {final['kept']}")
    write()
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
