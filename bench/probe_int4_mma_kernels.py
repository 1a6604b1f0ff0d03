# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""An int4 GEMV in Gluon whose layouts are chosen by hand, its products on the tensor cores: the kernels of ``bench.probe_int4_mma``.

Triton's ``tl`` picks a GEMV's thread layouts itself, and ``kernels.int4_gemv`` pays for it with x's
pairs and the scales moved through shared memory every step and the group sums shuffled across
lanes (3.3 instructions a weight in gate_up's loop). Gluon (``triton.experimental.gluon``, Triton 3.6)
lets a kernel say which lane holds what, so these kernels build the loop the leads asked for:

- each lane of a warp loads 16-byte vectors of two rows (a "top" and a "bottom" row) of a step of
  128 packed bytes (one group of 128 columns, low and high halves), 4 lanes a 64-byte chunk;
- a lane's words are its own A fragments of ``mma.sync.m16n8k16`` (f16 in, f32 out), in inline PTX:
  the nibbles go into the mantissas of 1024 (one LOP3 a pair) and ``q - 8`` is exact in fp16; which
  K column is which MMA k index is free, so no data moves between lanes;
- x's fp16 pairs are B (every one of the 8 columns is x), made once per program into shared
  memory; a second MMA with an all-ones A gives each chunk's sum of x for the zeros;
- each step's scales and zeros fold into the lane's sums right away: no shuffles in the loop,
  one quarter of the 4 lanes' equal sums at the end.

Three ways to feed the weights: registers with the next step's tile in flight (``_mma_kernel``;
``ROTATE`` starts each program's K walk at a different step), a ring of TMA tiles in shared memory,
the first ones asked for before the PDL wait (``_tma_kernel``), or persistent programs that take
small units (a tile's rows by a K slice) round-robin (``_units_kernel``). Without ``SUB`` the MMAs
multiply ``1024 + q`` and fp32 takes the offset back out. Plain outputs (no SiLU-and-mul, no
rotary); split K as the library does it (partials, an arrival counter, the last program sums in
split order). Group 128 and batch 1 only. Compiled kernels on Hopper only: the interpreter runs
neither Gluon nor PTX. A probe, not a library kernel: nothing in the engine calls it.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

BYTES_A_STEP = 128
"""Packed bytes a row and step: one group of 128 columns of each half (the probe takes group 128 only)."""
STEP = gl.constexpr(BYTES_A_STEP)
X_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
"""x's pairs in shared memory: plain rows, no swizzle (each lane reads its own 64 bytes)."""


def _mma_asm(sub: bool) -> str:
    """One lane's 4 words of a top row (``$4-$7``) and a bottom row (``$8-$11``) through 16 MMAs.

    ``$12-$15`` / ``$16-$19``: x's B pairs of the low / high half, one 64-bit pair a word. Outputs
    ``[top, bottom, 0, 0]``: ``s_lo C_lo + s_hi C_hi + z_lo sum(x_lo) + z_hi sum(x_hi)`` of each row
    over the 4 lanes' 16 words; scales ``$20`` / ``$24`` (top) and ``$28`` / ``$32`` (bottom), zeros
    ``$36`` / ``$40`` and ``$44`` / ``$48`` (the high ones times 16: x's high half comes in / 16).
    """
    lines = [
        ".reg .b32 t, a, b, c, d, e, f, g, h, ml, mh, mg, kl, kh, one, xa, xb, xc, xd;",
        ".reg .f32 l<4>, m<4>, p<4>, q<4>, r0, r1;",
        "mov.b32 ml, 0x000F000F;",  # low nibbles of bytes 0 and 2 (1 and 3 after the shift)
        "mov.b32 mh, 0x00F000F0;",  # their high nibbles, 16 times their value
        "mov.b32 mg, 0x64006400;",  # 1024 in each half
        "mov.b32 kl, 0x64086408;",  # 1024 + 8
        "mov.b32 kh, 0x64806480;",  # 1024 + 16 * 8
        "mov.b32 one, 0x3C003C00;",
    ]
    lines += [f"mov.f32 {acc}{i}, 0f00000000;" for acc in "lmpq" for i in range(4)]

    def dequant(w: str, lo0: str, lo1: str, hi0: str, hi1: str) -> list[str]:
        out = [
            f"lop3.b32 {lo0}, {w}, ml, mg, 0xEA;",  # (w & m) | 1024: columns j, j+2
            f"lop3.b32 {hi0}, {w}, mh, mg, 0xEA;",
            f"shr.u32 t, {w}, 8;",
            f"lop3.b32 {lo1}, t, ml, mg, 0xEA;",  # columns j+1, j+3
            f"lop3.b32 {hi1}, t, mh, mg, 0xEA;",
        ]
        if sub:
            out += [f"sub.f16x2 {r}, {r}, {k};" for r, k in ((lo0, "kl"), (lo1, "kl"), (hi0, "kh"), (hi1, "kh"))]
        return out

    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    for w in range(4):
        lines += [f"mov.b64 {{xa, xb}}, ${12 + w};", f"mov.b64 {{xc, xd}}, ${16 + w};"]
        lines += dequant(f"${4 + w}", "a", "b", "c", "d") + dequant(f"${8 + w}", "e", "f", "g", "h")
        # A rows i (this lane's top row) and i + 8 (its bottom row); k 2q, 2q+1 <- columns j, j+2
        lines += [
            f"{mma} {{l0, l1, l2, l3}}, {{a, e, b, f}}, {{xa, xb}}, {{l0, l1, l2, l3}};",
            f"{mma} {{m0, m1, m2, m3}}, {{c, g, d, h}}, {{xc, xd}}, {{m0, m1, m2, m3}};",
            f"{mma} {{p0, p1, p2, p3}}, {{one, one, one, one}}, {{xa, xb}}, {{p0, p1, p2, p3}};",
            f"{mma} {{q0, q1, q2, q3}}, {{one, one, one, one}}, {{xc, xd}}, {{q0, q1, q2, q3}};",
        ]
    if not sub:  # the MMAs summed (1024 + q) x and (1024 + 16 q) x / 16: take 1032 and 1152 times sum(x) out
        lines += [
            "fma.rn.f32 l0, p0, 0fC4810000, l0;",
            "fma.rn.f32 l2, p2, 0fC4810000, l2;",
            "fma.rn.f32 m0, q0, 0fC4900000, m0;",
            "fma.rn.f32 m2, q2, 0fC4900000, m2;",
        ]
    lines += [
        "mul.f32 r0, l0, $20;",
        "fma.rn.f32 r0, m0, $24, r0;",
        "fma.rn.f32 r0, p0, $36, r0;",
        "fma.rn.f32 $0, q0, $40, r0;",
        "mul.f32 r1, l2, $28;",
        "fma.rn.f32 r1, m2, $32, r1;",
        "fma.rn.f32 r1, p2, $44, r1;",
        "fma.rn.f32 $1, q2, $48, r1;",
        "mov.b32 $2, 0;",
        "mov.b32 $3, 0;",
    ]
    return "{\n" + "\n".join(lines) + "\n}"


_ASM_SUB = gl.constexpr(_mma_asm(True))
_ASM_OFFSET = gl.constexpr(_mma_asm(False))
_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 8 + ["l"] * 8 + ["r"] * 32))


