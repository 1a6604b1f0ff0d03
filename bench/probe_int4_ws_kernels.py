# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""The kernel of ``bench.probe_int4_ws``: ``bench.probe_int4_rows``' persistent kernel with its warps specialized.

``_ws_kernel`` computes what ``_rows_kernel`` does (layers of qkv, o, gate_up and down in one
launch, 16-row tiles whose K the warps share, the same ring stages and arithmetic), split over warps
of two kinds (``gl.warp_specialize``). The weights are laid out at load a ring stage a block
(``bench.probe_int4_ws.blocked``): a stage is two TMA copies, 16 KB of words step-major and 1 KB of
scales and zeros.

- a producer (the default partition, 4 warps of which one thread issues) runs the ring's cursor
  over the program's tiles of every GEMV and layer: it waits for a stage to be emptied, then asks
  TMA for the next tile's weights, scales and zeros. It never waits for an x, so the weights
  stream through the GEMVs' boundaries as far as the ring reaches;
- ``WARPS`` (8) consumers, each a partition of one warp: warp ``c`` takes step ``c`` of every ring
  stage, makes its own steps' x pairs (private shared memory) once a GEMV, and arrives on the
  stage's "empty" barrier when it has read it (count ``WARPS``). At a GEMV's end the consumers'
  sums meet in shared memory (one mbarrier), each consumer writes a share of the rows and releases
  the GEMV's counter (``WARPS`` a program).

NOTE(h7): why. In ``_rows_kernel`` every TMA copy, mbarrier wait and the stage's release lower
to a ``bar.sync`` of all 8 warps (7 a stage, in its sm_90 PTX), and ncu put its largest stall
there. A partition of one warp lowers them to ``bar.warp.sync``. Measured on the H100 (docs,
"The persistent kernel with a producer warp and one-warp consumers"): 1.4-1.7x slower than the
rows kernel. The ring alone streams at the copy ceiling, but 8 one-warp consumers a multiprocessor
compute at ~1.7 TB/s, and Triton allows no more (14 partitions at most; two programs a
multiprocessor leave 104 registers a consumer). The knobs ``FENCE``, ``AHEAD``, ``MATH``, ``SYNC``,
``LOOP`` and ``CLOCKS`` are that section's variants. Compiled only (Gluon on Hopper).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from bench.probe_int4_chain import _spin_until
from bench.probe_int4_mma_kernels import STEP, _pairs_at, _stamp, _step
from bench.probe_int4_rows_kernels import _advance, _per_kind

XPW = gl.constexpr(8)
"""A consumer's x pair rows in shared memory: the most steps it takes of a row (down's 7 at 8 warps), a power of two."""


@gluon.jit
def _issue(d0, d1, d2, d3, s0, s1, s2, s3, bars, bufs, scs, t, kind, block, STAGES: gl.constexpr):
    """Ask TMA for ring stage ``block`` of ``kind``'s blocked weights (16 KB) and scales and zeros (1 KB), into slot ``t``."""
    st = t % STAGES
    bar = bars.index(st)
    mbarrier.expect(bar, 128 * STEP + 16 * 32 * 2)  # (16 rows x 8 steps) x 128 B; 16 rows x (8 x 4) bf16
    if kind == 0:
        tma.async_copy_global_to_shared(d0, [block * 128, 0], bar, bufs.index(st))
        tma.async_copy_global_to_shared(s0, [block * 16, 0], bar, scs.index(st))
    elif kind == 1:
        tma.async_copy_global_to_shared(d1, [block * 128, 0], bar, bufs.index(st))
        tma.async_copy_global_to_shared(s1, [block * 16, 0], bar, scs.index(st))
    elif kind == 2:
        tma.async_copy_global_to_shared(d2, [block * 128, 0], bar, bufs.index(st))
        tma.async_copy_global_to_shared(s2, [block * 16, 0], bar, scs.index(st))
    else:
        tma.async_copy_global_to_shared(d3, [block * 128, 0], bar, bufs.index(st))
        tma.async_copy_global_to_shared(s3, [block * 16, 0], bar, scs.index(st))


