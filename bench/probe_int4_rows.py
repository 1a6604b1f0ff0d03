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

Each GEMV's x is the one before's output cut to its K, as in ``bench.probe_int4_layers``
(``LayerChain``), which also gives the library's 128 launches, timed beside it, and the check
against ``kernels.reference``. Two ways to launch: the 32 layers in one launch, or one launch a
layer with programmatic dependent launch, each asking for its first ring stages before its PDL
wait (the form the engine would take, with attention between layers). Plain outputs: no norms,
rotary, attention or SiLU-and-mul. Compiled only (Gluon and PTX); nothing in the engine calls it.

    python -m bench.probe_int4_rows --json $OUT/probe_int4_rows.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import TYPE_CHECKING, Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from bench.engine_gpu import graph_time_ms
from bench.int4_layer_chain import EPS, KINDS, FusedChain, LayerChain
from bench.probe_int4_chain import _spin_until, check_resident
from bench.probe_int4_mma_kernels import STEP, X_SMEM, _pack_pairs, _stamp, _step, _x_cols, _x_pairs

if TYPE_CHECKING:
    from collections.abc import Callable

XP = gl.constexpr(64)
"""x's pair rows in shared memory: the longest K's steps (down's 56), a power of two."""
X_SMEM4 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
"""``X_SMEM`` viewed (stages, 1, warps, 32): a ring stage's x pairs, one step a warp."""


@gluon.jit
def _kind_consts(kind, T0: gl.constexpr, T1: gl.constexpr, T2: gl.constexpr, T3: gl.constexpr,
                 S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr):  # fmt: skip
    """GEMV ``kind``'s tiles and ring stages a tile (the producer's cursor runs over kinds at run time)."""
    tiles = kind * 0 + T3
    stages = kind * 0 + S3
    if kind == 0:
        tiles = tiles * 0 + T0
        stages = stages * 0 + S0
    elif kind == 1:
        tiles = tiles * 0 + T1
        stages = stages * 0 + S1
    elif kind == 2:
        tiles = tiles * 0 + T2
        stages = stages * 0 + S2
    return tiles, stages


@gluon.jit
def _advance(pl, pk, pt, pi, pid, P, T0: gl.constexpr, T1: gl.constexpr, T2: gl.constexpr, T3: gl.constexpr,
             S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr):  # fmt: skip
    """The producer's cursor one ring stage on: the tile's next stage, this program's next tile, or the next GEMV's first.

    Every GEMV has at least as many tiles as there are programs (the launcher checks), so each
    program has a first tile in each.
    """
    tiles, stages = _kind_consts(pk, T0, T1, T2, T3, S0, S1, S2, S3)
    pi += 1
    if pi == stages:
        pi = pi * 0
        pt += P
        if pt >= tiles:
            pt = pt * 0 + pid
            pk += 1
            if pk == 4:
                pk = pk * 0
                pl += 1
    return pl, pk, pt, pi


@gluon.jit
def _rows_of(kind, N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr):
    """GEMV ``kind``'s rows a layer (its stacked weights' rows a layer), or any other per-kind value."""
    n = kind * 0 + N3
    if kind == 0:
        n = n * 0 + N0
    elif kind == 1:
        n = n * 0 + N1
    elif kind == 2:
        n = n * 0 + N2
    return n


@gluon.jit
def _issue_sz(sd, zd, bar, scs, st, row, g, ns):
    """A stage's scales and zeros by TMA: groups ``g .. g + WARPS`` of the low half and of the high half (``+ ns``)."""
    tma.async_copy_global_to_shared(sd, [row, g], bar, scs.index(4 * st))
    tma.async_copy_global_to_shared(sd, [row, g + ns], bar, scs.index(4 * st + 1))
    tma.async_copy_global_to_shared(zd, [row, g], bar, scs.index(4 * st + 2))
    tma.async_copy_global_to_shared(zd, [row, g + ns], bar, scs.index(4 * st + 3))