@gluon.jit
def _pair(lo, hi):
    """Two fp32 tensors as fp16 pairs in int32 (``lo`` in the low half)."""
    return gl.inline_asm_elementwise(
        asm="cvt.rn.f16x2.f32 $0, $2, $1;", constraints="=r,f,f", args=[lo, hi], dtype=gl.int32, is_pure=True, pack=1
    )


@gluon.jit
def _wide(lo, hi):
    """Two int32 tensors as one int64 (``lo`` low): an MMA's B pair in one aligned register pair, no moves."""
    return (lo.to(gl.int64) & 0xFFFFFFFF) | (hi.to(gl.int64) << 32)


@gluon.jit
def _x_cols(k_lo, K2, NSTEP: gl.constexpr, NSTEP_P: gl.constexpr, WARPS: gl.constexpr):
    """``(c, m)``, ``(NSTEP_P, 32)``: each step's words' first low-half column (from ``k_lo``) and whether it is in range."""
    PRE: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])  # (NSTEP_P, 32)
    ps = gl.arange(0, NSTEP_P, layout=gl.SliceLayout(1, PRE))
    pw = gl.arange(0, 32, layout=gl.SliceLayout(0, PRE))
    c = k_lo + gl.expand_dims(ps, 1) * STEP + gl.expand_dims(pw, 0) * 4  # a word's first column
    return c, gl.expand_dims(ps < NSTEP, 1) & (c < K2)


