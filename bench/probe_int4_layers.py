# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: the 8B shape's four int4 GEMVs a layer, 32 layers, in one persistent kernel that streams weights through the boundaries.

``bench.probe_int4_chain`` ran one dependent chain of equal GEMVs 1.24x faster as one persistent
kernel than as launches. A layer's GEMVs differ: qkv 6,144 x 4,096, o 4,096 x 4,096, gate_up
28,672 x 4,096 and down 4,096 x 14,336, and qkv, o and down have fewer row tiles than there are
multiprocessors. Here the tiles (``2X`` rows, every step of K) of all 128 GEMVs are numbered in
step order and dealt round-robin to one program a multiprocessor, so every program gets its share of
every layer; each streams its tiles' weights into a TMA ring in shared memory, ``STAGES`` steps ahead
across GEMVs and layers, and only the arithmetic waits: a tile of GEMV ``i`` spins until all tiles
of GEMV ``i - 1`` are counted done. A program with no tile in a GEMV streams the next ones' weights
meanwhile, so a short GEMV's idle multiprocessors are not idle DRAM time.

Plain outputs (no rotary, attention, norms or SiLU-and-mul between them); each GEMV's input is the
one before's output, cut to its K (o takes qkv's first 4,096, down gate_up's first 14,336). Timed
against the library's ``int4_matmul`` launched 128 times with PDL in a CUDA graph on the same
weights and chaining; outputs checked against ``kernels.reference`` on the inputs they got.

    python -m bench.probe_int4_layers --json $OUT/probe_int4_layers.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench.engine_gpu import graph_time_ms
from bench.int4_layer_chain import KINDS, LayerChain
from bench.probe_int4_chain import _spin_until, check_resident
from bench.probe_int4_mma_kernels import STEP, X_SMEM, _group_scales, _pair, _step, _step_view, _wide, _x_pairs


@gluon.jit
def _kind_of(r, T0: gl.constexpr, T1: gl.constexpr, T2: gl.constexpr):
    """A layer's tile ``r`` as ``(kind, tile of that GEMV)``: kinds 0-3 are qkv, o, gate_up, down."""
    kind = r * 0
    start = r * 0
    if r >= T0:
        kind = kind * 0 + 1
        start = start * 0 + T0
    if r >= T0 + T1:
        kind = kind * 0 + 2
        start = start * 0 + T0 + T1
    if r >= T0 + T1 + T2:
        kind = kind * 0 + 3
        start = start * 0 + T0 + T1 + T2
    return kind, r - start


@gluon.jit
def _unit_shape(kind, SP0: gl.constexpr, SP1: gl.constexpr, SP2: gl.constexpr, SP3: gl.constexpr,
                US0: gl.constexpr, US1: gl.constexpr, US2: gl.constexpr, US3: gl.constexpr):  # fmt: skip
    """A kind's K slices a row tile and steps a unit (one slice of one row tile)."""
    sp = kind * 0 + SP3
    us = kind * 0 + US3
    if kind == 0:
        sp = sp * 0 + SP0
        us = us * 0 + US0
    elif kind == 1:
        sp = sp * 0 + SP1
        us = us * 0 + US1
    elif kind == 2:
        sp = sp * 0 + SP2
        us = us * 0 + US2
    return sp, us