@gluon.jit
def _issue(d0, d1, d2, d3, sds, bars, bufs, scs, t, kind, row, stage, ns, WARPS: gl.constexpr, STAGES: gl.constexpr):
    """Ask TMA for ring stage ``stage`` of the tile at ``row`` of ``kind``'s stacked weights, its scales and zeros with it.

    The weights are a (16 rows, WARPS steps, 32 words) box; ``sds`` holds each kind's scale and zero
    descriptors (boxes of 16 rows x WARPS groups); ``ns`` is the kind's steps a row.
    """
    st = t % STAGES
    at = [row, stage * WARPS, 0]
    bar = bars.index(st)
    mbarrier.expect(bar, WARPS * 16 * STEP + 4 * 16 * WARPS * 2)
    sd0, zd0, sd1, zd1, sd2, zd2, sd3, zd3 = sds
    g = stage * WARPS
    if kind == 0:
        tma.async_copy_global_to_shared(d0, at, bar, bufs.index(st))
        _issue_sz(sd0, zd0, bar, scs, st, row, g, ns)
    elif kind == 1:
        tma.async_copy_global_to_shared(d1, at, bar, bufs.index(st))
        _issue_sz(sd1, zd1, bar, scs, st, row, g, ns)
    elif kind == 2:
        tma.async_copy_global_to_shared(d2, at, bar, bufs.index(st))
        _issue_sz(sd2, zd2, bar, scs, st, row, g, ns)
    else:
        tma.async_copy_global_to_shared(d3, at, bar, bufs.index(st))
        _issue_sz(sd3, zd3, bar, scs, st, row, g, ns)


@gluon.jit
def _ring_scales(scs, st, L2: gl.constexpr):
    """Stage ``st``'s scales and zeros from the ring, in ``_group_scales``' order, ``(8, WARPS)`` each."""
    return (
        scs.index(4 * st).slice(0, 8).load(L2),
        scs.index(4 * st + 1).slice(0, 8).load(L2),
        scs.index(4 * st).slice(8, 8).load(L2),
        scs.index(4 * st + 1).slice(8, 8).load(L2),
        scs.index(4 * st + 2).slice(0, 8).load(L2),
        scs.index(4 * st + 3).slice(0, 8).load(L2),
        scs.index(4 * st + 2).slice(8, 8).load(L2),
        scs.index(4 * st + 3).slice(8, 8).load(L2),
    )


@gluon.jit
def _h(y_ptr, r_ptr, c, m):
    """``y + r`` at ``c``, rounded to bf16 as ``reference.rms_norm_residual`` rounds the residual, as fp32."""
    y = gl.load(y_ptr + c, mask=m, other=0.0).to(gl.float32)
    return (y + gl.load(r_ptr + c, mask=m, other=0.0).to(gl.float32)).to(gl.bfloat16).to(gl.float32)


@gluon.jit
def _w(w_ptr, c, m):
    """The norm weight at ``c``, as fp32."""
    return gl.load(w_ptr + c, mask=m, other=0.0).to(gl.float32)


