# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: the 8B shape's four int4 GEMVs a layer in one persistent kernel, tiles of 16 rows whose K the warps share.

``bench.probe_int4_layers`` dealt units (``16 WARPS`` rows by a K slice) round-robin and needed
split K, because its warps each took their own rows: o and down have 4,096 rows, 32 such tiles at 8
warps for 132 multiprocessors. It ran 1.26x slower than the launches. Here a tile is 16 rows (one
``mma.sync.m16n8k16``'s A rows) over all of K, and a program's warps share each tile's K: at a
ring stage warp ``w`` takes step ``i WARPS + w`` of the tile's rows. So every GEMV has 256 tiles or
more (qkv 384, o 256, gate_up 1,792, down 256), dealt round-robin to at most 256 programs: no split
K, no partials, and no program more than one tile over the mean.

A ring stage is one TMA box of the weights (16 rows x WARPS steps x 32 words, 16 KB at 8 warps)
and four of the stage's scales and zeros (16 rows x WARPS groups, low and high half), all on one
mbarrier; the ring runs on into the next GEMV's and layer's tiles while the arithmetic waits for
its x (a counter every program raises once a GEMV). Each tile's warps' sums go to shared memory
and meet once a GEMV. Two programs a multiprocessor (8 warps, 128 registers, 111 KB at 4 stages):
all must be resident, so the launcher caps the registers and checks the shared memory.

Each GEMV's x is the one before's output cut to its K (``bench.int4_layer_chain.LayerChain``, which
also gives the library's 128 launches, timed beside it, and the check against ``kernels.reference``). Two ways to launch: the 32 layers in one launch, or one launch a
layer with programmatic dependent launch, each asking for its first ring stages before its PDL
wait (the form the engine would take, with attention between layers). Plain outputs: no norms,
rotary, attention or SiLU-and-mul; ``--fused 1`` puts the norms and SiLU-and-mul in
(``FusedChain``), ``--times 1`` stamps every program's every GEMV. The kernel is
``bench.probe_int4_rows_kernels``, compiled only (Gluon and PTX); nothing in the engine calls it.

    python -m bench.probe_int4_rows --json $OUT/probe_int4_rows.json
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import TYPE_CHECKING, Any

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench.engine_gpu import graph_time_ms
from bench.int4_layer_chain import EPS, KINDS, FusedChain, LayerChain
from bench.probe_int4_chain import check_resident
from bench.probe_int4_mma_kernels import STEP
from bench.probe_int4_rows_kernels import XP, _rows_kernel

if TYPE_CHECKING:
    from collections.abc import Callable


def timeline(launch: Callable[[], object], cnt: torch.Tensor, stamps: torch.Tensor) -> dict[str, dict[str, float]]:
    """One stamped launch (after a warm one), summarized per GEMV kind over layers 1 on, medians, us.

    ``critical``: from the GEMV before's last release to this one's; ``seen``: from that release to
    a program's spin ending; ``x``: making x's pairs; ``work`` / ``work_max``: from there to its release.
    """
    for _ in range(2):
        cnt.zero_()
        launch()
    torch.cuda.synchronize()
    t = stamps.double().cpu() / 1e3  # (programs, links, 4) us
    done = t[:, :, 3].max(dim=0).values  # (links,)
    out: dict[str, dict[str, float]] = {}
    for k, name in enumerate(KINDS):
        links = [link for link in range(4, t.shape[1]) if link % 4 == k]
        rows = {
            "critical": [float(done[link] - done[link - 1]) for link in links],
            "seen": [float((t[:, link, 1] - done[link - 1]).median()) for link in links],
            "x": [float((t[:, link, 2] - t[:, link, 1]).median()) for link in links],
            "work": [float((t[:, link, 3] - t[:, link, 2]).median()) for link in links],
            "work_max": [float((t[:, link, 3] - t[:, link, 2]).max()) for link in links],
        }
        out[name] = {key: sorted(v)[len(v) // 2] for key, v in rows.items()}
        print(f"{name}: " + ", ".join(f"{key} {v:.2f}" for key, v in out[name].items()) + " us (medians over layers)")
    return out


def ring_descriptors(chain: LayerChain, warps: int) -> tuple[list[Any], list[Any]]:
    """TMA descriptors of every kind's stacked weights and of their scales and zeros.

    A ring stage is one box of the weights, (16 rows, ``warps`` steps, 32 words), and four of the
    scales and zeros, (16 rows, ``warps`` groups) of the low and of the high half.
    """
    lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
    descs = []
    ws = dict(chain.ws)
    if isinstance(chain, FusedChain):  # gate_up's rows as its SiLU-and-mul epilogue takes them
        ws["gate_up"] = chain.ws_glu
    for name in KINDS:
        words = torch.cat([w[0] for w in ws[name]]).view(torch.int32)
        descs.append(TensorDescriptor.from_tensor(words.view(words.shape[0], -1, 32), [16, warps, 32], lay))
    lay_s = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    sz_descs = [
        TensorDescriptor.from_tensor(torch.cat([w[j] for w in ws[name]]), [16, warps], lay_s)
        for name in KINDS
        for j in (1, 2)
    ]
    return descs, sz_descs


def ring_programs(dims: dict[str, tuple[int, int]], sms: int, per_sm: int, maxt: int = 16) -> int:
    """Programs of a persistent kernel over the four GEMVs: ``per_sm`` a multiprocessor, each with a tile in every GEMV.

    Raises ``ValueError`` where a program would get more than ``maxt`` (the kernels' ``MAXT``) tiles of a GEMV.
    """
    programs = min(sms * per_sm, min(dims[name][0] // 16 for name in KINDS))
    if max(-(-dims[name][0] // 16 // programs) for name in KINDS) > maxt:
        raise ValueError(f"{programs} programs: more than MAXT ({maxt}) tiles a program in a GEMV")
    return programs


def rows_smem(stages: int, warps: int) -> int:
    """Shared memory a ``_rows_kernel`` program takes: the ring (words, scales, zeros), x's pairs, the sums."""
    return stages * 16 * warps * (int(STEP.value) + 8) + 2 * int(XP.value) * 32 * 8 + 16 * 16 * warps * 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--warps", type=int, default=8, help="warps a program: the steps of K a ring stage")
    ap.add_argument("--stages", default="3,4", help="ring depths to try")
    ap.add_argument("--modes", default="one,layer", help="one launch for all layers, or one a layer with PDL")
    ap.add_argument("--per-sm", type=int, default=2, help="programs a multiprocessor (all must be resident)")
    ap.add_argument("--fused", type=int, default=0, help="1: the norms and SiLU-and-mul between the GEMVs (FusedChain)")
    ap.add_argument(
        "--times", type=int, default=0, help="1: also a run with every program's stamps a GEMV (one launch)"
    )
    ap.add_argument("--sub", type=int, default=0, help="1: q - 8 in fp16; 0: 1024 + q, the offset out in fp32")
    ap.add_argument("--json", default="bench/results/probe_int4_rows.json")
    args = ap.parse_args()
    layers, warps = args.layers, args.warps
    chain = FusedChain(layers) if args.fused else LayerChain(layers)
    dims = chain.dims
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
    res.update({"layers": layers, "mb": chain.mb, "streaming_us_at_3tbs": chain.mb / 3.0, "warps": warps})
    res["fused"] = bool(args.fused)
    chain.library()
    if not isinstance(chain, FusedChain):
        res["library_err_max"] = chain.errors(chain.library_outputs(), [0, layers // 2])
    res["library_us"] = [graph_time_ms(chain.library) * 1e3 for _ in range(3)]
    print(f"{layers} layers, {chain.mb:.0f} MB, {chain.mb / 3.0:.0f} us at 3 TB/s; library {res['library_us']} us")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = ring_programs(dims, sms, args.per_sm)
    res["programs"] = programs
    descs, sz_descs = ring_descriptors(chain, warps)
    ys = {name: torch.empty(layers, dims[name][0], device="cuda", dtype=torch.bfloat16) for name in KINDS}
    if isinstance(chain, FusedChain):  # SiLU-and-mul of gate_up's output
        ys["gate_up"] = torch.empty(layers, dims["down"][1], device="cuda", dtype=torch.bfloat16)
    cnt = torch.zeros(4 * layers, dtype=torch.int32, device="cuda")
    maxnreg = min(255, 65536 // (32 * warps * args.per_sm))  # registers for all programs of a multiprocessor
    if isinstance(chain, FusedChain):
        stream = (chain.res, chain.wn, chain.zeros, EPS)
    else:  # not read
        stream = (chain.x0, chain.x0, chain.x0, EPS)
    stamps = torch.zeros(programs, 4 * layers, 4, dtype=torch.int64, device="cuda")
    shape = {f"N{j}": dims[name][0] for j, name in enumerate(KINDS)} | {f"B{j}": dims[name][1] // 2 for j, name in enumerate(KINDS)}  # fmt: skip

    def launch(mode: str, stages: int, times: bool = False) -> None:
        cnt.zero_()
        meta = dict(shape, WARPS=warps, STAGES=stages, SUB=bool(args.sub), FUSED=bool(args.fused))
        meta |= {"TIMES": times, "num_warps": warps, "maxnreg": maxnreg}
        outs = [ys[name] for name in KINDS]
        for i in range(layers) if mode == "layer" else [0]:
            n, pdl = (1, True) if mode == "layer" else (layers, False)
            _rows_kernel[(programs,)](
                *descs, *sz_descs, chain.x0, *outs, cnt, i, n, *stream, stamps, 4 * layers, PDL=pdl, launch_pdl=pdl,
                **meta,
            )  # fmt: skip

    res["runs"] = {}
    for stages in (int(s) for s in args.stages.split(",")):
        check_resident(rows_smem(stages, warps), args.per_sm)
        for mode in args.modes.split(","):
            run = functools.partial(launch, mode, stages)
            run()
            torch.cuda.synchronize()
            check = [0, layers // 2, layers - 1]
            err = chain.fused_errors(ys, chain.res, check) if isinstance(chain, FusedChain) else chain.errors(ys, check)
            us = [graph_time_ms(run) * 1e3 for _ in range(3)]
            res["runs"][f"{mode} {stages} stages"] = {"err_max": err, "us": us}
            print(f"{mode}, {stages} stages: {us} us ({us[-1] / layers:.1f} a layer), max rel err {err:.2e}", flush=True)  # fmt: skip
            if args.times and mode == "one":
                res["runs"][f"{mode} {stages} stages"]["times"] = timeline(
                    functools.partial(launch, mode, stages, True), cnt, stamps
                )
    chain.close(res, args.json)


if __name__ == "__main__":
    main()