@gluon.jit
def _unit_info(g, TL: gl.constexpr, U0: gl.constexpr, U1: gl.constexpr, U2: gl.constexpr,
               SP0: gl.constexpr, SP1: gl.constexpr, SP2: gl.constexpr, SP3: gl.constexpr,
               US0: gl.constexpr, US1: gl.constexpr, US2: gl.constexpr, US3: gl.constexpr,
               N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr, ROWS: gl.constexpr):  # fmt: skip
    """Global unit ``g``'s kind, first weight row in its stacked tensor, first word column and steps: once a unit."""
    layer = g // TL
    kind, unit = _kind_of(g % TL, U0, U1, U2)
    sp, us = _unit_shape(kind, SP0, SP1, SP2, SP3, US0, US1, US2, US3)
    n = kind * 0 + N3
    if kind == 0:
        n = n * 0 + N0
    elif kind == 1:
        n = n * 0 + N1
    elif kind == 2:
        n = n * 0 + N2
    return kind, layer * n + (unit // sp) * ROWS, (unit % sp) * us * 32, us


@gluon.jit
def _issue(d0, d1, d2, d3, bars, bufs, t, kind, row, col, ROWS: gl.constexpr, STAGES: gl.constexpr):
    """Ask TMA for the weight tile at (``row``, ``col``) of ``kind``'s stacked weights into the stage for sequence number ``t``."""
    st = t % STAGES
    mbarrier.expect(bars.index(st), ROWS * STEP)
    if kind == 0:
        tma.async_copy_global_to_shared(d0, [row, col], bars.index(st), bufs.index(st))
    elif kind == 1:
        tma.async_copy_global_to_shared(d1, [row, col], bars.index(st), bufs.index(st))
    elif kind == 2:
        tma.async_copy_global_to_shared(d2, [row, col], bars.index(st), bufs.index(st))
    else:
        tma.async_copy_global_to_shared(d3, [row, col], bars.index(st), bufs.index(st))


@gluon.jit
def _finish_unit(acc, pos, top, bot, yb, part_ptr, arr_ptr, rowtile, slice_, N, SP: gl.constexpr):
    """A unit's row sums: to ``y`` (one slice), or to ``part[slice]`` and, for the last slice to arrive, their sum in K order.

    Returns 1 where this program finished the row tile (wrote ``y``), else 0.
    """
    tsum = gl.sum(gl.where(pos == 0, acc, 0.0), axis=1) * 0.25
    bsum = gl.sum(gl.where(pos == 1, acc, 0.0), axis=1) * 0.25
    done = rowtile * 0
    if SP == 1:
        gl.store(yb + top, tsum.to(yb.dtype.element_ty))
        gl.store(yb + bot, bsum.to(yb.dtype.element_ty))
        done = done + 1
    else:
        gl.store(part_ptr + slice_ * N + top, tsum)
        gl.store(part_ptr + slice_ * N + bot, bsum)
        gl.thread_barrier()
        arrived = gl.atomic_add(arr_ptr + rowtile, 1, sem="acq_rel")
        if arrived == SP - 1:
            rt = gl.zeros_like(tsum)
            rb = gl.zeros_like(bsum)
            for i in gl.static_range(SP):
                rt += gl.load(part_ptr + i * N + top, cache_modifier=".cg")
                rb += gl.load(part_ptr + i * N + bot, cache_modifier=".cg")
            gl.store(yb + top, rt.to(yb.dtype.element_ty))
            gl.store(yb + bot, rb.to(yb.dtype.element_ty))
            gl.atomic_xchg(arr_ptr + rowtile, 0, sem="relaxed")
            done = done + 1
    return done


@gluon.jit
def _emit_pairs(yb, rowtile, ab_ptr, cd_ptr, K2N, ROWS: gl.constexpr, WARPS: gl.constexpr):
    """The next GEMV's x pairs of this row tile's outputs (just written to ``yb``), to ``ab`` or ``cd`` in global memory.

    Rows ``r`` of this GEMV are columns ``r`` of the next one's x (K = 2 ``K2N``; rows past it are
    not): the low half's become ``ab`` words, the high half's ``cd`` words, as ``_x_pairs`` makes them.
    A row tile never straddles the halves (``ROWS`` divides ``K2N``).
    """
    PL: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    c0 = rowtile * ROWS
    col = c0 + 4 * gl.arange(0, ROWS // 4, layout=PL)  # a word's first column
    if c0 < 2 * K2N:
        v0 = gl.load(yb + col).to(gl.float32)
        v1 = gl.load(yb + col + 1).to(gl.float32)
        v2 = gl.load(yb + col + 2).to(gl.float32)
        v3 = gl.load(yb + col + 3).to(gl.float32)
        if c0 < K2N:
            gl.store(ab_ptr + col // 4, _wide(_pair(v0, v2), _pair(v1, v3)))
        else:
            q = 0.0625
            gl.store(cd_ptr + (col - K2N) // 4, _wide(_pair(v0 * q, v2 * q), _pair(v1 * q, v3 * q)))


@gluon.jit
def _layers_kernel(
    d0, d1, d2, d3, s0, z0, s1, z1, s2, z2, s3, z3, x_ptr, y0, y1, y2, y3, p0, p1, p2, p3, a0, a1, a2, a3, cnt_ptr, LAYERS,
    xab, xcd, ab0, cd0, ab1, cd1, ab2, cd2, ab3, cd3,  # x pairs: the first qkv's (xab, xcd), then each GEMV's output's
    N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,  # rows of qkv, o, gate_up, down
    B0: gl.constexpr, B1: gl.constexpr, B2: gl.constexpr, B3: gl.constexpr,  # their packed bytes a row (K / 2)
    SP0: gl.constexpr, SP1: gl.constexpr, SP2: gl.constexpr, SP3: gl.constexpr,  # their K slices (split K)
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SUB: gl.constexpr,
    BY_PRODUCER: gl.constexpr = False,  # x pairs made once by the row tile that finishes an output, not by every program
):  # fmt: skip
    """``LAYERS`` x (qkv, o, gate_up, down); outputs ``y_k`` (LAYERS, N_k); ``cnt`` (4 LAYERS,) zeros at launch.

    A unit is one K slice of a row tile; with ``SP_k`` > 1 its partial goes to ``p_k`` (SP_k, N_k) and
    the last slice of a row tile to arrive (``a_k``, a counter a row tile, zeros) sums them in K order.
    """
    X: gl.constexpr = 8 * WARPS
    ROWS: gl.constexpr = 2 * X
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    T0: gl.constexpr = N0 // ROWS  # row tiles
    T1: gl.constexpr = N1 // ROWS
    T2: gl.constexpr = N2 // ROWS
    T3: gl.constexpr = N3 // ROWS
    U0: gl.constexpr = T0 * SP0  # units
    U1: gl.constexpr = T1 * SP1
    U2: gl.constexpr = T2 * SP2
    U3: gl.constexpr = T3 * SP3
    TL: gl.constexpr = U0 + U1 + U2 + U3  # units a layer
    NS0: gl.constexpr = B0 // STEP
    NS1: gl.constexpr = B1 // STEP
    NS2: gl.constexpr = B2 // STEP
    NS3: gl.constexpr = B3 // STEP
    US0: gl.constexpr = NS0 // SP0  # steps a unit
    US1: gl.constexpr = NS1 // SP1
    US2: gl.constexpr = NS2 // SP2
    US3: gl.constexpr = NS3 // SP3
    gl.static_assert(US0 * SP0 == NS0 and US1 * SP1 == NS1 and US2 * SP2 == NS2 and US3 * SP3 == NS3)
    XP: gl.constexpr = 64  # x's pair rows in shared memory: the longest K's steps, a power of two
    gl.static_assert(NS0 <= XP and NS1 <= XP and NS2 <= XP and NS3 <= XP)
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    G = LAYERS * TL
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS, 32], d0.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_s = gl.allocate_shared_memory(gl.int64, [XP, 32], X_SMEM)
    cd_s = gl.allocate_shared_memory(gl.int64, [XP, 32], X_SMEM)
    ab_v = _step_view(ab_s, XP)
    cd_v = _step_view(cd_s, XP)
    for j in gl.static_range(STAGES):
        mbarrier.init(bars.index(j), count=1)
    # the producer's cursor: unit pg (its kind, row, first column and steps), step ps
    pg = pid
    ps = pid * 0
    pk, prow, pcol, pus = _unit_info(pg, TL, U0, U1, U2, SP0, SP1, SP2, SP3, US0, US1, US2, US3, N0, N1, N2, N3, ROWS)  # fmt: skip
    for j in gl.static_range(STAGES):
        if pg < G:
            _issue(d0, d1, d2, d3, bars, bufs, j, pk, prow, pcol + ps * 32, ROWS, STAGES)
            ps += 1
            if ps == pus:
                pg += P
                ps = ps * 0
                pk, prow, pcol, pus = _unit_info(pg, TL, U0, U1, U2, SP0, SP1, SP2, SP3, US0, US1, US2, US3, N0, N1, N2, N3, ROWS)  # fmt: skip
    t = pid * 0  # this program's step sequence number (its ring position)
    last = pid * 0 - 1
    d = gl.arange(0, X, layout=gl.SliceLayout(1, BL))
    cols = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, BL)), 0)
    pos = cols % 4
    for g in range(pid, G, P):
        layer = g // TL
        kind, unit = _kind_of(g % TL, U0, U1, U2)
        link = layer * 4 + kind
        if link != last:  # a new GEMV: wait for the one before, then its output is this one's x
            if link > 0:
                before = T3
                if kind == 1:
                    before = before * 0 + T0
                elif kind == 2:
                    before = before * 0 + T1
                elif kind == 3:
                    before = before * 0 + T2
                _spin_until(cnt_ptr + link - 1, before)
            if not BY_PRODUCER:  # every program makes the pairs of the whole x
                gl.thread_barrier()  # every lane is done with the last GEMV's pairs
                if kind == 0:
                    xp = x_ptr
                    if layer > 0:
                        xp = y3 + (layer - 1) * N3
                    ab0_, cd0_ = _x_pairs(xp, 0, B0, NS0, NS0, WARPS)
                    ab_s.slice(0, NS0).store(ab0_)
                    cd_s.slice(0, NS0).store(cd0_)
                elif kind == 1:
                    ab1_, cd1_ = _x_pairs(y0 + layer * N0, 0, B1, NS1, NS1, WARPS)
                    ab_s.slice(0, NS1).store(ab1_)
                    cd_s.slice(0, NS1).store(cd1_)
                elif kind == 2:
                    ab2_, cd2_ = _x_pairs(y1 + layer * N1, 0, B2, NS2, NS2, WARPS)
                    ab_s.slice(0, NS2).store(ab2_)
                    cd_s.slice(0, NS2).store(cd2_)
                else:
                    ab3_, cd3_ = _x_pairs(y2 + layer * N2, 0, B3, NS3, XP, WARPS)
                    ab_s.store(ab3_)
                    cd_s.store(cd3_)
                gl.thread_barrier()
            last = link
        # where this GEMV's x pairs are (BY_PRODUCER): written by the GEMV before's finishing row tiles
        xa = ab3
        xc = cd3
        if kind == 0 and layer == 0:
            xa = xab
            xc = xcd
        elif kind == 1:
            xa = ab0
            xc = cd0
        elif kind == 2:
            xa = ab1
            xc = cd1
        elif kind == 3:
            xa = ab2
            xc = cd2
        # this GEMV's scales, output, and this unit's row tile and K slice
        sb = s3 + layer * N3 * (2 * NS3)
        zb = z3 + layer * N3 * (2 * NS3)
        yb = y3 + layer * N3
        ns = kind * 0 + NS3
        sp, us = _unit_shape(kind, SP0, SP1, SP2, SP3, US0, US1, US2, US3)
        if kind == 0:
            sb = s0 + layer * N0 * (2 * NS0)
            zb = z0 + layer * N0 * (2 * NS0)
            yb = y0 + layer * N0
            ns = ns * 0 + NS0
        elif kind == 1:
            sb = s1 + layer * N1 * (2 * NS1)
            zb = z1 + layer * N1 * (2 * NS1)
            yb = y1 + layer * N1
            ns = ns * 0 + NS1
        elif kind == 2:
            sb = s2 + layer * N2 * (2 * NS2)
            zb = z2 + layer * N2 * (2 * NS2)
            yb = y2 + layer * N2
            ns = ns * 0 + NS2
        rowtile = unit // sp
        slice_ = unit % sp
        s_lo = slice_ * us
        top = rowtile * ROWS + d  # the TMA tile's rows 0..X-1; X..2X-1 below
        bot = top + X
        tmask = top >= 0
        bmask = bot >= 0
        sc = _group_scales(sb, zb, top, bot, 2 * ns, s_lo, ns, tmask, bmask)
        if BY_PRODUCER:
            pxa = gl.load(xa + s_lo * 32 + cols)  # (1, 32) int64: this step's x pairs, a step ahead
            pxc = gl.load(xc + s_lo * 32 + cols)
        acc = gl.zeros([X, 32], gl.float32, BL)
        for s in range(us):
            st = t % STAGES
            mbarrier.wait(bars.index(st), (t // STAGES) & 1)
            wt = bufs.index(st).slice(0, X).load(BL)
            wb = bufs.index(st).slice(X, X).load(BL)
            gl.thread_barrier()  # every lane has read the stage before it is refilled
            if pg < G:  # the ring runs on, into the next units' weights whatever GEMV or layer they are
                _issue(d0, d1, d2, d3, bars, bufs, t + STAGES, pk, prow, pcol + ps * 32, ROWS, STAGES)
                ps += 1
                if ps == pus:
                    pg += P
                    ps = ps * 0
                    pk, prow, pcol, pus = _unit_info(pg, TL, U0, U1, U2, SP0, SP1, SP2, SP3, US0, US1, US2, US3, N0, N1, N2, N3, ROWS)  # fmt: skip
            csc = sc
            more = s + 1 < us
            sc = _group_scales(sb, zb, top, bot, 2 * ns, s_lo + s + 1, ns, tmask & more, bmask & more)
            if BY_PRODUCER:
                cxa, cxc = pxa, pxc
                nxt = (s_lo + s + 1) * 32 + cols
                pxa = gl.load(xa + nxt, mask=more & (cols >= 0), other=0)
                pxc = gl.load(xc + nxt, mask=more & (cols >= 0), other=0)
                acc += _step(wt, wb, cxa, cxc, csc, SUB)
            else:
                acc += _step(wt, wb, ab_v.index(s_lo + s).load(BL), cd_v.index(s_lo + s).load(BL), csc, SUB)
            t += 1
        if kind == 0:
            done = _finish_unit(acc, pos, top, bot, yb, p0, a0, rowtile, slice_, N0, SP0)
        elif kind == 1:
            done = _finish_unit(acc, pos, top, bot, yb, p1, a1, rowtile, slice_, N1, SP1)
        elif kind == 2:
            done = _finish_unit(acc, pos, top, bot, yb, p2, a2, rowtile, slice_, N2, SP2)
        else:
            done = _finish_unit(acc, pos, top, bot, yb, p3, a3, rowtile, slice_, N3, SP3)
        if done > 0:
            gl.thread_barrier()  # every lane's stores of y before the release (and before the pairs read them)
            if BY_PRODUCER:
                if kind == 0:
                    _emit_pairs(yb, rowtile, ab0, cd0, B1, ROWS, WARPS)
                elif kind == 1:
                    _emit_pairs(yb, rowtile, ab1, cd1, B2, ROWS, WARPS)
                elif kind == 2:
                    _emit_pairs(yb, rowtile, ab2, cd2, B3, ROWS, WARPS)
                else:
                    _emit_pairs(yb, rowtile, ab3, cd3, B0, ROWS, WARPS)
                gl.thread_barrier()
            gl.atomic_add(cnt_ptr + link, 1, sem="release")


def _pairs_of(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_x_pairs`` of a (K,) vector on the host: the first qkv's x pairs, as an output's finishing row tiles make the rest."""
    xf = x.float()
    k2 = xf.numel() // 2

    def half(t: torch.Tensor) -> torch.Tensor:
        return t.half().view(torch.int16).to(torch.int64) & 0xFFFF

    def pack(v: torch.Tensor) -> torch.Tensor:  # (words, 4) -> ((v0, v2), (v1, v3)) as one int64 a word
        a = half(v[:, 0]) | (half(v[:, 2]) << 16)
        b = half(v[:, 1]) | (half(v[:, 3]) << 16)
        return a | (b << 32)

    return pack(xf[:k2].view(-1, 4)), pack((xf[k2:] * 0.0625).view(-1, 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", default="8,16")
    ap.add_argument("--per-sm", type=int, default=1, help="programs a multiprocessor (all must be resident)")
    ap.add_argument("--splits", default="2,2,1,8", help="K slices of qkv, o, gate_up, down")
    ap.add_argument("--pairs", default="program", help="who makes x's pairs: every program, or the finishing row tiles")
    ap.add_argument("--sub", type=int, default=0, help="1: q - 8 in fp16; 0: 1024 + q, the offset out in fp32")
    ap.add_argument("--json", default="bench/results/probe_int4_layers.json")
    args = ap.parse_args()
    layers = args.layers
    chain = LayerChain(layers)
    dims, ws, x0, mb = chain.dims, chain.ws, chain.x0, chain.mb
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
    res.update(
        {"layers": layers, "mb": mb, "streaming_us_at_3tbs": mb / 3.0, "warps": args.warps, "sub": bool(args.sub)}
    )
    chain.library()
    res["library_err_max"] = chain.errors(chain.library_outputs(), [0, layers // 2])
    res["library_us"] = [graph_time_ms(chain.library) * 1e3 for _ in range(3)]
    print(f"{layers} layers, {mb:.0f} MB, {mb / 3.0:.0f} us at 3 TB/s; library {res['library_us']} us", flush=True)

    rows = 16 * args.warps
    lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    descs = [TensorDescriptor.from_tensor(torch.cat([w[0] for w in ws[name]]).view(torch.int32), [rows, 32], lay) for name in KINDS]  # fmt: skip
    sz = [t for name in KINDS for t in (torch.cat([w[1] for w in ws[name]]), torch.cat([w[2] for w in ws[name]]))]
    ys = {name: torch.empty(layers, dims[name][0], device="cuda", dtype=torch.bfloat16) for name in KINDS}
    cnt = torch.zeros(4 * layers, dtype=torch.int32, device="cuda")
    splits = [int(v) for v in args.splits.split(",")]
    res["splits"] = splits
    parts = [torch.empty(sp, dims[name][0], device="cuda", dtype=torch.float32) for sp, name in zip(splits, KINDS, strict=True)]  # fmt: skip
    arrivals = [torch.zeros(dims[name][0] // rows, device="cuda", dtype=torch.int32) for name in KINDS]
    programs = torch.cuda.get_device_properties(0).multi_processor_count * args.per_sm
    res["persistent"] = {}
    x_ab, x_cd = _pairs_of(x0[0])
    next_k2 = {"qkv": dims["o"][1] // 2, "o": dims["gate_up"][1] // 2, "gate_up": dims["down"][1] // 2, "down": dims["qkv"][1] // 2}  # fmt: skip
    out_pairs = [torch.zeros(next_k2[name] // 4, device="cuda", dtype=torch.int64) for name in KINDS for _ in range(2)]
    for stages in (int(s) for s in args.stages.split(",")):
        check_resident(stages * rows * STEP.value + 2 * 64 * 32 * 8, args.per_sm)  # the ring and x's pairs
        for who in args.pairs.split(","):

            def persistent(stages: int = stages, who: str = who) -> None:
                cnt.zero_()
                _layers_kernel[(programs,)](
                    *descs, *sz, x0, *(ys[name] for name in KINDS), *parts, *arrivals, cnt, layers,
                    x_ab, x_cd, *out_pairs,
                    *(dims[name][0] for name in KINDS), *(dims[name][1] // 2 for name in KINDS), *splits,
                    WARPS=args.warps, STAGES=stages, SUB=bool(args.sub), BY_PRODUCER=who == "producer",
                    num_warps=args.warps,
                )  # fmt: skip

            persistent()
            torch.cuda.synchronize()
            err = chain.errors(ys, [0, layers // 2, layers - 1])
            us = [graph_time_ms(persistent) * 1e3 for _ in range(3)]
            res["persistent"][f"{who}, {stages} stages"] = {"err_max": err, "us": us}
            print(f"persistent, pairs by {who}, {stages} stages: {us} us ({us[-1] / layers:.1f} a layer), max rel err {err:.2e}", flush=True)  # fmt: skip
    chain.close(res, args.json)


if __name__ == "__main__":
    main()