@gluon.jit
def _normed(h, w, rstd):
    """``weight * rmsnorm(h)``, each product rounded as ``reference.rms_norm_residual`` rounds it."""
    return (w * (h * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)


@gluon.jit
def _x_normed(y_ptr, r_in, r_out, w_ptr, eps, K2, NSTEP: gl.constexpr, NSTEP_P: gl.constexpr, WARPS: gl.constexpr):
    """x's pairs of ``rms_norm_residual(y, r_in, w)``: every program makes the whole norm; program 0 writes ``h`` to ``r_out``.

    The weight's loads go first, so that they are in flight with ``y``'s and ``r_in``'s, not after the sum.
    """
    c, m = _x_cols(0, K2, NSTEP, NSTEP_P, WARPS)
    w0 = _w(w_ptr, c, m)
    w1 = _w(w_ptr, c + 1, m)
    w2 = _w(w_ptr, c + 2, m)
    w3 = _w(w_ptr, c + 3, m)
    v0 = _w(w_ptr, K2 + c, m)
    v1 = _w(w_ptr, K2 + c + 1, m)
    v2 = _w(w_ptr, K2 + c + 2, m)
    v3 = _w(w_ptr, K2 + c + 3, m)
    h0 = _h(y_ptr, r_in, c, m)
    h1 = _h(y_ptr, r_in, c + 1, m)
    h2 = _h(y_ptr, r_in, c + 2, m)
    h3 = _h(y_ptr, r_in, c + 3, m)
    g0 = _h(y_ptr, r_in, K2 + c, m)
    g1 = _h(y_ptr, r_in, K2 + c + 1, m)
    g2 = _h(y_ptr, r_in, K2 + c + 2, m)
    g3 = _h(y_ptr, r_in, K2 + c + 3, m)
    sq = h0 * h0 + h1 * h1 + h2 * h2 + h3 * h3 + g0 * g0 + g1 * g1 + g2 * g2 + g3 * g3
    rstd = gl.rsqrt(gl.sum(gl.sum(sq, axis=1), axis=0) / (2 * K2) + eps)
    if gl.program_id(0) == 0:
        mo = m & (c >= 0)
        gl.store(r_out + c, h0.to(gl.bfloat16), mask=mo)
        gl.store(r_out + c + 1, h1.to(gl.bfloat16), mask=mo)
        gl.store(r_out + c + 2, h2.to(gl.bfloat16), mask=mo)
        gl.store(r_out + c + 3, h3.to(gl.bfloat16), mask=mo)
        gl.store(r_out + K2 + c, g0.to(gl.bfloat16), mask=mo)
        gl.store(r_out + K2 + c + 1, g1.to(gl.bfloat16), mask=mo)
        gl.store(r_out + K2 + c + 2, g2.to(gl.bfloat16), mask=mo)
        gl.store(r_out + K2 + c + 3, g3.to(gl.bfloat16), mask=mo)
    return _pack_pairs(
        _normed(h0, w0, rstd), _normed(h1, w1, rstd), _normed(h2, w2, rstd), _normed(h3, w3, rstd),
        _normed(g0, v0, rstd), _normed(g1, v1, rstd), _normed(g2, v2, rstd), _normed(g3, v3, rstd),
    )  # fmt: skip


@gluon.jit
def _unit_at(pl, pk, pt, pi, layer_lo, S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr,
             N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr, KS0: gl.constexpr,
             WARPS: gl.constexpr):  # fmt: skip
    """The producer cursor's weight row, stage of the row and steps a row (qkv's units are ``1 / KS0`` of a tile's K)."""
    ks = pk * 0 + 1
    if pk == 0:
        ks = ks * 0 + KS0
    row = (layer_lo + pl) * _rows_of(pk, N0, N1, N2, N3) + (pt // ks) * 16
    spu = _rows_of(pk, S0, S1, S2, S3)  # stages a unit
    return row, (pt % ks) * spu + pi, spu * ks * WARPS


@gluon.jit
def _x_partials(p_ptr, N, K2, NSTEP: gl.constexpr, NSTEP_P: gl.constexpr, WARPS: gl.constexpr):
    """x's pairs of the sum of two fp32 partials ``p[0], p[1]`` (``N`` apart), rounded to bf16 once as one output would be."""
    c, m = _x_cols(0, K2, NSTEP, NSTEP_P, WARPS)
    return _pack_pairs(
        _sum2(p_ptr, N, c, m), _sum2(p_ptr, N, c + 1, m), _sum2(p_ptr, N, c + 2, m), _sum2(p_ptr, N, c + 3, m),
        _sum2(p_ptr, N, K2 + c, m), _sum2(p_ptr, N, K2 + c + 1, m), _sum2(p_ptr, N, K2 + c + 2, m),
        _sum2(p_ptr, N, K2 + c + 3, m),
    )  # fmt: skip


@gluon.jit
def _sum2(p_ptr, N, c, m):
    """``bf16(p[0][c] + p[1][c])`` as fp32."""
    a = gl.load(p_ptr + c, mask=m, other=0.0)
    return (a + gl.load(p_ptr + N + c, mask=m, other=0.0)).to(gl.bfloat16).to(gl.float32)


@gluon.jit
def _gemv(
    d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
    x_src, y_ptr, cnt_ptr, link, layer, layer_lo, LAYERS,
    wait,  # spin on the GEMV before (not where a PDL wait at the launch's start covered it)
    XIN: gl.constexpr,  # x: 0 x_src, 1 rms_norm_residual(x_src, r_in, w_norm) (h to r_out), 2 x_src + (x_src + r_in)
    r_in, r_out, w_norm, eps,
    N: gl.constexpr, B: gl.constexpr,  # this GEMV's rows and packed bytes a row
    KS: gl.constexpr,  # its K split: a unit is a tile's 1 / KS of K, its output KS fp32 partials (KS, N)
    T0: gl.constexpr, T1: gl.constexpr, T2: gl.constexpr, T3: gl.constexpr,
    S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr,
    N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,
    WARPS: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr, MAXT: gl.constexpr,
    KS0: gl.constexpr = 1,  # qkv's K split (the producer's cursor must know it)
    GLU: gl.constexpr = False,  # write silu_and_mul of the output (gate and up rows a tile's top and bottom), (N / 2,)
    t_ptr=None, TIMES: gl.constexpr = False,  # stamps: the phase's start, spin done, x made, released
):  # fmt: skip
    """One GEMV of one layer: wait for its x, make x's pairs, run this program's tiles; returns the ring's state.

    ``t`` is the consumer's ring sequence number; ``(pl, pk, pt, pi)`` the producer's cursor (layer
    of the launch, kind, tile, stage), ``STAGES`` ahead, which each taken stage moves on by one.
    Each tile's warps' sums go to shared memory and meet once a GEMV (``sums_s``).
    """
    BL: gl.constexpr = gl.BlockedLayout(
        [1, 1, 4], [8, 1, 4], [1, WARPS, 1], [2, 1, 0]
    )  # (8 rows, WARPS steps, 32 words)
    L2: gl.constexpr = gl.SliceLayout(2, BL)
    NS: gl.constexpr = B // STEP  # steps a row
    SPT: gl.constexpr = NS // WARPS // KS  # ring stages a unit
    T: gl.constexpr = KS * N // 16  # units
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    mine = (T - pid + P - 1) // P  # this program's units: pid, pid + P, ...
    ts = t_ptr + link * 4  # TIMES: this program's (links, 4) int64 ns
    if TIMES:
        gl.store(ts, _stamp("mov.u64 $0, %globaltimer;"))
    if wait:
        _spin_until(cnt_ptr + link - 1, P)
    if TIMES:
        gl.store(ts + 1, _stamp("mov.u64 $0, %globaltimer;"))
    if XIN == 1:
        ab, cd = _x_normed(x_src, r_in, r_out, w_norm, eps, B, NS, XP, WARPS)
    elif XIN == 2:
        ab, cd = _x_partials(x_src, r_in, B, NS, XP, WARPS)
    else:
        ab, cd = _x_pairs(x_src, 0, B, NS, XP, WARPS)
    gl.thread_barrier()  # every lane is done with the last GEMV's pairs and sums
    ab_s.store(ab)
    cd_s.store(cd)
    gl.thread_barrier()
    if TIMES:
        gl.store(ts + 2, _stamp("mov.u64 $0, %globaltimer;"))
    ab_v = ab_s._reinterpret(gl.int64, [XP // WARPS, 1, WARPS, 32], X_SMEM4)
    cd_v = cd_s._reinterpret(gl.int64, [XP // WARPS, 1, WARPS, 32], X_SMEM4)
    cols = gl.expand_dims(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(0, BL))), 0), 0)
    pos = cols % 4  # (1, 1, 32)
    acc = gl.zeros([8, WARPS, 32], gl.float32, BL)
    for j in range(mine * SPT):  # this program's (tile, stage) in order
        i = j % SPT
        st = t % STAGES
        mbarrier.wait(bars.index(st), (t // STAGES) & 1)
        wt = bufs.index(st).slice(0, 8).load(BL)
        wb = bufs.index(st).slice(8, 8).load(BL)
        sc = _ring_scales(scs, st, L2)
        gl.thread_barrier()  # every lane has read the stage before it is refilled
        if pl < LAYERS:  # the ring runs on, into the next tiles' weights whatever GEMV or layer they are
            prow, pst, pns = _unit_at(pl, pk, pt, pi, layer_lo, S0, S1, S2, S3, N0, N1, N2, N3, KS0, WARPS)
            _issue(d0, d1, d2, d3, sds, bars, bufs, scs, t + STAGES, pk, prow, pst, pns, WARPS, STAGES)
            pl, pk, pt, pi = _advance(pl, pk, pt, pi, pid, P, T0, T1, T2, T3, S0, S1, S2, S3)
        k = ((pid + (j // SPT) * P) % KS) * SPT + i  # the stage's place in the row
        acc += _step(wt, wb, ab_v.index(k).load(BL), cd_v.index(k).load(BL), sc, SUB, 2)
        t += 1
        if i == SPT - 1:  # the tile's last stage: each warp's K of its top and bottom rows' sums, (8, WARPS) each
            sums_s.index(j // SPT).slice(0, WARPS, dim=1).store(gl.sum(gl.where(pos == 0, acc, 0.0), axis=2) * 0.25)
            sums_s.index(j // SPT).slice(WARPS, WARPS, dim=1).store(gl.sum(gl.where(pos == 1, acc, 0.0), axis=2) * 0.25)  # fmt: skip
            acc = gl.zeros([8, WARPS, 32], gl.float32, BL)
    gl.thread_barrier()  # every lane's sums stored
    SL: gl.constexpr = gl.BlockedLayout([1, 2 * WARPS], [32, 1], [WARPS, 1], [1, 0])  # (MAXT x 8 rows, top | bottom)
    f = gl.arange(0, 8 * MAXT, layout=gl.SliceLayout(1, SL))  # (tile j, row)
    w = gl.expand_dims(gl.arange(0, 2 * WARPS, layout=gl.SliceLayout(0, SL)), 0)
    flat = sums_s._reinterpret(gl.float32, [8 * MAXT, 2 * WARPS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    v = flat.load(SL)
    top = gl.sum(gl.where(w < WARPS, v, 0.0), axis=1)  # the warps' K met
    bot = gl.sum(gl.where(w < WARPS, 0.0, v), axis=1)
    unit = pid + (f // 8) * P
    tile = unit // KS
    if (
        GLU
    ):  # a tile's top rows are gate rows, its bottom rows the same up rows: silu(gate) * up as the library rounds it
        g = top.to(y_ptr.dtype.element_ty).to(gl.float32)
        u = bot.to(y_ptr.dtype.element_ty).to(gl.float32)
        out = (g / (1.0 + gl.exp(-g)) * u).to(y_ptr.dtype.element_ty)
        gl.store(y_ptr + layer * (N // 2) + tile * 8 + f % 8, out, mask=f // 8 < mine)
    else:
        rows = (unit % KS) * N + tile * 16 + f % 8
        gl.store(y_ptr + layer * KS * N + rows, top.to(y_ptr.dtype.element_ty), mask=f // 8 < mine)
        gl.store(y_ptr + layer * KS * N + rows + 8, bot.to(y_ptr.dtype.element_ty), mask=f // 8 < mine)
    gl.thread_barrier()  # every lane's stores of y before the release
    gl.atomic_add(cnt_ptr + link, 1, sem="release")
    if TIMES:
        gl.store(ts + 3, _stamp("mov.u64 $0, %globaltimer;"))
    return t, pl, pk, pt, pi


@gluon.jit
def _rows_kernel(
    d0, d1, d2, d3, sd0, zd0, sd1, zd1, sd2, zd2, sd3, zd3, x_ptr, y0, y1, y2, y3, cnt_ptr, layer_lo, LAYERS,
    res_ptr, wn_ptr, zero_ptr, eps,  # FUSED: the residual stream (2 LAYERS, H); norm weights (2 LAYERS, H); H zeros
    t_ptr, n_links,  # TIMES: (programs, n_links, 4) int64 stamps
    N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,  # rows of qkv, o, gate_up, down
    B0: gl.constexpr, B1: gl.constexpr, B2: gl.constexpr, B3: gl.constexpr,  # their packed bytes a row (K / 2)
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SUB: gl.constexpr,
    PDL: gl.constexpr,  # launched a layer at a time with programmatic dependent launch
    FUSED: gl.constexpr = False,  # the norms and SiLU-and-mul between the GEMVs, as a decode step has them
    TIMES: gl.constexpr = False,  # %globaltimer stamps of every program's every GEMV (_gemv)
    QKV_SPLIT: gl.constexpr = 1,  # 2: qkv's units are half tiles (384 tiles, 768 units), its output 2 fp32 partials
):  # fmt: skip
    """Layers ``layer_lo .. layer_lo + LAYERS - 1`` of (qkv, o, gate_up, down); outputs ``y_k`` (all layers, N_k).

    ``cnt`` (4 x all layers,) zeros before the first launch: GEMV ``4 l + k`` counts the programs
    done with it. Layer 0's qkv reads ``x``, every other GEMV the output before it.
    """
    gl.static_assert(N0 % 16 == 0 and N1 % 16 == 0 and N2 % 16 == 0 and N3 % 16 == 0)
    gl.static_assert(WARPS * 2 >= 16)  # a scale box's row (WARPS bf16) is TMA's 16 bytes at least
    H: gl.constexpr = 2 * B0  # the hidden size: qkv's K
    NS0: gl.constexpr = B0 // STEP
    NS1: gl.constexpr = B1 // STEP
    NS2: gl.constexpr = B2 // STEP
    NS3: gl.constexpr = B3 // STEP
    gl.static_assert(NS0 % WARPS == 0 and NS1 % WARPS == 0 and NS2 % WARPS == 0 and NS3 % WARPS == 0)
    gl.static_assert(NS0 <= XP and NS1 <= XP and NS2 <= XP and NS3 <= XP)
    T0: gl.constexpr = QKV_SPLIT * N0 // 16  # units: a tile's 1 / QKV_SPLIT of K
    T1: gl.constexpr = N1 // 16
    T2: gl.constexpr = N2 // 16
    T3: gl.constexpr = N3 // 16
    S0: gl.constexpr = NS0 // WARPS // QKV_SPLIT  # stages a unit
    S1: gl.constexpr = NS1 // WARPS
    S2: gl.constexpr = NS2 // WARPS
    S3: gl.constexpr = NS3 // WARPS
    pid = gl.program_id(0)
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES, 16, WARPS, 32], d0.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_s = gl.allocate_shared_memory(gl.int64, [XP, 32], X_SMEM)
    cd_s = gl.allocate_shared_memory(gl.int64, [XP, 32], X_SMEM)
    MAXT: gl.constexpr = 16  # tiles a program in a GEMV, at most (gate_up's 1,792 over 132 programs: 14)
    sums_s = gl.allocate_shared_memory(gl.float32, [MAXT, 8, 2 * WARPS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    scs = gl.allocate_shared_memory(sd0.dtype, [4 * STAGES, 16, WARPS], sd0.layout)
    sds = (sd0, zd0, sd1, zd1, sd2, zd2, sd3, zd3)
    for j in gl.static_range(STAGES):
        mbarrier.init(bars.index(j), count=1)
    # the producer's cursor: layer of this launch, kind, tile, stage; its first STAGES before the PDL wait
    pl = pid * 0
    pk = pid * 0
    pt = pid
    pi = pid * 0
    for j in gl.static_range(STAGES):
        if pl < LAYERS:
            prow, pst, pns = _unit_at(pl, pk, pt, pi, layer_lo, S0, S1, S2, S3, N0, N1, N2, N3, QKV_SPLIT, WARPS)
            _issue(d0, d1, d2, d3, sds, bars, bufs, scs, j, pk, prow, pst, pns, WARPS, STAGES)
            pl, pk, pt, pi = _advance(pl, pk, pt, pi, pid, gl.num_programs(0), T0, T1, T2, T3, S0, S1, S2, S3)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    t = pid * 0
    t_prog = t_ptr + pid * n_links * 4
    for li in range(LAYERS):
        layer = layer_lo + li
        link = 4 * layer
        xq = x_ptr
        if layer > 0:
            xq = y3 + (layer - 1) * N3
        wait_q = li > 0  # the launch's first qkv: its x is the launch before's (the PDL wait), or layer 0's input
        if not PDL:
            wait_q = layer > 0
        later = li >= 0
        # FUSED: qkv's x is the attention norm of down's output plus the residual (layer 0: of x, plus
        # zeros), gate_up's the MLP norm of o's; gate_up writes SiLU-and-mul; program 0 keeps the residual
        XQ: gl.constexpr = 1 if FUSED else 0
        XG: gl.constexpr = 1 if FUSED else 0
        XO: gl.constexpr = 2 if QKV_SPLIT == 2 else 0
        r_prev = res_ptr + (2 * layer - 1) * H
        if FUSED and layer == 0:
            xq = zero_ptr
            r_prev = x_ptr
        r_q = res_ptr + 2 * layer * H
        r_g = r_q + H
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            xq, y0, cnt_ptr, link, layer, layer_lo, LAYERS, wait_q, XQ, r_prev, r_q, wn_ptr + 2 * layer * H, eps,
            N0, B0, QKV_SPLIT, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, QKV_SPLIT, False, t_prog, TIMES,
        )  # fmt: skip
        t, pl, pk, pt, pi = _gemv(  # o: with QKV_SPLIT, its x is the sum of qkv's two partials
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            y0 + layer * QKV_SPLIT * N0, y1, cnt_ptr, link + 1, layer, layer_lo, LAYERS, later, XO, N0, r_q, wn_ptr,
            eps, N1, B1, 1, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, QKV_SPLIT, False, t_prog, TIMES,
        )  # fmt: skip
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            y1 + layer * N1, y2, cnt_ptr, link + 2, layer, layer_lo, LAYERS, later, XG, r_q, r_g,
            wn_ptr + (2 * layer + 1) * H, eps, N2, B2, 1, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, QKV_SPLIT, FUSED, t_prog, TIMES,
        )  # fmt: skip
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            y2 + layer * (N2 // 2 if FUSED else N2), y3, cnt_ptr, link + 3, layer, layer_lo, LAYERS, later, 0, r_g,
            r_g, wn_ptr, eps, N3, B3, 1, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, QKV_SPLIT, False, t_prog, TIMES,
        )  # fmt: skip


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--warps", type=int, default=8, help="warps a program: the steps of K a ring stage")
    ap.add_argument("--stages", default="3,4", help="ring depths to try")
    ap.add_argument("--modes", default="one,layer", help="one launch for all layers, or one a layer with PDL")
    ap.add_argument("--per-sm", type=int, default=2, help="programs a multiprocessor (all must be resident)")
    ap.add_argument("--fused", type=int, default=0, help="1: the norms and SiLU-and-mul between the GEMVs (FusedChain)")
    ap.add_argument("--qkv-split", default="1", help="qkv's K splits to try (2: half tiles, 3 a program)")
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
    programs = min(sms * args.per_sm, min(dims[name][0] // 16 for name in KINDS))  # each a tile in every GEMV
    if max(-(-dims[name][0] // 16 // programs) for name in KINDS) > 16:
        raise ValueError(f"{programs} programs: more than MAXT (16) tiles a program in a GEMV")
    res["programs"] = programs
    lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
    descs = []
    ws = dict(chain.ws)
    if isinstance(chain, FusedChain):  # gate_up's rows as its SiLU-and-mul epilogue takes them
        ws["gate_up"] = chain.ws_glu
    for name in KINDS:  # (rows, steps, 32 words): a ring stage is one (16, WARPS, 32) box
        words = torch.cat([w[0] for w in ws[name]]).view(torch.int32)
        descs.append(TensorDescriptor.from_tensor(words.view(words.shape[0], -1, 32), [16, warps, 32], lay))
    lay_s = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    sz_descs = [
        TensorDescriptor.from_tensor(torch.cat([w[j] for w in ws[name]]), [16, warps], lay_s)
        for name in KINDS
        for j in (1, 2)
    ]
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
    qkv_parts = torch.empty(layers, 2 * dims["qkv"][0], device="cuda", dtype=torch.float32)

    def launch(mode: str, stages: int, split: int, times: bool = False) -> None:
        cnt.zero_()
        meta = dict(shape, WARPS=warps, STAGES=stages, SUB=bool(args.sub), FUSED=bool(args.fused), QKV_SPLIT=split)
        meta |= {"TIMES": times, "num_warps": warps, "maxnreg": maxnreg}
        outs = [qkv_parts if split == 2 else ys["qkv"], *(ys[name] for name in KINDS[1:])]
        for i in range(layers) if mode == "layer" else [0]:
            n, pdl = (1, True) if mode == "layer" else (layers, False)
            _rows_kernel[(programs,)](
                *descs, *sz_descs, chain.x0, *outs, cnt, i, n, *stream, stamps, 4 * layers, PDL=pdl, launch_pdl=pdl,
                **meta,
            )  # fmt: skip

    res["runs"] = {}
    for stages in (int(s) for s in args.stages.split(",")):
        check_resident(
            stages * 16 * warps * (STEP.value + 8) + 2 * XP.value * 32 * 8 + 16 * 16 * warps * 4, args.per_sm
        )
        for split, mode in ((int(v), m) for v in args.qkv_split.split(",") for m in args.modes.split(",")):
            run = functools.partial(launch, mode, stages, split)
            run()
            torch.cuda.synchronize()
            if split == 2:  # qkv's output, as o read it
                ys["qkv"] = qkv_parts.view(layers, 2, -1).sum(1).to(torch.bfloat16)
            check = [0, layers // 2, layers - 1]
            err = chain.fused_errors(ys, chain.res, check) if isinstance(chain, FusedChain) else chain.errors(ys, check)
            us = [graph_time_ms(run) * 1e3 for _ in range(3)]
            res["runs"][f"{mode} {stages} stages qkv split {split}"] = {"err_max": err, "us": us}
            print(f"{mode}, {stages} stages, qkv split {split}: {us} us ({us[-1] / layers:.1f} a layer), max rel err {err:.2e}", flush=True)  # fmt: skip
            if args.times and mode == "one":
                res["runs"][f"{mode} {stages} stages qkv split {split}"]["times"] = timeline(
                    functools.partial(launch, mode, stages, split, True), cnt, stamps
                )
    res["library_us_after"] = [graph_time_ms(chain.library) * 1e3 for _ in range(2)]
    print(f"library again: {res['library_us_after']} ({res['library_us_after'][-1] / layers:.1f} a layer)")
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
