# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""The kernel of ``bench.probe_int4_rows``: a layer's four int4 GEMVs persistent, 16-row tiles whose K the warps share.

``_rows_kernel`` runs layers of (qkv, o, gate_up, down) in one launch (or one a layer with PDL);
``_gemv`` is one GEMV of it: wait for its x, make x's pairs (plainly, or as a residual RMSNorm),
run the program's tiles from the TMA ring (weights, scales and zeros a stage), meet the warps' sums
once a GEMV and release the GEMV's counter. The producer's cursor (``_advance``, ``_tile_at``,
``_issue``) runs ``STAGES`` ahead of the arithmetic across GEMVs and layers. Compiled only (Gluon
and PTX on Hopper); the runner, the chain it computes and the check are ``bench.probe_int4_rows``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from bench.probe_int4_chain import _spin_until
from bench.probe_int4_mma_kernels import STEP, X_SMEM, _pack_pairs, _stamp, _step, _x_cols, _x_pairs

XP = gl.constexpr(64)
"""x's pair rows in shared memory: the longest K's steps (down's 56), a power of two."""
X_SMEM4 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
"""``X_SMEM`` viewed (stages, 1, warps, 32): a ring stage's x pairs, one step a warp."""


@gluon.jit
def _per_kind(kind, N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr):
    """GEMV ``kind``'s value of four per-kind constants (the producer's cursor runs over kinds at run time)."""
    n = kind * 0 + N3
    if kind == 0:
        n = n * 0 + N0
    elif kind == 1:
        n = n * 0 + N1
    elif kind == 2:
        n = n * 0 + N2
    return n


@gluon.jit
def _advance(pl, pk, pt, pi, pid, P, T0: gl.constexpr, T1: gl.constexpr, T2: gl.constexpr, T3: gl.constexpr,
             S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr):  # fmt: skip
    """The producer's cursor one ring stage on: the tile's next stage, this program's next tile, or the next GEMV's first.

    Every GEMV has at least as many tiles as there are programs (the launcher checks), so each
    program has a first tile in each.
    """
    pi += 1
    if pi == _per_kind(pk, S0, S1, S2, S3):
        pi = pi * 0
        pt += P
        if pt >= _per_kind(pk, T0, T1, T2, T3):
            pt = pt * 0 + pid
            pk += 1
            if pk == 4:
                pk = pk * 0
                pl += 1
    return pl, pk, pt, pi


@gluon.jit
def _issue_sz(sd, zd, bar, scs, st, row, g, ns):
    """A stage's scales and zeros by TMA: groups ``g .. g + WARPS`` of the low half and of the high half (``+ ns``)."""
    tma.async_copy_global_to_shared(sd, [row, g], bar, scs.index(4 * st))
    tma.async_copy_global_to_shared(sd, [row, g + ns], bar, scs.index(4 * st + 1))
    tma.async_copy_global_to_shared(zd, [row, g], bar, scs.index(4 * st + 2))
    tma.async_copy_global_to_shared(zd, [row, g + ns], bar, scs.index(4 * st + 3))