@gluon.jit
def _producer(d0, d1, d2, d3, s0, s1, s2, s3, ready, empty, bufs, scs, LAYERS,
              N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,
              B0: gl.constexpr, B1: gl.constexpr, B2: gl.constexpr, B3: gl.constexpr,
              WARPS: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Every ring stage of this program's tiles over ``LAYERS`` layers, in the consumers' order."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    T0: gl.constexpr = N0 // 16
    T1: gl.constexpr = N1 // 16
    T2: gl.constexpr = N2 // 16
    T3: gl.constexpr = N3 // 16
    S0: gl.constexpr = B0 // STEP // WARPS
    S1: gl.constexpr = B1 // STEP // WARPS
    S2: gl.constexpr = B2 // STEP // WARPS
    S3: gl.constexpr = B3 // STEP // WARPS
    a_layer = (
        (T0 - pid + P - 1) // P * S0
        + (T1 - pid + P - 1) // P * S1
        + (T2 - pid + P - 1) // P * S2
        + (T3 - pid + P - 1) // P * S3
    )
    pl = pid * 0
    pk = pid * 0
    pt = pid
    pi = pid * 0
    for t in range(LAYERS * a_layer):
        st = t % STAGES
        mbarrier.wait(empty.index(st), ((t // STAGES) & 1) ^ 1)  # a fresh barrier's phase 1 counts as done
        block = (pl * _per_kind(pk, T0, T1, T2, T3) + pt) * _per_kind(pk, S0, S1, S2, S3) + pi
        _issue(d0, d1, d2, d3, s0, s1, s2, s3, ready, bufs, scs, t, pk, block, STAGES)
        pl, pk, pt, pi = _advance(pl, pk, pt, pi, pid, P, T0, T1, T2, T3, S0, S1, S2, S3)


@gluon.jit
def _x_own(x_src, xs, c: gl.constexpr, K2, SPT, WARPS: gl.constexpr):
    """Consumer ``c``'s steps' x pairs (steps ``c``, ``c + WARPS``, ...) into its buffers ``2 c`` (ab) and ``2 c + 1`` (cd) of ``xs``."""
    XL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0])  # (XPW, 32)
    si = gl.arange(0, XPW, layout=gl.SliceLayout(1, XL))
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, XL))
    col = gl.expand_dims(si * WARPS + c, 1) * STEP + gl.expand_dims(lane, 0) * 4  # a word's first column
    m = gl.expand_dims(si < SPT, 1) & (col < K2)
    ab, cd = _pairs_at(x_src, col, m, K2)
    xs.index(2 * c).store(ab)
    xs.index(2 * c + 1).store(cd)


