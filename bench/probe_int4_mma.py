"""GPU probe: the hand-laid int4 GEMV on the tensor cores (``bench.probe_int4_mma_kernels``) against ``kernels.int4_matmul``.

Times are ``bench.engine_gpu``'s way: the GEMV over the layers' distinct random weights in one CUDA
graph, PDL on, us a launch; the library's default tile beside it, alternated. Every variant's
output is checked against ``kernels.reference``. ``--fit`` times one shape family (K 4,096, N 3,584
to 57,344) to split a GEMV's time into streaming and the rest; ``--side-by-side`` runs two of the
library's GEMV chains on one stream and on two. ``--timeline`` stamps every program
of a layer's four GEMVs (``%globaltimer``) over 32 layers in one graph: when each started, passed
the PDL wait, had x and ended.

    python -m bench.probe_int4_mma --json $OUT/probe_int4_mma.json [--only gate_up,down] [--paths mma,tma,units]
    python -m bench.probe_int4_mma --fit --json $OUT/probe_int4_mma_fit.json
    python -m bench.probe_int4_mma --side-by-side --json $OUT/probe_int4_mma_side_by_side.json
    python -m bench.probe_int4_mma --timeline [--layer qkv:mma:4:4:0:1,...] --json $OUT/probe_int4_mma_timeline.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench.engine_gpu import SHAPES, graph_time_ms
from bench.gpu_decoder import QLinear
from bench.probe_int4_mma_kernels import BYTES_A_STEP, _mma_kernel, _tma_kernel, _units_kernel
from kernels import _common, reference
from kernels.int4_matmul import int4_matmul


class Gemv:
    """One probe kernel with its launch settings; ``__call__`` is ``x (1, K) @ W.T`` like ``int4_matmul``."""

    def __init__(
        self, kernel: str, warps: int, split: int, sub: bool, stages: int = 2, rotate: bool = False, programs: int = 0
    ) -> None:
        self.kernel, self.warps, self.split, self.sub, self.stages = kernel, warps, split, sub, stages
        self.rotate = rotate
        self.programs = programs
        """The units path's grid (persistent programs); ``split`` is then its K slices a tile."""
        self._scratch: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._descs: dict[int, Any] = {}
        self.times: torch.Tensor | None = None
        """Set to an int64 tensor of 5 per program to have the register path stamp its programs (``--timeline``)."""

    def label(self) -> dict[str, object]:
        return {
            "kernel": self.kernel, "warps": self.warps, "split": self.split, "sub": self.sub,
            "stages": self.stages, "rotate": self.rotate, "programs": self.programs,
        }  # fmt: skip

    def __call__(
        self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
    ) -> torch.Tensor:
        n, k2 = packed.shape
        if k2 % BYTES_A_STEP or x.shape != (1, 2 * k2) or scales.shape != (n, 2 * k2 // BYTES_A_STEP):
            raise ValueError(
                f"the probe takes x (1, K), group 128, K a multiple of 256; got {tuple(x.shape)} @ {n} x {2 * k2}"
            )
        steps = k2 // BYTES_A_STEP
        per = -(-steps // self.split)
        nsplit = -(-steps // per)
        tiles = -(-n // (16 * self.warps))
        out = torch.empty((1, n), dtype=x.dtype, device=x.device)
        part, cnt = out, out  # never read without split K
        if nsplit > 1:  # made on the first (uncaptured) call, reused by the graph's replays
            key = (n, nsplit, tiles)
            if key not in self._scratch:
                self._scratch[key] = (
                    torch.empty((nsplit, n), dtype=torch.float32, device=x.device),
                    torch.zeros(tiles, dtype=torch.int32, device=x.device),
                )
            part, cnt = self._scratch[key]
        meta = {
            "K_SPLIT": per * BYTES_A_STEP,
            "NSTEP_P": triton.next_power_of_2(per),
            "WARPS": self.warps,
            "SUB": self.sub,
        }
        args = (x, scales, zeros, out, part, cnt, n, k2, nsplit, scales.stride(0))
        grid = (1, tiles, nsplit)
        stamps = self.times if self.times is not None else out
        if self.kernel == "units":
            if steps % self.split:
                raise ValueError(f"units: {self.split} K slices do not cut {steps} steps evenly")
            _units_kernel[(min(self.programs, tiles * nsplit),)](
                x, packed, scales, zeros, out, part, cnt, n, k2, scales.stride(0), stamps,
                NSTEP=steps, NSTEP_P=triton.next_power_of_2(steps), US=per, WARPS=self.warps, SUB=self.sub,
                TIMES=self.times is not None, num_warps=self.warps, launch_pdl=True,
            )  # fmt: skip
        elif self.kernel == "mma":
            _mma_kernel[grid](
                x, packed, *args[1:], stamps, **meta, ROTATE=self.rotate, TIMES=self.times is not None,
                num_warps=self.warps, launch_pdl=True,
            )  # fmt: skip
        else:
            if packed.data_ptr() not in self._descs:
                lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
                words = packed.view(torch.int32)
                self._descs[packed.data_ptr()] = TensorDescriptor.from_tensor(words, [16 * self.warps, 32], lay)
            desc = self._descs[packed.data_ptr()]
            _tma_kernel[grid](desc, *args, **meta, STAGES=self.stages, num_warps=self.warps, launch_pdl=True)
        return out


PATHS = ("mma", "tma", "units")


def _variants(name: str, paths: tuple[str, ...] = PATHS) -> list[Gemv]:
    """What each 8B shape is tried with, per weight path: splits that give 300-600 programs (``units``: K slices)."""
    splits = {"qkv": (2, 4, 8), "o": (4, 8), "gate_up": (1,), "down": (4, 7, 8), "lm_head": (1,)}[name]
    slices = {"qkv": (2, 4, 8), "o": (4, 8, 16), "gate_up": (1, 2, 4, 8), "down": (4, 7, 8, 14), "lm_head": (1, 2, 4)}
    out = []
    if "mma" in paths:
        out += [Gemv("mma", w, sp, sub, rotate=r) for w in (4, 8) for sp in splits for sub in (True, False) for r in (False, True)]  # fmt: skip
    if "tma" in paths:
        out += [Gemv("tma", w, sp, True, st) for w in (4, 8) for sp in splits for st in (2, 4)]
    if "units" in paths:  # persistent programs: 1 or 2 a multiprocessor at 8 warps, 2 or 4 at 4
        grids = ((8, (132, 264)), (4, (264, 528)))
        out += [Gemv("units", w, sl, True, programs=g) for w, gs in grids for g in gs for sl in slices[name]]
    return out


Weight = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""An int4 weight as ``reference.quantize_int4`` packs it: ``(packed, scales, zeros)``."""


def _weights(n: int, k: int, copies: int) -> list[Weight]:
    out = []
    for _ in range(copies):
        packed, scales, zeros = QLinear(
            (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16), "int4", 128
        ).tensors
        out.append((packed, scales, zeros))
    return out


def _time(fn: Any, ws: list[Weight], x: torch.Tensor) -> float:
    return graph_time_ms(lambda: [fn(x, *w) for w in ws], repeats=3) / len(ws) * 1e3


def _library(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    return int4_matmul(x, packed, scales, zeros, 128)


def shapes(res: dict[str, Any], only: str = "", paths: tuple[str, ...] = PATHS) -> None:
    """Every variant on every 8B shape (or those named in ``only``), then the best beside the library, alternated twice."""
    s = SHAPES["llama3-8b"]
    for name, n, k in s.linear_dims():
        if only and name not in only.split(","):
            continue
        ws = _weights(n, k, 4 if name == "lm_head" else s.layers)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = reference.int4_matmul(x.float(), *ws[0], 128)

        def err(y: torch.Tensor, ref: torch.Tensor = ref) -> float:
            return float((y.float() - ref).norm() / ref.norm())

        row: dict[str, Any] = {"name": name, "n": n, "k": k, "library_err": err(_library(x, *ws[0])), "variants": []}
        for g in _variants(name, paths):
            t = {**g.label(), "err": err(g(x, *ws[0])), "us": _time(g, ws, x)}
            row["variants"].append(t)
            print(name, t, flush=True)
        ok = [(t["us"], i) for i, t in enumerate(row["variants"]) if t["err"] < 1e-2]
        best = _variants(name, paths)[min(ok)[1]]
        row["alternated"] = [{"library": _time(_library, ws, x), "probe": _time(best, ws, x)} for _ in range(2)]
        print(f"== {name} {n} x {k}: best {best.label()}; alternated {row['alternated']}", flush=True)
        res["rows"].append(row)
        del ws
        torch.cuda.empty_cache()


def fit(res: dict[str, Any]) -> None:
    """K 4,096, N 3,584 to 57,344: time against bytes, PDL on and off, the library and the register path."""
    probe = Gemv("mma", 8, 1, True)
    for n in (3584, 7168, 14336, 28672, 57344):
        ws = _weights(n, 4096, 32 if n <= 28672 else 16)
        x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
        row: dict[str, Any] = {"n": n, "mb": sum(t.numel() * t.element_size() for t in ws[0]) / 1e6}
        for _ in range(2):
            for pdl in (True, False):
                _common.set_pdl(pdl)  # the library's launches; the probe's always use PDL
                row.setdefault(f"library_pdl_{pdl}", []).append(_time(_library, ws, x))
            _common.set_pdl(True)
            row.setdefault("probe", []).append(_time(probe, ws, x))
        print(row, flush=True)
        res["rows"].append(row)
        del ws
        torch.cuda.empty_cache()


Link = tuple[str, str, int, int, bool, bool]
"""One GEMV of the timeline's chain: shape name, kernel, warps, split, sub, rotate."""

LAYER: tuple[Link, ...] = (
    ("qkv", "mma", 4, 4, False, False),
    ("o", "mma", 8, 4, False, False),
    ("gate_up", "mma", 8, 1, True, False),
    ("down", "mma", 4, 8, True, False),
)
"""The timeline's chain, one layer's GEMVs in order, each at the register path's best tile (``shapes``)."""


def timeline(res: dict[str, Any], layer: tuple[Link, ...] = LAYER, layers: int = 32) -> None:
    """One layer's four GEMVs, ``layers`` times over distinct weights in one CUDA graph, each program stamped.

    Per launch: when its programs started (before the PDL wait, while the launch before ran), passed
    the wait, had x in shared memory and ended, against the end of the launch before; medians per
    GEMV over the layers. All times in us.
    """
    dims = {name: (n, k) for name, n, k in SHAPES["llama3-8b"].linear_dims()}
    links = []
    for name, kernel, warps, split, sub, rotate in layer:
        n, k = dims[name]
        steps = k // 2 // BYTES_A_STEP
        programs = -(-n // (16 * warps)) * -(-steps // -(-steps // split))
        links.append((name, Gemv(kernel, warps, split, sub, rotate=rotate), _weights(n, k, layers), k, programs))
    chain = []  # layer by layer, in the step's order
    for i in range(layers):
        for name, g, ws, k, programs in links:
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            chain.append((name, g, ws[i], x, torch.zeros(programs, 5, dtype=torch.int64, device="cuda")))

    def run() -> None:
        for _, g, w, x, t in chain:
            g.times = t
            g(x, *w)

    lib = graph_time_ms(lambda: [_library(x, *w) for _, _, w, x, _ in chain], repeats=3)
    ms = graph_time_ms(run, repeats=3)  # the last replay's stamps stay in the buffers
    res["library_per_layer_us"] = lib * 1e3 / layers
    res["per_layer_us"] = ms * 1e3 / layers
    prev_end = None
    per: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in layer}
    res["layer"] = [list(c) for c in layer]
    res["middle_layer_stamps"] = {}  # every program's stamps, ns from the layer's first start
    mid = chain[len(layer) * (layers // 2) : len(layer) * (layers // 2 + 1)]
    t0 = min(int(t[:, 0].min()) for *_, t in mid)
    for name, *_, t in mid:
        rows = t.cpu().tolist()
        res["middle_layer_stamps"][name] = [[v - t0 for v in r[:4]] + [r[4]] for r in rows]
    for name, _, _, _, t in chain:
        st = t.cpu().double()
        start, waited, made, end = (st[:, i] for i in range(4))
        row = {
            "programs": len(st),
            "sms": len(set(st[:, 4].long().tolist())),
            "x_made": float((made - waited).median()) / 1e3,
            "body": float(end.median() - waited.min()) / 1e3,
            "tail": float(end.max() - end.median()) / 1e3,
            "first_to_last_wait": float(waited.max() - waited.min()) / 1e3,
        }
        if prev_end is not None:
            row["release"] = float(waited.min() - prev_end) / 1e3
            row["started_early"] = float((start < prev_end).double().mean())
            row["span"] = float(end.max() - prev_end) / 1e3
        prev_end = end.max()
        per[name].append(row)
    res["timeline"] = {
        name: {key: statistics.median(r[key] for r in rows if key in r) for key in rows[-1]}
        for name, rows in per.items()
    }
    print(f"chain: {res['per_layer_us']:.1f} us a layer (the library's kernels: {res['library_per_layer_us']:.1f})")
    for name, med in res["timeline"].items():
        print(name, {k: round(v, 2) for k, v in med.items()}, flush=True)


def side_by_side(res: dict[str, Any], layers: int = 32) -> None:
    """The library's gate_up and down GEMVs, ``layers`` of each: alone, one chain after the other, and the two chains on two streams.

    Each way is one CUDA graph. Whether one chain's weight traffic fills the other's launch edges
    (the wait, x, the last programs) is what a kernel that streams weights through op boundaries
    would get; the bound is both chains' bytes at the copy ceiling.
    """
    dims = {name: (n, k) for name, n, k in SHAPES["llama3-8b"].linear_dims()}
    chains = {}
    for name in ("gate_up", "down"):
        n, k = dims[name]
        chains[name] = (_weights(n, k, layers), torch.randn(1, k, device="cuda", dtype=torch.bfloat16))
    res["mb"] = {
        name: sum(t.numel() * t.element_size() for w in ws for t in w) / 1e6 for name, (ws, _) in chains.items()
    }

    def run(name: str) -> None:
        ws, x = chains[name]
        for w in ws:
            _library(x, *w)

    def both() -> None:
        main = torch.cuda.current_stream()
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]  # type: ignore[no-untyped-call]
        for s, name in zip(streams, chains, strict=True):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                run(name)
        for s in streams:
            main.wait_stream(s)

    def in_turn() -> None:
        for name in chains:
            run(name)

    ways = {"gate_up": lambda: run("gate_up"), "down": lambda: run("down"), "one_after_other": in_turn, "side_by_side": both}  # fmt: skip
    res["us"] = {way: [graph_time_ms(fn, repeats=5) * 1e3 for _ in range(3)] for way, fn in ways.items()}
    print({way: [round(t, 1) for t in ts] for way, ts in res["us"].items()}, flush=True)
    print(f"both chains' bytes at 3.0 TB/s: {sum(res['mb'].values()) / 3.0:.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="time against bytes instead of the 8B shapes")
    ap.add_argument("--side-by-side", action="store_true", help="two GEMV chains on one stream and on two")
    ap.add_argument("--only", default="", help="the 8B shapes to try, comma-separated (default: all)")
    ap.add_argument("--paths", default=",".join(PATHS), help="the weight paths to try, comma-separated")
    ap.add_argument("--timeline", action="store_true", help="stamp each program of a chain of layers' GEMVs")
    ap.add_argument(
        "--layer", default="", help="the timeline's chain, name:kernel:warps:split:sub:rotate,... (default: LAYER)"
    )
    ap.add_argument("--json", default="bench/results/probe_int4_mma.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "rows": []}
    if args.timeline:
        specs = [c.split(":") for c in args.layer.split(",")] if args.layer else []
        layer = tuple((a, b, int(w), int(sp), sub == "1", rot == "1") for a, b, w, sp, sub, rot in specs) or LAYER
        timeline(res, layer)
    else:
        if args.side_by_side:
            side_by_side(res)
        elif args.fit:
            fit(res)
        else:
            shapes(res, args.only, tuple(args.paths.split(",")))
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