@gluon.jit
def _issue(d0, d1, d2, d3, sds, bars, bufs, scs, t, kind, row, stage, ns, WARPS: gl.constexpr, STAGES: gl.constexpr,
           BLOCKED: gl.constexpr = False):  # fmt: skip
    """Ask TMA for ring stage ``stage`` of the tile at ``row`` of ``kind``'s stacked weights, its scales and zeros with it.

    The weights are a (16 rows, WARPS steps, 32 words) box; ``sds`` holds each kind's scale and zero
    descriptors (boxes of 16 rows x WARPS groups); ``ns`` is the kind's steps a row. ``BLOCKED``: the
    weights laid out a stage a block (``bench.probe_int4_ws.blocked``), the same box at block
    ``row // 16 * ns / WARPS + stage``, and the stage's scales and zeros one (4, 16, WARPS) box of
    ``sds``' scale descriptor into ``scs`` viewed (STAGES, 4, 16, WARPS): two copies a stage, not five.
    """
    st = t % STAGES
    bar = bars.index(st)
    mbarrier.expect(bar, WARPS * 16 * STEP + 4 * 16 * WARPS * 2)
    sd0, zd0, sd1, zd1, sd2, zd2, sd3, zd3 = sds
    if BLOCKED:
        block = row // 16 * (ns // WARPS) + stage
        at = [block * 16, 0, 0]
        if kind == 0:
            tma.async_copy_global_to_shared(d0, at, bar, bufs.index(st))
            tma.async_copy_global_to_shared(sd0, [block * 4, 0, 0], bar, scs.index(st))
        elif kind == 1:
            tma.async_copy_global_to_shared(d1, at, bar, bufs.index(st))
            tma.async_copy_global_to_shared(sd1, [block * 4, 0, 0], bar, scs.index(st))
        elif kind == 2:
            tma.async_copy_global_to_shared(d2, at, bar, bufs.index(st))
            tma.async_copy_global_to_shared(sd2, [block * 4, 0, 0], bar, scs.index(st))
        else:
            tma.async_copy_global_to_shared(d3, at, bar, bufs.index(st))
            tma.async_copy_global_to_shared(sd3, [block * 4, 0, 0], bar, scs.index(st))
    else:
        at = [row, stage * WARPS, 0]
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
def _tile_at(pl, pk, pt, layer_lo, S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr,
             N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """The producer cursor's first weight row (in ``pk``'s stacked weights) and its GEMV's steps a row."""
    return (layer_lo + pl) * _per_kind(pk, N0, N1, N2, N3) + pt * 16, _per_kind(pk, S0, S1, S2, S3) * WARPS


@gluon.jit
def _gemv(
    d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
    x_src, y_ptr, cnt_ptr, link, layer, layer_lo, LAYERS,
    wait,  # spin on the GEMV before (not where a PDL wait at the launch's start covered it)
    XIN: gl.constexpr,  # x is: 0 x_src as it is, 1 rms_norm_residual(x_src, r_in, w_norm) (h to r_out)
    r_in, r_out, w_norm, eps,
    N: gl.constexpr, B: gl.constexpr,  # this GEMV's rows and packed bytes a row
    T0: gl.constexpr, T1: gl.constexpr, T2: gl.constexpr, T3: gl.constexpr,
    S0: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, S3: gl.constexpr,
    N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,
    WARPS: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr, MAXT: gl.constexpr,
    GLU: gl.constexpr = False,  # write silu_and_mul of the output (gate and up rows a tile's top and bottom), (N / 2,)
    t_ptr=None, TIMES: gl.constexpr = False,  # stamps: the phase's start, spin done, x made, released
    MATH: gl.constexpr = True, SYNC: gl.constexpr = True,  # False: skip the arithmetic / the wait (wrong outputs)
    scs_t=None, BLOCKED: gl.constexpr = False,  # BLOCKED: _issue's form, scs_t the scales' TMA view
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
    SPT: gl.constexpr = NS // WARPS  # ring stages a tile
    T: gl.constexpr = N // 16
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    mine = (T - pid + P - 1) // P  # this program's tiles: pid, pid + P, ...
    ts = t_ptr + link * 4  # TIMES: this program's (links, 4) int64 ns
    if TIMES:
        gl.store(ts, _stamp("mov.u64 $0, %globaltimer;"))
    if SYNC and wait:
        _spin_until(cnt_ptr + link - 1, P)
    if TIMES:
        gl.store(ts + 1, _stamp("mov.u64 $0, %globaltimer;"))
    if XIN == 1:
        ab, cd = _x_normed(x_src, r_in, r_out, w_norm, eps, B, NS, XP, WARPS)
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
            prow, pns = _tile_at(pl, pk, pt, layer_lo, S0, S1, S2, S3, N0, N1, N2, N3, WARPS)
            _issue(d0, d1, d2, d3, sds, bars, bufs, scs_t, t + STAGES, pk, prow, pi, pns, WARPS, STAGES, BLOCKED)
            pl, pk, pt, pi = _advance(pl, pk, pt, pi, pid, P, T0, T1, T2, T3, S0, S1, S2, S3)
        if MATH:
            acc += _step(wt, wb, ab_v.index(i).load(BL), cd_v.index(i).load(BL), sc, SUB, 2)
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
    tile = pid + (f // 8) * P
    # GLU: a tile's top rows are gate rows, its bottom rows the same up rows: silu(gate) * up as the library rounds it
    if GLU:
        g = top.to(y_ptr.dtype.element_ty).to(gl.float32)
        u = bot.to(y_ptr.dtype.element_ty).to(gl.float32)
        out = (g / (1.0 + gl.exp(-g)) * u).to(y_ptr.dtype.element_ty)
        gl.store(y_ptr + layer * (N // 2) + tile * 8 + f % 8, out, mask=f // 8 < mine)
    else:
        rows = tile * 16 + f % 8
        gl.store(y_ptr + layer * N + rows, top.to(y_ptr.dtype.element_ty), mask=f // 8 < mine)
        gl.store(y_ptr + layer * N + rows + 8, bot.to(y_ptr.dtype.element_ty), mask=f // 8 < mine)
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
    MATH: gl.constexpr = True,  # False: the ring and its handshakes without the arithmetic (outputs meaningless)
    SYNC: gl.constexpr = True,  # False: no GEMV waits for the one before (outputs meaningless)
    BLOCKED: gl.constexpr = False,  # weights, scales, zeros a stage a block (_issue): measured within 1 % of plain
):  # fmt: skip
    """Layers ``layer_lo .. layer_lo + LAYERS - 1`` of (qkv, o, gate_up, down); outputs ``y_k`` (all layers, N_k).

    ``cnt`` (4 x all layers,) zeros before the first launch: GEMV ``4 l + k`` counts the programs
    done with it. Layer 0's qkv reads ``x``, every other GEMV the output before it; with ``FUSED``
    as ``bench.int4_layer_chain.FusedChain`` says (layer 0's qkv: the norm of ``x`` plus zeros).
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
    T0: gl.constexpr = N0 // 16
    T1: gl.constexpr = N1 // 16
    T2: gl.constexpr = N2 // 16
    T3: gl.constexpr = N3 // 16
    S0: gl.constexpr = NS0 // WARPS
    S1: gl.constexpr = NS1 // WARPS
    S2: gl.constexpr = NS2 // WARPS
    S3: gl.constexpr = NS3 // WARPS
    pid = gl.program_id(0)
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES, 16, WARPS, 32], d0.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_s = gl.allocate_shared_memory(gl.int64, [XP, 32], X_SMEM)
    cd_s = gl.allocate_shared_memory(gl.int64, [XP, 32], X_SMEM)
    MAXT: gl.constexpr = 16  # tiles a program in a GEMV, at most (gate_up's 1,792: 7 over 256 programs, 14 over 128)
    sums_s = gl.allocate_shared_memory(gl.float32, [MAXT, 8, 2 * WARPS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    if BLOCKED:  # TMA fills a stage's (4, 16, WARPS) at once; the warps read (16, WARPS) buffers as before
        scs_t = gl.allocate_shared_memory(sd0.dtype, [STAGES, 4, 16, WARPS], sd0.layout)
        scs = scs_t._reinterpret(sd0.dtype, [4 * STAGES, 16, WARPS], gl.NVMMASharedLayout(0, 16, rank=2))
    else:
        scs = gl.allocate_shared_memory(sd0.dtype, [4 * STAGES, 16, WARPS], sd0.layout)
        scs_t = scs
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
            prow, pns = _tile_at(pl, pk, pt, layer_lo, S0, S1, S2, S3, N0, N1, N2, N3, WARPS)
            _issue(d0, d1, d2, d3, sds, bars, bufs, scs_t, j, pk, prow, pi, pns, WARPS, STAGES, BLOCKED)
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
        # FUSED: qkv's x is the attention norm of down's output plus the residual (layer 0: of x, plus
        # zeros), gate_up's the MLP norm of o's; gate_up writes SiLU-and-mul; program 0 keeps the residual
        XN: gl.constexpr = 1 if FUSED else 0
        r_prev = res_ptr + (2 * layer - 1) * H
        if FUSED and layer == 0:
            xq = zero_ptr
            r_prev = x_ptr
        r_q = res_ptr + 2 * layer * H
        r_g = r_q + H
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            xq, y0, cnt_ptr, link, layer, layer_lo, LAYERS, wait_q, XN, r_prev, r_q, wn_ptr + 2 * layer * H, eps,
            N0, B0, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, False, t_prog, TIMES, MATH, SYNC, scs_t, BLOCKED,
        )  # fmt: skip
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            y0 + layer * N0, y1, cnt_ptr, link + 1, layer, layer_lo, LAYERS, True, 0, r_q, r_q, wn_ptr, eps,
            N1, B1, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, False, t_prog, TIMES, MATH, SYNC, scs_t, BLOCKED,
        )  # fmt: skip
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            y1 + layer * N1, y2, cnt_ptr, link + 2, layer, layer_lo, LAYERS, True, XN, r_q, r_g,
            wn_ptr + (2 * layer + 1) * H, eps, N2, B2, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, FUSED, t_prog, TIMES, MATH, SYNC, scs_t, BLOCKED,
        )  # fmt: skip
        t, pl, pk, pt, pi = _gemv(
            d0, d1, d2, d3, sds, bufs, scs, bars, ab_s, cd_s, sums_s, t, pl, pk, pt, pi,
            y2 + layer * (N2 // 2 if FUSED else N2), y3, cnt_ptr, link + 3, layer, layer_lo, LAYERS, True, 0, r_g,
            r_g, wn_ptr, eps, N3, B3, T0, T1, T2, T3, S0, S1, S2, S3, N0, N1, N2, N3, WARPS, STAGES, SUB, MAXT, False, t_prog, TIMES, MATH, SYNC, scs_t, BLOCKED,
        )  # fmt: skip