@gluon.jit
def _own_scales(scs, st, c: gl.constexpr, L: gl.constexpr):
    """Stage ``st``'s scales and zeros of consumer ``c``'s step, in ``_group_scales``' order, ``(8,)`` each in ``L``'s rows."""
    sz = scs.index(st)  # (16 rows, WARPS steps x (s_lo, s_hi, z_lo, z_hi))
    return (
        gl.sum(sz.slice(0, 8).slice(4 * c, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(0, 8).slice(4 * c + 1, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(8, 8).slice(4 * c, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(8, 8).slice(4 * c + 1, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(0, 8).slice(4 * c + 2, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(0, 8).slice(4 * c + 3, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(8, 8).slice(4 * c + 2, 1, dim=1).load(L), axis=1),
        gl.sum(sz.slice(8, 8).slice(4 * c + 3, 1, dim=1).load(L), axis=1),
    )  # each a (8, 1) load summed over its one column


@gluon.jit
def _take(wv, scs, ready, empty, ab_v, cd_v, t, i, c: gl.constexpr, WL: gl.constexpr, WARPS: gl.constexpr,
          STAGES: gl.constexpr, FENCE: gl.constexpr):  # fmt: skip
    """Wait for ring stage ``t``, read consumer ``c``'s step of it and its x pairs (step ``i`` of the tile), release it.

    Returns ``(wt, wb, ab, cd, scales)``, ``_step``'s operands.
    """
    st = t % STAGES
    mbarrier.wait(ready.index(st), (t // STAGES) & 1)
    own = wv.index(st * WARPS + c)  # (16 rows, 32 words)
    wt = own.slice(0, 8).load(WL)
    wb = own.slice(8, 8).load(WL)
    sc = _own_scales(scs, st, c, WL)
    if FENCE:  # the reads above before TMA's refill (the producer's copies fence too)
        fence_async_shared()
    mbarrier.arrive(empty.index(st), count=1)
    return wt, wb, ab_v.index(i).load(WL), cd_v.index(i).load(WL), sc


@gluon.jit
def _consume(wv, scs, ready, empty, meet, xs, sums_s, t, x_src, y_ptr, cnt_ptr, link, wait, t_ptr,
             N, B, WARPS: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr, FENCE: gl.constexpr,
             AHEAD: gl.constexpr, CLOCKS: gl.constexpr, MATH: gl.constexpr, SYNC: gl.constexpr,
             c: gl.constexpr):  # fmt: skip
    """Consumer ``c``'s part of one GEMV (``link``): wait for x, its steps of this program's tiles, the meet, the release."""
    SPT = B // STEP // WARPS  # ring stages a tile
    T = N // 16
    WL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0])  # (8 rows, 32 words)
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    mine = (T - pid + P - 1) // P
    c0 = pid.to(gl.int64) * 0
    if CLOCKS:
        c0 = _stamp("mov.u64 $0, %clock64;")
    if SYNC and wait:
        _spin_until(cnt_ptr + link - 1, WARPS * P)
        gl.thread_barrier()  # the lanes' loads of x after the one that saw the count
    if CLOCKS:  # cycles spent waiting for x
        gl.atomic_add(t_ptr + (pid * WARPS + c) * 4 + 1, _stamp("mov.u64 $0, %clock64;") - c0, sem="relaxed")
    _x_own(x_src, xs, c, B, SPT, WARPS)
    gl.thread_barrier()
    X2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    ab_v = xs.index(2 * c)._reinterpret(gl.int64, [XPW, 1, 32], X2)  # .index(i): step i's (1, 32)
    cd_v = xs.index(2 * c + 1)._reinterpret(gl.int64, [XPW, 1, 32], X2)
    pos = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, WL)), 0) % 4  # (1, 32)
    acc = gl.zeros([8, 32], gl.float32, WL)
    waited = c0 * 0
    cur = _take(wv, scs, ready, empty, ab_v, cd_v, t, 0, c, WL, WARPS, STAGES, FENCE)
    for j in range(mine * SPT):  # this program's (tile, stage) in order; AHEAD: the next read before this one's math
        i = j % SPT
        nxt = cur
        if AHEAD and j + 1 < mine * SPT:
            nxt = _take(wv, scs, ready, empty, ab_v, cd_v, t + 1, (j + 1) % SPT, c, WL, WARPS, STAGES, FENCE)
        wt, wb, ab, cd, sc = cur
        if MATH:
            acc += _step(wt, wb, ab, cd, sc, SUB)
        t += 1
        if i == SPT - 1:  # the tile's last stage: this consumer's K of its top and bottom rows, (8, 1) each
            top = gl.expand_dims(gl.sum(gl.where(pos == 0, acc, 0.0), axis=1) * 0.25, 1)
            bot = gl.expand_dims(gl.sum(gl.where(pos == 1, acc, 0.0), axis=1) * 0.25, 1)
            sums_s.index(2 * (j // SPT)).slice(c, 1, dim=1).store(top)
            sums_s.index(2 * (j // SPT) + 1).slice(c, 1, dim=1).store(bot)
            acc = gl.zeros([8, 32], gl.float32, WL)
        if not AHEAD and j + 1 < mine * SPT:
            if CLOCKS:
                w0 = _stamp("mov.u64 $0, %clock64;")
                nxt = _take(wv, scs, ready, empty, ab_v, cd_v, t, (j + 1) % SPT, c, WL, WARPS, STAGES, FENCE)
                waited += _stamp("mov.u64 $0, %clock64;") - w0
            else:
                nxt = _take(wv, scs, ready, empty, ab_v, cd_v, t, (j + 1) % SPT, c, WL, WARPS, STAGES, FENCE)
        cur = nxt
    if CLOCKS:  # cycles spent waiting for ring stages (the consumer's own reads included), and in the whole GEMV
        gl.atomic_add(t_ptr + (pid * WARPS + c) * 4 + 2, waited, sem="relaxed")
    # the meet: every consumer's sums stored (the barrier's phase flips once a GEMV), then a share of the rows each
    mbarrier.arrive(meet, count=1)
    mbarrier.wait(meet, link & 1)
    ML: gl.constexpr = gl.BlockedLayout([1, WARPS // 4], [8, 4], [1, 1], [1, 0])  # (8 rows, WARPS consumers)
    r = gl.arange(0, 8, layout=gl.SliceLayout(1, ML))
    for u in range(c, 2 * mine, WARPS):  # unit u: tile u // 2's top (0) or bottom (1) 8 rows
        half = u % 2
        v = sums_s.index(u).load(ML)
        rows = (pid + (u // 2) * P) * 16 + half * 8 + r
        gl.store(y_ptr + rows, gl.sum(v, axis=1).to(y_ptr.dtype.element_ty))
    gl.thread_barrier()  # every lane's stores of y before the release
    gl.atomic_add(cnt_ptr + link, 1, sem="release")
    if CLOCKS:
        gl.atomic_add(t_ptr + (pid * WARPS + c) * 4 + 3, _stamp("mov.u64 $0, %clock64;") - c0, sem="relaxed")
    return t


@gluon.jit
def _links(kind, layer, x_ptr, y0, y1, y2, y3, N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr):
    """GEMV ``kind`` of ``layer``'s input (the output before it; layer 0's qkv: ``x``) and output, at run time."""
    xq = y2 + layer * N2
    yq = y3 + layer * N3
    if kind == 0:
        xq = y3 + (layer - 1) * N3
        if layer == 0:
            xq = x_ptr
        yq = y0 + layer * N0
    elif kind == 1:
        xq = y0 + layer * N0
        yq = y1 + layer * N1
    elif kind == 2:
        xq = y1 + layer * N1
        yq = y2 + layer * N2
    return xq, yq


@gluon.jit
def _consumer(wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS,
              N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,
              B0: gl.constexpr, B1: gl.constexpr, B2: gl.constexpr, B3: gl.constexpr,
              WARPS: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr, FENCE: gl.constexpr,
              AHEAD: gl.constexpr, CLOCKS: gl.constexpr, MATH: gl.constexpr, SYNC: gl.constexpr, LOOP: gl.constexpr,
              c: gl.constexpr):  # fmt: skip
    """Consumer warp ``c`` over every GEMV of ``LAYERS`` layers; each GEMV's x is the output before it, cut to its K."""
    t = gl.program_id(0) * 0  # the ring's sequence number
    for layer in range(LAYERS):
        if LOOP:  # one call site, the kind's sizes at run time: a quarter of the code (each consumer has its own copy)
            for kind in range(4):
                xq, yq = _links(kind, layer, x_ptr, y0, y1, y2, y3, N0, N1, N2, N3)
                t = _consume(wv, scs, ready, empty, meet, xs, sums_s, t, xq, yq, cnt_ptr, 4 * layer + kind,
                             4 * layer + kind > 0, t_ptr, _per_kind(kind, N0, N1, N2, N3),
                             _per_kind(kind, B0, B1, B2, B3), WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, c)  # fmt: skip
        else:
            link = 4 * layer
            xq = x_ptr
            if layer > 0:
                xq = y3 + (layer - 1) * N3
            t = _consume(wv, scs, ready, empty, meet, xs, sums_s, t, xq, y0 + layer * N0, cnt_ptr, link, layer > 0,
                         t_ptr, N0, B0, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, c)  # fmt: skip
            t = _consume(wv, scs, ready, empty, meet, xs, sums_s, t, y0 + layer * N0, y1 + layer * N1, cnt_ptr,
                         link + 1, True, t_ptr, N1, B1, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, c)  # fmt: skip
            t = _consume(wv, scs, ready, empty, meet, xs, sums_s, t, y1 + layer * N1, y2 + layer * N2, cnt_ptr,
                         link + 2, True, t_ptr, N2, B2, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, c)  # fmt: skip
            t = _consume(wv, scs, ready, empty, meet, xs, sums_s, t, y2 + layer * N2, y3 + layer * N3, cnt_ptr,
                         link + 3, True, t_ptr, N3, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, c)  # fmt: skip


@gluon.jit
def _ws_kernel(
    d0, d1, d2, d3, s0, s1, s2, s3, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS,
    N0: gl.constexpr, N1: gl.constexpr, N2: gl.constexpr, N3: gl.constexpr,  # rows of qkv, o, gate_up, down
    B0: gl.constexpr, B1: gl.constexpr, B2: gl.constexpr, B3: gl.constexpr,  # their packed bytes a row (K / 2)
    WARPS: gl.constexpr,  # steps of K a ring stage, one a consumer of a group
    STAGES: gl.constexpr,
    SUB: gl.constexpr,
    REGS: gl.constexpr,  # registers a consumer warp
    FENCE: gl.constexpr = False,  # a consumer fences the async proxy before it releases a stage
    AHEAD: gl.constexpr = False,  # a consumer reads its next stage before this one's arithmetic (measured slower)
    CLOCKS: gl.constexpr = False,  # each consumer adds up its cycles (x waits, stage waits, GEMVs) at t_ptr (P, WARPS, 4)
    MATH: gl.constexpr = True,  # False: the consumers read and release the stages but skip the arithmetic (wrong outputs)
    SYNC: gl.constexpr = True,  # False: no GEMV waits for the one before (wrong outputs; the ring's rate alone)
    LOOP: gl.constexpr = False,  # the four GEMVs a layer through one call site, sizes at run time (measured slower)
):  # fmt: skip
    """``LAYERS`` layers of (qkv, o, gate_up, down) in one launch; outputs ``y_k`` (layers, N_k), as ``_rows_kernel``'s.

    ``cnt`` (4 x layers,) zeros at launch: GEMV ``4 l + k`` counts the consumer warps done with it.
    """
    gl.static_assert(N0 % 16 == 0 and N1 % 16 == 0 and N2 % 16 == 0 and N3 % 16 == 0)
    gl.static_assert(B0 // STEP % WARPS == 0 and B1 // STEP % WARPS == 0)
    gl.static_assert(B2 // STEP % WARPS == 0 and B3 // STEP % WARPS == 0)
    gl.static_assert(B0 // STEP // WARPS <= XPW and B3 // STEP // WARPS <= XPW)
    gl.static_assert(WARPS == 8)  # the consumer partitions below are written out (Triton allows 14 at most)
    MAXT: gl.constexpr = 16  # tiles a program in a GEMV, at most (the runner checks)
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES, 16 * WARPS, 32], d0.layout)  # TMA's view: a box a stage
    # the consumers' view: a (16 rows, 32 words) block a stage and step, the same 128-byte swizzle
    wv = bufs._reinterpret(gl.int32, [STAGES * WARPS, 16, 32], d0.layout)
    scs = gl.allocate_shared_memory(s0.dtype, [STAGES, 16, 4 * WARPS], s0.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    meet = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    xs = gl.allocate_shared_memory(gl.int64, [2 * WARPS, XPW, 32], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    sums_s = gl.allocate_shared_memory(gl.float32, [2 * MAXT, 8, WARPS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=WARPS)
    mbarrier.init(meet, count=WARPS)
    # the partitions' arguments are written out in the call: a tuple assigned to a name first would turn
    # its constexprs into tensors
    gl.warp_specialize(
        [
            (_producer, (d0, d1, d2, d3, s0, s1, s2, s3, ready, empty, bufs, scs, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 0)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 1)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 2)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 3)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 4)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 5)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 6)),
            (_consumer, (wv, scs, ready, empty, meet, xs, sums_s, x_ptr, y0, y1, y2, y3, cnt_ptr, t_ptr, LAYERS, N0, N1, N2, N3, B0, B1, B2, B3, WARPS, STAGES, SUB, FENCE, AHEAD, CLOCKS, MATH, SYNC, LOOP, 7)),
        ],
        [1, 1, 1, 1, 1, 1, 1, 1],
        [REGS, REGS, REGS, REGS, REGS, REGS, REGS, REGS],
    )  # fmt: skip