@gluon.jit
def _pack_pairs(a0, a1, a2, a3, b0, b1, b2, b3):
    """x's B pairs ``(ab, cd)`` of a word's 4 low-half values ``a`` and 4 high-half values ``b`` (fp32; ``b`` / 16 here)."""
    q = 0.0625
    return _wide(_pair(a0, a2), _pair(a1, a3)), _wide(_pair(b0 * q, b2 * q), _pair(b1 * q, b3 * q))


@gluon.jit
def _x_pairs(x_ptr, k_lo, K2, NSTEP: gl.constexpr, NSTEP_P: gl.constexpr, WARPS: gl.constexpr):
    """x's B pairs over a program's K range, ``(ab, cd)``, each ``(NSTEP_P, 32)`` int64: a step's words in a row.

    Word ``c`` of a step: ``ab = ((x[4c], x[4c+2]), (x[4c+1], x[4c+3]))`` and ``cd`` the same of the
    high half divided by 16. Each warp makes whole steps.
    """
    c, m = _x_cols(k_lo, K2, NSTEP, NSTEP_P, WARPS)
    return _pairs_at(x_ptr, c, m, K2)


@gluon.jit
def _pairs_at(x_ptr, c, m, K2):
    """``_pack_pairs`` of x loaded at the words whose first low-half column is ``c`` (where ``m``), in ``c``'s layout."""
    return _pack_pairs(
        gl.load(x_ptr + c, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + c + 1, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + c + 2, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + c + 3, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + K2 + c, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + K2 + c + 1, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + K2 + c + 2, mask=m, other=0.0).to(gl.float32),
        gl.load(x_ptr + K2 + c + 3, mask=m, other=0.0).to(gl.float32),
    )


@gluon.jit
def _step_view(buf, NSTEP_P: gl.constexpr):
    """A ``(steps, 32)`` buffer in shared memory viewed ``(steps, 1, 32)``, so that ``.index(step)`` is a ``(1, 32)`` row."""
    return buf._reinterpret(gl.int64, [NSTEP_P, 1, 32], X_SMEM)


@gluon.jit
def _x_fragments(x_ptr, k_lo, K2, NSTEP: gl.constexpr, NSTEP_P: gl.constexpr, WARPS: gl.constexpr):
    """``_x_pairs`` into shared memory, once a program: ``(ab, cd)`` viewed ``(steps, 1, 32)`` (``_step_view``)."""
    ab, cd = _x_pairs(x_ptr, k_lo, K2, NSTEP, NSTEP_P, WARPS)
    ab_s = gl.allocate_shared_memory(gl.int64, [NSTEP_P, 32], X_SMEM, ab)
    cd_s = gl.allocate_shared_memory(gl.int64, [NSTEP_P, 32], X_SMEM, cd)
    return _step_view(ab_s, NSTEP_P), _step_view(cd_s, NSTEP_P)


