# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: ``bench.probe_int4_rows``' persistent kernel with a producer warp and one-warp consumers.

The rows kernel's ncu profile put its largest stall on barriers, and its sm_90 PTX shows why: each
ring stage's TMA copies, mbarrier wait and release each lower to a ``bar.sync`` of the program's 8
warps (7 a stage), so every warp waits for the slowest at every stage, and a stage is only refilled
by the warps that compute. ``bench.probe_int4_ws_kernels._ws_kernel`` splits the program with
``gl.warp_specialize``: a producer partition streams the ring over every GEMV and layer without
waiting for any x, and 8 consumer partitions of one warp each, whose barriers lower to
``bar.warp.sync``. The weights are laid out at load a ring stage a block (``blocked``). Same chain,
tiles, ring stages and arithmetic (``_step``) as the rows kernel.

Times, in one process on the same weights (32 layers of the 8B shape's int4 GEMVs in one CUDA
graph, each GEMV's input the output before it): the library's 128 launches, the rows kernel in one
launch (``--rows-knobs``: with or without its arithmetic, its waits between GEMVs, and its weights
a stage a block), and the warp-specialized kernel over configs ``stages:per_sm:regs`` (ring depth,
programs a multiprocessor, registers a consumer warp; then, each 0 or 1: a consumer fences before
it releases a stage (default 0), reads its next stage before this one's arithmetic (0), does the
arithmetic (1; 0: the ring and its handshakes alone), waits for the GEMV before (1; 0: no
boundaries), and runs the four GEMVs through one call site with their sizes at run time (0; 1: a
quarter of the code)). Each output is checked against ``kernels.reference``, but those without
arithmetic or waits. ``--clocks`` counts each consumer's cycles waiting for x and for ring stages.
Nothing in the engine calls these kernels.

    python -m bench.probe_int4_ws --json $OUT/probe_int4_ws.json
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench.engine_gpu import graph_time_ms
from bench.int4_layer_chain import EPS, KINDS, LayerChain
from bench.probe_int4_chain import check_resident
from bench.probe_int4_mma_kernels import STEP
from bench.probe_int4_rows import ring_descriptors, ring_programs, rows_smem
from bench.probe_int4_rows_kernels import _rows_kernel
from bench.probe_int4_ws_kernels import XPW, _ws_kernel

WARPS = 8
MAXT = 16


def ws_smem(stages: int) -> int:
    """Shared memory a ``_ws_kernel`` program takes: the ring, the consumers' x pairs, the meet's sums, the barriers."""
    ring = stages * (16 * WARPS * int(STEP.value) + 16 * 4 * WARPS * 2)
    return ring + 2 * WARPS * int(XPW.value) * 32 * 8 + 2 * MAXT * 8 * WARPS * 4 + 8 * (2 * stages + 1)


def blocked(chain: LayerChain, rows_order: bool = False) -> tuple[list[Any], list[Any], list[torch.Tensor]]:
    """Each kind's weights, scales and zeros laid out a ring stage a block, and TMA descriptors of a block.

    A stage (layer, tile of 16 rows, K steps ``i WARPS .. i WARPS + WARPS - 1``) is 16 KB of words
    and 1 KB of its scales and zeros (s_lo, s_hi, z_lo, z_hi), each contiguous. For ``_ws_kernel``
    the words are step-major, (WARPS, 16, 32): a consumer's step is one (16, 32) block, and the
    scales (16 rows, WARPS steps x 4). With ``rows_order``, for ``_rows_kernel``'s ``BLOCKED``, the
    boxes it reads otherwise: words (16 rows, WARPS steps, 32) and scales (4, 16 rows, WARPS steps).
    Returns the descriptors and the tensors they point into (to keep alive).
    """
    rank = 3 if rows_order else 2
    lay_w = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=rank)
    lay_s = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=rank)
    w_descs, s_descs, keep = [], [], []
    for name in KINDS:
        n, k = chain.dims[name]
        ns = k // 2 // int(STEP.value)  # steps a row: one group of each half a step
        spt, tiles = ns // WARPS, n // 16
        words = torch.stack([w[0] for w in chain.ws[name]]).view(torch.int32)  # (L, N, ns * 32)
        words = words.view(-1, tiles, 16, spt, WARPS, 32)  # (L, tiles, rows, stages, steps, words)
        sc = torch.stack([w[1] for w in chain.ws[name]])  # (L, N, 2 ns): the low half's groups, then the high's
        zs = torch.stack([w[2] for w in chain.ws[name]])
        sz = torch.stack([sc[..., :ns], sc[..., ns:], zs[..., :ns], zs[..., ns:]], dim=-1)  # (L, N, ns, 4)
        sz = sz.view(-1, tiles, 16, spt, WARPS, 4)  # (L, tiles, rows, stages, steps, 4)
        if rows_order:
            wb = words.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, WARPS, 32)
            szb = sz.permute(0, 1, 3, 5, 2, 4).contiguous().view(-1, 16, WARPS)
            w_box, s_box = [16, WARPS, 32], [4, 16, WARPS]
        else:
            wb = words.permute(0, 1, 3, 4, 2, 5).contiguous().view(-1, 32)
            szb = sz.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, 4 * WARPS)
            w_box, s_box = [16 * WARPS, 32], [16, 4 * WARPS]
        del words
        w_descs.append(TensorDescriptor.from_tensor(wb, w_box, lay_w))
        s_descs.append(TensorDescriptor.from_tensor(szb, s_box, lay_s))
        keep += [wb, szb]
    return w_descs, s_descs, keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument(
        "--configs",
        default="10:1:160,10:1:160:0:0:1:0,10:1:160:0:0:0:1,10:1:160:0:0:0:0,10:1:160:0:0:1:1:1,4:2:104",
        help="stages:per_sm:regs[:fence[:ahead[:math[:sync[:loop]]]]], comma-separated",
    )
    ap.add_argument("--rows-stages", type=int, default=4, help="the rows kernel's ring depth (0: not run)")
    ap.add_argument(
        "--rows-knobs",
        default="1:1",
        help="the rows kernel's math:sync[:blocked] variants (each 0 or 1), comma-separated",
    )
    ap.add_argument("--rounds", type=int, default=2, help="alternations of all variants")
    ap.add_argument("--clocks", default="", help="configs stages:per_sm:regs[:fence] to run once counting cycles")
    ap.add_argument("--json", default="bench/results/probe_int4_ws.json")
    args = ap.parse_args()
    layers = args.layers
    chain = LayerChain(layers)
    dims = chain.dims
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
    res.update({"layers": layers, "mb": chain.mb, "streaming_us_at_3tbs": chain.mb / 3.0})
    chain.library()
    res["library_err_max"] = chain.errors(chain.library_outputs(), [0, layers // 2])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shape = {f"N{j}": dims[name][0] for j, name in enumerate(KINDS)} | {f"B{j}": dims[name][1] // 2 for j, name in enumerate(KINDS)}  # fmt: skip
    ys = {name: torch.empty(layers, dims[name][0], device="cuda", dtype=torch.bfloat16) for name in KINDS}
    outs = [ys[name] for name in KINDS]
    cnt = torch.zeros(4 * layers, dtype=torch.int32, device="cuda")
    x0 = chain.x0

    def programs(per_sm: int) -> int:
        return ring_programs(dims, sms, per_sm, MAXT)

    variants: dict[str, Any] = {"library": chain.library}
    unchecked: set[str] = set()  # no arithmetic or no waits: outputs meaningless
    if args.rows_stages:
        descs, sz_descs = ring_descriptors(chain, WARPS)
        stamps = torch.zeros(1, dtype=torch.int64, device="cuda")
        st = args.rows_stages
        check_resident(rows_smem(st, WARPS), 2)

        b_descs, b_sz, _keep_rows = (
            blocked(chain, rows_order=True)
            if any(kn.count(":") == 2 for kn in args.rows_knobs.split(","))
            else ([], [], [])
        )

        def rows(math: bool, sync: bool, block: bool) -> None:
            cnt.zero_()
            ds, ss = (b_descs, [d for d in b_sz for _ in (0, 1)]) if block else (descs, sz_descs)
            _rows_kernel[(programs(2),)](
                *ds, *ss, x0, *outs, cnt, 0, layers, x0, x0, x0, EPS, stamps, 4 * layers,
                **shape, WARPS=WARPS, STAGES=st, SUB=False, PDL=False, MATH=math, SYNC=sync, BLOCKED=block,
                num_warps=WARPS, maxnreg=128,
            )  # fmt: skip

        for knobs in args.rows_knobs.split(","):
            rm, rs, rb = ([bool(int(v)) for v in knobs.split(":")] + [False])[:3]
            name = (
                f"rows {st} stages"
                + (" blocked" if rb else "")
                + ("" if rm and rs else f" math {int(rm)} sync {int(rs)}")
            )
            variants[name] = functools.partial(rows, rm, rs, rb)
            if not (rm and rs):
                unchecked.add(name)
    ws_descs, ws_sz, _keep = blocked(chain)

    clocks = torch.zeros(2 * sms, WARPS, 4, dtype=torch.int64, device="cuda")

    def ws(
        stages: int,
        per_sm: int,
        regs: int,
        fence: bool,
        ahead: bool,
        math: bool = True,
        sync: bool = True,
        loop: bool = False,
        count: bool = False,
    ) -> None:
        cnt.zero_()
        threads = 32 * (4 + WARPS)  # the producer's 4 warps and the consumers
        maxnreg = min(255, 65536 // (threads * per_sm)) // 8 * 8
        _ws_kernel[(programs(per_sm),)](
            *ws_descs, *ws_sz, x0, *outs, cnt, clocks, layers, **shape, CLOCKS=count, MATH=math, SYNC=sync, LOOP=loop,
            WARPS=WARPS, STAGES=stages, SUB=False, REGS=regs, FENCE=fence, AHEAD=ahead, num_warps=4, maxnreg=maxnreg,
        )  # fmt: skip

    for cfg in args.configs.split(","):
        given = [int(v) for v in cfg.split(":")]
        s, p, r, f, a, m, sy, lp = (
            given + [0, 0, 1, 1, 0][len(given) - 3 :]
        )  # defaults: fence, ahead 0; math, sync 1; loop 0
        check_resident(ws_smem(s), p)
        variants[f"ws {cfg}"] = functools.partial(ws, s, p, r, bool(f), bool(a), bool(m), bool(sy), bool(lp))
        if not (m and sy):
            unchecked.add(f"ws {cfg}")

    res["runs"] = {name: {"us": []} for name in variants}
    for name, run in variants.items():  # compile, run once, check
        for y in outs:
            y.zero_()
        run()
        torch.cuda.synchronize()
        if name != "library" and name not in unchecked:
            res["runs"][name]["err_max"] = chain.errors(ys, [0, layers // 2, layers - 1])
            print(f"{name}: max rel err {res['runs'][name]['err_max']:.2e}", flush=True)
    for _ in range(args.rounds):
        for name, run in variants.items():
            us = graph_time_ms(run) * 1e3
            res["runs"][name]["us"].append(us)
            print(f"{name}: {us:.1f} us ({us / layers:.2f} a layer)", flush=True)
    for cfg in args.clocks.split(",") if args.clocks else []:
        s, p, r, f = ([int(v) for v in cfg.split(":")] + [0])[:4]
        clocks.zero_()
        ws(s, p, r, bool(f), False, True, True, False, True)
        torch.cuda.synchronize()
        per = clocks[: programs(p)].double()  # (programs, consumers, 4): -, x waits, stage waits, GEMVs
        total = per[..., 3].mean().item()
        res["clocks " + cfg] = {
            "cycles_a_consumer": total,
            "x_wait_share": per[..., 1].mean().item() / total,
            "stage_wait_share": per[..., 2].mean().item() / total,
        }
        print(f"clocks {cfg}: {res['clocks ' + cfg]}", flush=True)
    chain.close(res, args.json)


if __name__ == "__main__":
    main()