@gluon.jit
def _ring_take(bufs, bars, t, X: gl.constexpr, BL: gl.constexpr, STAGES: gl.constexpr):
    """Wait for the TMA ring's stage of sequence number ``t`` and read its top and bottom rows (``X`` each) in ``BL``.

    The stage may be refilled once this returns: every lane has read it.
    """
    st = t % STAGES
    mbarrier.wait(bars.index(st), (t // STAGES) & 1)
    wt = bufs.index(st).slice(0, X).load(BL)
    wb = bufs.index(st).slice(X, X).load(BL)
    gl.thread_barrier()
    return wt, wb


@gluon.jit
def _group_scales(s_ptr, z_ptr, top, bot, ss_n, g, hi_groups, tmask, bmask):
    """The step's scales and zeros of group ``g``: top and bottom rows, low and high halves (8 tensors)."""
    st = s_ptr + top * ss_n + g
    sb = s_ptr + bot * ss_n + g
    zt = z_ptr + top * ss_n + g
    zb = z_ptr + bot * ss_n + g
    return (
        gl.load(st, mask=tmask, other=0.0),
        gl.load(st + hi_groups, mask=tmask, other=0.0),
        gl.load(sb, mask=bmask, other=0.0),
        gl.load(sb + hi_groups, mask=bmask, other=0.0),
        gl.load(zt, mask=tmask, other=0.0),
        gl.load(zt + hi_groups, mask=tmask, other=0.0),
        gl.load(zb, mask=bmask, other=0.0),
        gl.load(zb + hi_groups, mask=bmask, other=0.0),
    )


@gluon.jit
def _step(wt, wb, ab, cd, sc, SUB: gl.constexpr, AXIS: gl.constexpr = 1):
    """A step's ``[top, bottom, 0, 0]`` row sums a lane's vector (``_mma_asm``); ``sc`` from ``_group_scales``.

    The scales gain the words' axis ``AXIS`` (the last of the weights' tiles).
    """
    slt, sht, slb, shb, zlt, zht, zlb, zhb = sc
    args = [
        wt, wb, ab, cd,
        gl.expand_dims(slt.to(gl.float32), AXIS), gl.expand_dims(sht.to(gl.float32), AXIS),
        gl.expand_dims(slb.to(gl.float32), AXIS), gl.expand_dims(shb.to(gl.float32), AXIS),
        gl.expand_dims(zlt.to(gl.float32), AXIS), gl.expand_dims(zht.to(gl.float32) * 16.0, AXIS),
        gl.expand_dims(zlb.to(gl.float32), AXIS), gl.expand_dims(zhb.to(gl.float32) * 16.0, AXIS),
    ]  # fmt: skip
    asm: gl.constexpr = _ASM_SUB if SUB else _ASM_OFFSET
    return gl.inline_asm_elementwise(
        asm=asm, constraints=_CONSTRAINTS, args=args, dtype=gl.float32, is_pure=True, pack=4
    )


@gluon.jit
def _finish(acc, cols, top, bot, tmask, bmask, out_ptr, part_ptr, cnt_ptr, N, NSPLIT, ks, tile):
    """Rows' sums out of ``acc`` (every lane of a quad holds the same: a quarter of their sum); split K as the library does."""
    pos = cols % 4
    tsum = gl.sum(gl.where(pos == 0, acc, 0.0), axis=1) * 0.25
    bsum = gl.sum(gl.where(pos == 1, acc, 0.0), axis=1) * 0.25
    if NSPLIT == 1:
        gl.store(out_ptr + top, tsum.to(out_ptr.dtype.element_ty), mask=tmask)
        gl.store(out_ptr + bot, bsum.to(out_ptr.dtype.element_ty), mask=bmask)
    else:
        gl.store(part_ptr + ks * N + top, tsum, mask=tmask)
        gl.store(part_ptr + ks * N + bot, bsum, mask=bmask)
        gl.thread_barrier()
        arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if arrived == NSPLIT - 1:
            rt = gl.zeros_like(tsum)
            rb = gl.zeros_like(bsum)
            for i in range(NSPLIT):
                rt += gl.load(part_ptr + i * N + top, mask=tmask, other=0.0, cache_modifier=".cg")
                rb += gl.load(part_ptr + i * N + bot, mask=bmask, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + top, rt.to(out_ptr.dtype.element_ty), mask=tmask)
            gl.store(out_ptr + bot, rb.to(out_ptr.dtype.element_ty), mask=bmask)
            gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


@gluon.jit
def _stamp(asm: gl.constexpr):
    """A 64-bit special register read where the program is (``%globaltimer``: ns, one clock for all SMs)."""
    return gl.inline_asm_elementwise(asm=asm, constraints="=l", args=[], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _mma_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr, N, K2, NSPLIT, ss_n, t_ptr,
    K_SPLIT: gl.constexpr,  # packed bytes a program: a multiple of STEP
    NSTEP_P: gl.constexpr,  # next power of two of K_SPLIT / STEP
    WARPS: gl.constexpr,
    SUB: gl.constexpr,
    ROTATE: gl.constexpr = False,  # start each program's K walk at step tile % steps
    TIMES: gl.constexpr = False,  # each program writes 5 int64 at t_ptr: start, waited, x made, end (ns), its SM
):  # fmt: skip
    """Weights in registers, the next step's tile in flight; the first loaded before the PDL wait."""
    NSTEP: gl.constexpr = K_SPLIT // STEP
    X: gl.constexpr = 8 * WARPS  # top rows (as many bottom rows) of a program
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])  # (X, 32 words)
    tile = gl.program_id(1)
    ks = gl.program_id(2)
    if TIMES:
        t_ptr += 5 * (ks * gl.num_programs(1) + tile)
        gl.store(t_ptr, _stamp("mov.u64 $0, %globaltimer;"))
        gl.store(t_ptr + 4, _stamp("{ .reg .u32 t; mov.u32 t, %smid; cvt.u64.u32 $0, t; }"))
    k_lo = ks * K_SPLIT
    d = gl.arange(0, X, layout=gl.SliceLayout(1, BL))
    # d = (warp, i): the warp's MMA rows i (top) and i + 8 (bottom)
    top = tile * (2 * X) + 16 * (d // 8) + d % 8
    bot = top + 8
    tmask = top < N
    bmask = bot < N
    cols = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, BL)), 0)  # (1, 32)
    w32 = w_ptr.to(gl.pointer_type(gl.int32))
    wt_row = w32 + gl.expand_dims(top, 1) * (K2 // 4)
    wb_row = w32 + gl.expand_dims(bot, 1) * (K2 // 4)
    tm2 = gl.expand_dims(tmask, 1)
    bm2 = gl.expand_dims(bmask, 1)
    hi_groups = K2 // STEP
    # ROTATE: each program starts its K walk at a different step, so that at any time the programs'
    # requests fall on different columns (and DRAM channels) rather than all on the same step's
    s0 = tile % NSTEP if ROTATE else 0
    # weights and scales are no kernel's output: the first step's before the wait
    k0 = k_lo + s0 * STEP
    wt = gl.load(wt_row + (k0 // 4 + cols), mask=tm2, other=0)
    wb = gl.load(wb_row + (k0 // 4 + cols), mask=bm2, other=0)
    sc = _group_scales(s_ptr, z_ptr, top, bot, ss_n, k0 // STEP, hi_groups, tmask, bmask)
    gdc_wait()
    gdc_launch_dependents()
    if TIMES:
        gl.store(t_ptr + 1, _stamp("mov.u64 $0, %globaltimer;"))
    ab_v, cd_v = _x_fragments(x_ptr, k_lo, K2, NSTEP, NSTEP_P, WARPS)
    gl.thread_barrier()
    if TIMES:
        gl.store(t_ptr + 2, _stamp("mov.u64 $0, %globaltimer;"))
    acc = gl.zeros([X, 32], gl.float32, BL)
    for s in range(NSTEP):
        cwt, cwb, csc = wt, wb, sc
        j = (s + s0) % NSTEP
        k0 = k_lo + ((j + 1) % NSTEP) * STEP
        more = s + 1 < NSTEP
        wt = gl.load(wt_row + (k0 // 4 + cols), mask=tm2 & more, other=0)
        wb = gl.load(wb_row + (k0 // 4 + cols), mask=bm2 & more, other=0)
        sc = _group_scales(s_ptr, z_ptr, top, bot, ss_n, k0 // STEP, hi_groups, tmask & more, bmask & more)
        acc += _step(cwt, cwb, ab_v.index(j).load(BL), cd_v.index(j).load(BL), csc, SUB)
    _finish(acc, cols, top, bot, tmask, bmask, out_ptr, part_ptr, cnt_ptr, N, NSPLIT, ks, tile)
    if TIMES:
        gl.store(t_ptr + 3, _stamp("mov.u64 $0, %globaltimer;"))


@gluon.jit
def _tma_kernel(
    w_desc, x_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr, N, K2, NSPLIT, ss_n,
    K_SPLIT: gl.constexpr,
    NSTEP_P: gl.constexpr,
    WARPS: gl.constexpr,
    SUB: gl.constexpr,
    STAGES: gl.constexpr,  # TMA tiles in the ring; the first STAGES asked for before the PDL wait
):  # fmt: skip
    """``_mma_kernel`` with the weights through a ring of TMA tiles (``2X`` rows x 128 bytes) in shared memory."""
    NSTEP: gl.constexpr = K_SPLIT // STEP
    X: gl.constexpr = 8 * WARPS
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    tile = gl.program_id(1)
    ks = gl.program_id(2)
    k_lo = ks * K_SPLIT
    row0 = tile * (2 * X)
    top = row0 + gl.arange(0, X, layout=gl.SliceLayout(1, BL))  # the tile's rows 0..X-1; X..2X-1 below
    bot = top + X
    tmask = top < N
    bmask = bot < N
    cols = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, BL)), 0)
    hi_groups = K2 // STEP
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES, 2 * X, 32], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(bars.index(j), count=1)
    for j in gl.static_range(STAGES):
        if j < NSTEP:
            mbarrier.expect(bars.index(j), 2 * X * STEP)
            tma.async_copy_global_to_shared(w_desc, [row0, k_lo // 4 + 32 * j], bars.index(j), bufs.index(j))
    sc = _group_scales(s_ptr, z_ptr, top, bot, ss_n, k_lo // STEP, hi_groups, tmask, bmask)
    gdc_wait()
    gdc_launch_dependents()
    ab_v, cd_v = _x_fragments(x_ptr, k_lo, K2, NSTEP, NSTEP_P, WARPS)
    gl.thread_barrier()
    acc = gl.zeros([X, 32], gl.float32, BL)
    for s in range(NSTEP):
        wt, wb = _ring_take(bufs, bars, s, X, BL, STAGES)
        st = s % STAGES
        if s + STAGES < NSTEP:
            mbarrier.expect(bars.index(st), 2 * X * STEP)
            tma.async_copy_global_to_shared(
                w_desc, [row0, k_lo // 4 + 32 * (s + STAGES)], bars.index(st), bufs.index(st)
            )
        csc = sc
        more = s + 1 < NSTEP
        sc = _group_scales(s_ptr, z_ptr, top, bot, ss_n, (k_lo + (s + 1) * STEP) // STEP, hi_groups, tmask & more, bmask & more)  # fmt: skip
        acc += _step(wt, wb, ab_v.index(s).load(BL), cd_v.index(s).load(BL), csc, SUB)
    _finish(acc, cols, top, bot, tmask, bmask, out_ptr, part_ptr, cnt_ptr, N, NSPLIT, ks, tile)


@gluon.jit
def _unit_rows(u, NU, d, N, WARPS: gl.constexpr):
    """Unit ``u``'s top and bottom rows and their masks (a unit: ``2X`` rows x ``NU``-th of K)."""
    tile = u // NU
    top = tile * (16 * WARPS) + 16 * (d // 8) + d % 8
    bot = top + 8
    return top, bot, top < N, bot < N


@gluon.jit
def _unit_step_loads(w32, s_ptr, z_ptr, u, s, U, NU, d, cols, N, K2, ss_n, WARPS: gl.constexpr):
    """Weights and scales of step ``s`` of unit ``u`` (nothing where ``u`` is past the last unit)."""
    top, bot, tmask, bmask = _unit_rows(u, NU, d, N, WARPS)
    tmask = tmask & (u < U)
    bmask = bmask & (u < U)
    wt = gl.load(
        w32 + gl.expand_dims(top, 1) * (K2 // 4) + (s * (STEP // 4) + cols), mask=gl.expand_dims(tmask, 1), other=0
    )
    wb = gl.load(
        w32 + gl.expand_dims(bot, 1) * (K2 // 4) + (s * (STEP // 4) + cols), mask=gl.expand_dims(bmask, 1), other=0
    )
    sc = _group_scales(s_ptr, z_ptr, top, bot, ss_n, s, K2 // STEP, tmask, bmask)
    return wt, wb, sc


@gluon.jit
def _units_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, part_ptr, cnt_ptr, N, K2, ss_n, t_ptr,
    NSTEP: gl.constexpr,  # steps of a whole row (K / 2 / STEP)
    NSTEP_P: gl.constexpr,
    US: gl.constexpr,  # steps a unit
    WARPS: gl.constexpr,
    SUB: gl.constexpr,
    TIMES: gl.constexpr = False,
):  # fmt: skip
    """Persistent programs, units of ``2X`` rows x ``US`` steps dealt round-robin (program ``p``: units ``p, p + P, ..``).

    Each unit's partial goes to ``part[unit's K slice]``; the last unit of a tile to arrive sums the
    tile's partials in K order (the library's split K, with K cut into ``NSTEP / US`` slices). Many
    small units a program, so that a program's luck with its loads averages out, where one program a
    tile ends when its one tile does.
    """
    X: gl.constexpr = 8 * WARPS
    NU: gl.constexpr = NSTEP // US  # units a tile
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    if TIMES:
        t_ptr += 5 * pid
        gl.store(t_ptr, _stamp("mov.u64 $0, %globaltimer;"))
        gl.store(t_ptr + 4, _stamp("{ .reg .u32 t; mov.u32 t, %smid; cvt.u64.u32 $0, t; }"))
    U = ((N + 2 * X - 1) // (2 * X)) * NU
    d = gl.arange(0, X, layout=gl.SliceLayout(1, BL))
    cols = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, BL)), 0)
    w32 = w_ptr.to(gl.pointer_type(gl.int32))
    u = pid
    wt, wb, sc = _unit_step_loads(w32, s_ptr, z_ptr, u, (u % NU) * US, U, NU, d, cols, N, K2, ss_n, WARPS)
    gdc_wait()
    gdc_launch_dependents()
    if TIMES:
        gl.store(t_ptr + 1, _stamp("mov.u64 $0, %globaltimer;"))
    ab_v, cd_v = _x_fragments(x_ptr, 0, K2, NSTEP, NSTEP_P, WARPS)
    gl.thread_barrier()
    if TIMES:
        gl.store(t_ptr + 2, _stamp("mov.u64 $0, %globaltimer;"))
    while u < U:
        acc = gl.zeros([X, 32], gl.float32, BL)
        su = u % NU
        for j in gl.static_range(US):
            cwt, cwb, csc = wt, wb, sc
            if j + 1 < US:  # the next step: this unit's next, or the next unit's first
                wt, wb, sc = _unit_step_loads(w32, s_ptr, z_ptr, u, su * US + j + 1, U, NU, d, cols, N, K2, ss_n, WARPS)
            else:
                nu = u + P
                wt, wb, sc = _unit_step_loads(w32, s_ptr, z_ptr, nu, (nu % NU) * US, U, NU, d, cols, N, K2, ss_n, WARPS)
            acc += _step(cwt, cwb, ab_v.index(su * US + j).load(BL), cd_v.index(su * US + j).load(BL), csc, SUB)
        top, bot, tmask, bmask = _unit_rows(u, NU, d, N, WARPS)
        _finish(acc, cols, top, bot, tmask, bmask, out_ptr, part_ptr, cnt_ptr, N, NU, su, u // NU)
        u += P
    if TIMES:
        gl.store(t_ptr + 3, _stamp("mov.u64 $0, %globaltimer;"))
