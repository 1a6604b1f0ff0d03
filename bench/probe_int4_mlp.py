# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: the int4 MLP (gate_up, SiLU-and-mul, down) in one launch, split along the intermediate dimension.

The library runs a layer's MLP as two GEMVs, and down can start only once all of gate_up has
finished: a launch edge (the wait, x, the spread of the programs' ends) of 3-5 us a layer. Here
each of P programs owns a slice of the intermediate dimension: J bytes of down's packed rows,
i.e. the 2J columns ``[pJ, pJ + J)`` and ``[I/2 + pJ, I/2 + pJ + J)`` (``reference.quantize_int4``
puts column j and j + K/2 in one byte). Phase 1 makes those columns' gate and up outputs (4J rows
of gate_up over all of K, C gate and C up rows a step); phase 2 multiplies ``silu(gate) * up`` of
them by its J bytes of every down row, a partial of the whole output. No program waits on another
until the partials meet: the last Q programs to arrive each sum H / Q rows over all P partials in
program order (the result does not depend on arrival order).

The weights are laid out for it at load (``MLP.blocked``): gate_up's rows in the order a program's
steps read them, down as ``(P, H, J)`` (a program's slice of every row in one run), scales and
zeros packed into one int32 (``pack_scales``; down's group-major). Each program asks for two steps
of gate_up before its PDL wait and down's first two as gate_up's loop ends, and keeps two in flight. The half2 loop loads a step as
``(K/2 / 512, 2C, 128)`` words, a row's quarters first, so that a warp holds whole rows.
``MODE`` runs the phases alone (timing only; the output is then wrong).

Timed against the library's two launches a layer over 32 layers of the 8B shape's MLP weights in
one CUDA graph, each layer's input the output of the one before; checked against
``kernels.reference``. ``--cpu-check`` runs the fp32 path under ``TRITON_INTERPRET=1`` on small
shapes, with Q = 1: the interpreter runs programs one after another, so an earlier reducer would
spin forever. The half2 path is compiled only on the GPU; nothing in the engine calls either.

    python -m bench.probe_int4_mlp --json $OUT/probe_int4_mlp.json --configs 224:8:2:512:64:256,224:8:2:512:64:256:1
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from kernels import reference
from kernels._common import interpreting, next_pow2, pdl_args, pdl_enter_after_wait, tl, triton
from kernels.int4_gemv import _h2_dot, _half_pairs, _nibbles_f32


@triton.jit
def _gu_step(gw_ptr, gsz_ptr, p, t, T: tl.constexpr, K2: tl.constexpr, G: tl.constexpr, C: tl.constexpr):
    """gate_up step ``t`` of program ``p`` for the fp32 loop (``MLP.blocked``): gate's and up's ``(C, K2)`` bytes, their packed scales.

    Zeros from step T on. Scales and zeros load as one int32 each (``pack_scales``), low half's
    groups then high half's.
    """
    NG: tl.constexpr = K2 // G
    live = t < T
    blk = (p * T + t) * 2 * C  # the step's first row in the blocked layout
    r = tl.arange(0, C)[:, None]
    w8 = gw_ptr + (blk + r) * K2 + tl.arange(0, K2)[None, :]
    wg = tl.load(w8, mask=live, other=0)
    wu = tl.load(w8 + C * K2, mask=live, other=0)
    g = (blk + r) * (2 * NG) + tl.arange(0, NG)[None, :]  # (C, NG)
    sg_lo = tl.load(gsz_ptr + g, mask=live, other=0)
    sg_hi = tl.load(gsz_ptr + g + NG, mask=live, other=0)
    su_lo = tl.load(gsz_ptr + g + C * 2 * NG, mask=live, other=0)
    su_hi = tl.load(gsz_ptr + g + C * 2 * NG + NG, mask=live, other=0)
    return wg, wu, sg_lo, sg_hi, su_lo, su_hi


@triton.jit
def _gu_step3(gw_ptr, gsz_ptr, p, t, T: tl.constexpr, K2: tl.constexpr, G: tl.constexpr, C: tl.constexpr):
    """gate_up step ``t`` for the half2 loop: the step's 2C rows (gate's, then up's) as ``(2C, K2 / 512, 128)`` int32 words.

    A row cut in 512-byte quarters, so that the layout's 32 lanes x 4 words cover a quarter and the
    warps take (row, quarter) pairs: a quarter's group sums stay in its warp (shuffles, no barrier)
    and its x pairs are one quarter's. Its packed scales ``(2C, K2 / 512, 4)``, low and high half.
    """
    NG: tl.constexpr = K2 // G
    QN: tl.constexpr = K2 // 512
    live = t < T
    blk = (p * T + t) * 2 * C
    r = tl.arange(0, 2 * C)[:, None, None]
    q = tl.arange(0, QN)[None, :, None]
    w32 = gw_ptr.to(tl.pointer_type(tl.int32)) + (blk + r) * (K2 // 4) + q * 128 + tl.arange(0, 128)[None, None, :]
    w = tl.load(w32, mask=live, other=0, eviction_policy="evict_first")
    g = (blk + r) * (2 * NG) + q * (512 // G) + tl.arange(0, 512 // G)[None, None, :]  # (2C, QN, groups a quarter)
    sz_lo = tl.load(gsz_ptr + g, mask=live, other=0)
    sz_hi = tl.load(gsz_ptr + g + NG, mask=live, other=0)
    return w, sz_lo, sz_hi


@triton.jit
def _unpack(sz):
    """fp32 ``(scale, zero)`` of ``pack_scales``' int32 (bf16 scale low, bf16 zero high)."""
    return (sz << 16).to(tl.float32, bitcast=True), (sz & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _rows_f32(b, x_lo, x_hi, sz_lo, sz_hi, G: tl.constexpr):
    """``(C,)`` dot products of whole packed rows ``b`` (bytes) with x on fp32 FMAs: the interpreter's path."""
    C: tl.constexpr = b.shape[0]
    K2: tl.constexpr = b.shape[1]
    f_lo, f_hi = _nibbles_f32(b, False)  # 1 + q / 2048, 1 + q / 128
    t_lo = tl.sum(tl.reshape((f_lo - 1.0) * x_lo[None, :], (C, K2 // G, G)), axis=2)  # (C, NG): sum(q x) / 2048
    t_hi = tl.sum(tl.reshape((f_hi - 1.0) * x_hi[None, :], (C, K2 // G, G)), axis=2)
    xs_lo = tl.sum(tl.reshape(x_lo, (K2 // G, G)), axis=1)[None, :]
    xs_hi = tl.sum(tl.reshape(x_hi, (K2 // G, G)), axis=1)[None, :]
    s_lo, z_lo = _unpack(sz_lo)
    s_hi, z_hi = _unpack(sz_hi)
    y = (2048.0 * s_lo) * t_lo + (z_lo - 8.0 * s_lo) * xs_lo + (128.0 * s_hi) * t_hi + (z_hi - 8.0 * s_hi) * xs_hi
    return tl.sum(y, axis=1)


@triton.jit
def _glu(hrow, j, C: tl.constexpr, QS: tl.constexpr, dt: tl.constexpr):
    """``silu(gate) * up`` of this program's local columns ``j`` (1-D) from phase 1's rows, in ``dt``.

    Step ``j // C`` wrote C gate rows then C up rows, each as QS fp32 partials (a row's quarters);
    gate and up are rounded to ``dt`` first, as the library's gate_up output is.
    """
    row = (j // C) * 2 * C + j % C
    qs = tl.arange(0, QS)[None, :]
    g = tl.sum(tl.load(hrow + row[:, None] * QS + qs), axis=1).to(dt).to(tl.float32)
    u = tl.sum(tl.load(hrow + (row + C)[:, None] * QS + qs), axis=1).to(dt).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(dt)


@triton.jit
def _dn_step(
    dw_ptr, dsz_ptr, p, rows, I2: tl.constexpr, H: tl.constexpr, J: tl.constexpr, G: tl.constexpr, H2: tl.constexpr
):
    """down's ``(BR, J)`` slab of program ``p`` at ``rows`` (``MLP.blocked``; words with H2, else bytes) and its packed scales."""
    m = (rows < H)[:, None]
    if H2:
        w32 = dw_ptr.to(tl.pointer_type(tl.int32)) + (p * H + rows[:, None]) * (J // 4) + tl.arange(0, J // 4)[None, :]
        w = tl.load(w32, mask=m, other=0, eviction_policy="evict_first")
    else:
        w = tl.load(dw_ptr + (p * H + rows[:, None]) * J + tl.arange(0, J)[None, :], mask=m, other=0)
    sz_lo = tl.load(dsz_ptr + (p * J // G) * H + rows, mask=rows < H, other=0)
    sz_hi = tl.load(dsz_ptr + ((I2 + p * J) // G) * H + rows, mask=rows < H, other=0)
    return w, sz_lo, sz_hi


@triton.jit
def _mlp_kernel(
    x_ptr,  # (K,) activations
    gw_ptr,  # (2I, K/2) uint8 [gate; up], blocked (MLP.gu_blk)
    gsz_ptr,  # (2I, K/G) int32 scales and zeros (pack_scales), blocked alike
    dw_ptr,  # (P, H, J) uint8 down, blocked (MLP.dn_blk)
    dsz_ptr,  # (I/G, H) int32 down's scales and zeros, group-major
    h_ptr,  # (P, 4J, QS) fp32 scratch: each program's gate and up rows' sums (C gate, C up a step)
    part_ptr,  # (P, H) fp32 partials
    cnt_ptr,  # (1,) int64 arrivals, over all launches
    out_ptr,  # (H,) output
    K2: tl.constexpr,  # K / 2
    INTER: tl.constexpr,  # intermediate size
    H: tl.constexpr,  # output size (down's rows)
    G: tl.constexpr,  # group size
    J: tl.constexpr,  # down bytes a program: I / 2 / P
    C: tl.constexpr,  # gate_up columns a step (C gate rows and C up rows)
    BR: tl.constexpr,  # down rows a step
    Q: tl.constexpr,  # programs that sum the partials (the last Q to arrive)
    PP: tl.constexpr,  # P rounded up to a power of two
    PB: tl.constexpr,  # partials a reducer loads at once
    H2: tl.constexpr = False,  # half2 FMAs (compiled kernels only)
    PDL: tl.constexpr = False,
    MODE: tl.constexpr = 7,  # probe: 1 gate_up, 2 down, 4 the partials' sum
    DEPTH: tl.constexpr = 2,  # half2: gate_up steps in flight
):
    p = tl.program_id(0)
    P = tl.num_programs(0)
    I2: tl.constexpr = INTER // 2
    T: tl.constexpr = 2 * J // C  # gate_up steps of this program
    rr = tl.arange(0, BR)
    # weights and scales are no kernel's output: gate_up's first two steps before the PDL wait
    if H2:
        wa, za_lo, za_hi = _gu_step3(gw_ptr, gsz_ptr, p, 0, T, K2, G, C)
        wb, zb_lo, zb_hi = _gu_step3(gw_ptr, gsz_ptr, p, 1, T, K2, G, C)
        if DEPTH == 3:
            wd, zd_lo, zd_hi = _gu_step3(gw_ptr, gsz_ptr, p, 2, T, K2, G, C)
    else:
        ga, ua, sga_lo, sga_hi, sua_lo, sua_hi = _gu_step(gw_ptr, gsz_ptr, p, 0, T, K2, G, C)
        gb, ub, sgb_lo, sgb_hi, sub_lo, sub_hi = _gu_step(gw_ptr, gsz_ptr, p, 1, T, K2, G, C)
    pdl_enter_after_wait(PDL)
    dt = x_ptr.dtype.element_ty
    # phase 1: gate's and up's 2C rows a step, whole rows, x made once; their fp32 sums into h
    QS: tl.constexpr = K2 // 512 if H2 else 1  # fp32 partials a gate_up row leaves in h
    hrow = h_ptr + p * 4 * J * QS
    if H2:
        QN: tl.constexpr = K2 // 512
        GQ: tl.constexpr = 512 // G  # groups a quarter
        wc = tl.arange(0, QN)[None, :, None] * 128 + tl.arange(0, 128)[None, None, :]  # (1, QN, 128) words
        xa, xb, xw_lo = _half_pairs(
            tl.load(x_ptr + 4 * wc), tl.load(x_ptr + 4 * wc + 1), tl.load(x_ptr + 4 * wc + 2), tl.load(x_ptr + 4 * wc + 3), 0.25
        )  # fmt: skip
        xc, xd, xw_hi = _half_pairs(
            tl.load(x_ptr + K2 + 4 * wc), tl.load(x_ptr + K2 + 4 * wc + 1), tl.load(x_ptr + K2 + 4 * wc + 2),
            tl.load(x_ptr + K2 + 4 * wc + 3), 0.25 / 16.0,
        )  # fmt: skip
        xs_lo = tl.sum(tl.reshape(xw_lo, (1, QN, GQ, G // 4)), axis=3)  # (1, QN, GQ)
        xs_hi = tl.sum(tl.reshape(xw_hi, (1, QN, GQ, G // 4)), axis=3)
        lo4 = (tl.arange(0, G // 4) % 4 < 2)[None, None, None, :]
        for t in range(T if MODE & 1 else 0):
            cw, cz_lo, cz_hi = wa, za_lo, za_hi
            wa, za_lo, za_hi = wb, zb_lo, zb_hi
            if DEPTH == 3:
                wb, zb_lo, zb_hi = wd, zd_lo, zd_hi
                wd, zd_lo, zd_hi = _gu_step3(gw_ptr, gsz_ptr, p, t + 3, T, K2, G, C)
            else:
                wb, zb_lo, zb_hi = _gu_step3(gw_ptr, gsz_ptr, p, t + 2, T, K2, G, C)
            o = tl.reshape(_h2_dot(cw, xa, xb, xc, xd), (2 * C, QN, GQ, G // 4))  # [lo, lo, hi, hi] a 4 words
            t_lo = tl.sum(tl.where(lo4, o, 0.0), axis=3)  # (2C, QN, GQ): sum((q - 8) x / 4)
            t_hi = tl.sum(tl.where(lo4, 0.0, o), axis=3)
            s_lo, z_lo = _unpack(cz_lo)
            s_hi, z_hi = _unpack(cz_hi)
            y = (4.0 * s_lo) * t_lo + z_lo * xs_lo + (4.0 * s_hi) * t_hi + z_hi * xs_hi
            # each (row, quarter)'s sum as it is: the quarters meet once, after the loop (_glu)
            rq = (t * 2 * C + tl.arange(0, 2 * C))[:, None] * QN + tl.arange(0, QN)[None, :]
            tl.store(hrow + rq, tl.sum(y, axis=2))
    else:
        x_lo = tl.load(x_ptr + tl.arange(0, K2)).to(tl.float32)
        x_hi = tl.load(x_ptr + K2 + tl.arange(0, K2)).to(tl.float32)
        for t in range(T if MODE & 1 else 0):
            cg, cu, csg_lo, csg_hi, csu_lo, csu_hi = ga, ua, sga_lo, sga_hi, sua_lo, sua_hi
            ga, ua, sga_lo, sga_hi, sua_lo, sua_hi = gb, ub, sgb_lo, sgb_hi, sub_lo, sub_hi
            gb, ub, sgb_lo, sgb_hi, sub_lo, sub_hi = _gu_step(gw_ptr, gsz_ptr, p, t + 2, T, K2, G, C)
            tl.store(hrow + t * 2 * C + tl.arange(0, C), _rows_f32(cg, x_lo, x_hi, csg_lo, csg_hi, G))
            tl.store(hrow + t * 2 * C + C + tl.arange(0, C), _rows_f32(cu, x_lo, x_hi, csu_lo, csu_hi, G))
    # down's first two steps, in flight while h is made (held through phase 1, their registers cost
    # gate_up's loop occupancy)
    da, ta_lo, ta_hi = _dn_step(dw_ptr, dsz_ptr, p, rr, I2, H, J, G, H2)
    db, tb_lo, tb_hi = _dn_step(dw_ptr, dsz_ptr, p, rr + BR, I2, H, J, G, H2)
    # NOTE: every thread's stores before any thread reads them back (same program: bar.sync suffices)
    tl.debug_barrier()
    # phase 2: this program's partial of down over its columns, every row; two steps in flight
    if H2:
        JW: tl.constexpr = J // 4
        j = 4 * tl.arange(0, JW)
        ya, yb, ys_lo = _half_pairs(
            _glu(hrow, j, C, QS, dt), _glu(hrow, j + 1, C, QS, dt), _glu(hrow, j + 2, C, QS, dt), _glu(hrow, j + 3, C, QS, dt), 0.25
        )  # fmt: skip
        yc, yd, ys_hi = _half_pairs(
            _glu(hrow, J + j, C, QS, dt), _glu(hrow, J + j + 1, C, QS, dt), _glu(hrow, J + j + 2, C, QS, dt),
            _glu(hrow, J + j + 3, C, QS, dt), 0.25 / 16.0,
        )  # fmt: skip
    else:
        y_lo = _glu(hrow, tl.arange(0, J), C, QS, dt).to(tl.float32)
        y_hi = _glu(hrow, J + tl.arange(0, J), C, QS, dt).to(tl.float32)
        ys_lo = y_lo
        ys_hi = y_hi
    sy_lo = tl.sum(ys_lo, axis=0)
    sy_hi = tl.sum(ys_hi, axis=0)
    for r in range(H // BR if MODE & 2 else 0):
        rows = r * BR + rr
        cq, cz_lo, cz_hi = da, ta_lo, ta_hi
        da, ta_lo, ta_hi = db, tb_lo, tb_hi
        db, tb_lo, tb_hi = _dn_step(dw_ptr, dsz_ptr, p, rows + 2 * BR, I2, H, J, G, H2)
        s_lo, z_lo = _unpack(cz_lo)
        s_hi, z_hi = _unpack(cz_hi)
        if H2:
            o = _h2_dot(cq, ya[None, :], yb[None, :], yc[None, :], yd[None, :])  # (BR, J / 4): [lo, lo, hi, hi]
            lo = (tl.arange(0, J // 4) % 4 < 2)[None, :]
            t_lo = tl.sum(tl.where(lo, o, 0.0), axis=1)
            t_hi = tl.sum(tl.where(lo, 0.0, o), axis=1)
            y = (4.0 * s_lo) * t_lo + z_lo * sy_lo + (4.0 * s_hi) * t_hi + z_hi * sy_hi
        else:
            f_lo, f_hi = _nibbles_f32(cq, False)  # 1 + q / 2048, 1 + q / 128
            t_lo = tl.sum((f_lo - 1.0) * y_lo[None, :], axis=1)
            t_hi = tl.sum((f_hi - 1.0) * y_hi[None, :], axis=1)
            y = (2048.0 * s_lo) * t_lo + (z_lo - 8.0 * s_lo) * sy_lo
            y += (128.0 * s_hi) * t_hi + (z_hi - 8.0 * s_hi) * sy_hi
        tl.store(part_ptr + p * H + rows, y)
    # the partials meet: the last Q programs to arrive each sum H / Q rows over all P, in program order
    tl.debug_barrier()
    # the counter only grows (64 bits): launch e's arrivals are eP .. eP + P - 1, so no reset
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    idx = arrived % P - (P - Q)
    if (idx >= 0) & (MODE & 4 != 0):
        end = (arrived // P + 1) * P
        seen = arrived + 1
        one = tl.arange(0, 32)
        while seen < end:
            # NOTE: one plain load a warp; spinning on every thread's loads or on atomics measured the
            # same on the H100 (the meeting's cost was its partials' loads in turn, now one load)
            seen = tl.max(tl.load(cnt_ptr + one * 0, mask=one == 0, other=0, volatile=True), axis=0)
        tl.atomic_add(cnt_ptr, 0, sem="acquire")  # what the spin saw, and the partials before it
        RQ: tl.constexpr = H // Q
        cols = idx * RQ + tl.arange(0, RQ)
        tot = tl.zeros((RQ,), tl.float32)
        for pb in tl.static_range(0, PP, PB):
            pr = pb + tl.arange(0, PB)
            v = tl.load(
                part_ptr + pr[:, None] * H + cols[None, :], mask=(pr < P)[:, None], other=0.0, cache_modifier=".cg"
            )
            tot += tl.sum(v, axis=0)
        tl.store(out_ptr + cols, tot.to(out_ptr.dtype.element_ty))


def pack_scales(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """bf16 scales and zeros as one int32 each: the scale's bits low, the zero's high."""
    lo = scales.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return lo | (zeros.contiguous().view(torch.int16).to(torch.int32) << 16)


class MLP:
    """One layer's int4 MLP weights as both paths take them: the library's, and blocked for ``P`` programs of ``C`` columns a step.

    ``gu_blk``: gate_up's rows in the order program ``p``'s steps read them, ``(P, T, [gate, up], C)``
    rows of K/2 bytes, where program p's columns are ``[pJ, pJ + J)`` then ``[I/2 + pJ, I/2 + pJ + J)``;
    ``gsz_blk`` their packed scales alike. ``dn_blk``: down as ``(P, H, J)``, program p's J bytes of
    every row in one run. ``dsz``: down's packed scales group-major, ``(I / G, H)``.
    """

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, group: int) -> None:
        self.group = group
        self.gu = reference.quantize_int4(gate_up, group)
        self.dn = reference.quantize_int4(down, group)
        self.hidden, self.inter = down.shape
        self.dsz = pack_scales(self.dn[1], self.dn[2]).t().contiguous()  # (I / G, H)
        self._blocked: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def blocked(self, p: int, c: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(gu_blk, gsz_blk, dn_blk)`` for P programs of C columns a step (made once)."""
        if (p, c) not in self._blocked:
            i2 = self.inter // 2
            j = i2 // p
            first = j * torch.arange(p).view(p, 1) + torch.arange(j).view(1, j)  # (P, J)
            cols = torch.cat([first, first + i2], dim=1).view(p, 2 * j // c, 1, c).to(self.gu[0].device)
            rows = torch.cat([cols, cols + self.inter], dim=2).reshape(-1)  # (P, T, 2, C)
            self._blocked[p, c] = (
                self.gu[0][rows].contiguous(),
                pack_scales(self.gu[1], self.gu[2])[rows].contiguous(),
                self.dn[0].view(self.hidden, p, j).permute(1, 0, 2).contiguous(),  # (P, H, J)
            )
        return self._blocked[p, c]

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        g = reference.int4_matmul(x, *self.gu, self.group)
        return reference.int4_matmul(reference.silu_and_mul(g), *self.dn, self.group)

    def library(self, x: torch.Tensor) -> torch.Tensor:
        from kernels.int4_matmul import int4_matmul

        return int4_matmul(int4_matmul(x, *self.gu, self.group, glu=True), *self.dn, self.group)


class Fused:
    """The launch of ``_mlp_kernel``: its config and scratch (``h``, partials, counters)."""

    def __init__(self, hidden: int, inter: int, device: torch.device, dtype: torch.dtype, **cfg: Any) -> None:
        self.cfg = dict(cfg)
        self.p = self.cfg.pop("P")
        self.warps = self.cfg.pop("warps")
        self.h = torch.empty(2 * inter * 4, device=device, dtype=torch.float32)  # (P, 4J, <= 4 quarters)
        self.part = torch.empty(self.p, hidden, device=device, dtype=torch.float32)
        self.cnt = torch.zeros(1, device=device, dtype=torch.int64)

    def __call__(self, mlp: MLP, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        k2 = x.shape[-1] // 2
        j = mlp.inter // 2 // self.p
        assert mlp.group % j == 0, (j, mlp.group)  # a slice in one group of each half
        assert j % 16 == 0, j  # whole 4-word vectors
        h2 = not interpreting()
        # the half2 loop reads a row in 512-byte quarters and leaves one fp32 sum a quarter in h
        assert not h2 or (k2 % 512 == 0 and 512 % mlp.group == 0), (k2, mlp.group)
        assert self.h.numel() >= 2 * mlp.inter * (k2 // 512 if h2 else 1), (self.h.numel(), k2)
        gu_blk, gsz_blk, dn_blk = mlp.blocked(self.p, self.cfg["C"])
        _mlp_kernel[(self.p,)](
            x, gu_blk, gsz_blk, dn_blk, mlp.dsz, self.h, self.part, self.cnt, out,
            K2=k2, INTER=mlp.inter, H=mlp.hidden, G=mlp.group, J=j, PP=next_pow2(self.p),
            H2=h2, num_warps=self.warps, **self.cfg, **pdl_args(x),
        )  # fmt: skip
        return out


def cpu_check() -> None:
    """The fp32 path under the interpreter against the reference, small shapes, two launches (the counters reset)."""
    torch.manual_seed(0)
    k, inter, hidden, group = 256, 1024, 128, 64
    mlp = MLP(torch.randn(2 * inter, k) / k**0.5, torch.randn(hidden, inter) / inter**0.5, group)
    for p, q in ((16, 1), (8, 1)):
        f = Fused(hidden, inter, torch.device("cpu"), torch.float32, P=p, warps=4, C=8, BR=32, Q=q, PB=8)
        for _ in range(2):
            x = torch.randn(k)
            got = f(mlp, x, torch.empty(hidden))
            ref = mlp.reference(x[None])[0]
            err = float((got - ref).norm() / ref.norm())
            print(f"P={p}: rel err {err:.2e}, counters {f.cnt.tolist()}")
            assert err < 1e-5, err
            assert f.cnt.item() % p == 0, f.cnt.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument(
        "--configs", default="224:8:2:512:64:256,224:8:2:256:64:256", help="P:warps:C:BR:Q:PB[:MODE[:DEPTH]],..."
    )
    ap.add_argument("--json", default="probe_int4_mlp.json")
    args = ap.parse_args()
    if args.cpu_check:
        cpu_check()
        return
    from bench.engine_gpu import SHAPES, graph_time_ms

    dims = {name: (n, k) for name, n, k in SHAPES["llama3-8b"].linear_dims()}
    (n_gu, k), (hidden, inter) = dims["gate_up"], dims["down"]
    torch.manual_seed(0)
    dev = torch.device("cuda")
    mlps = [
        MLP(torch.randn(n_gu, k, device=dev) / k**0.5, torch.randn(hidden, inter, device=dev) / inter**0.5, 128)
        for _ in range(args.layers)
    ]
    x0 = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    mb = sum(t.numel() * t.element_size() for m in mlps for t in (*m.gu, *m.dn)) / 1e6
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "layers": args.layers, "mb": mb, "runs": []}
    print(res)
    lib_outs: list[torch.Tensor] = []

    def library() -> None:
        lib_outs.clear()
        x = x0
        for m in mlps:
            x = m.library(x)
            lib_outs.append(x)

    variants: dict[str, Any] = {}
    for spec in args.configs.split(","):
        p, warps, c, br, q, pb, *rest = (int(v) for v in spec.split(":"))
        mode = rest[0] if rest else 7
        depth = rest[1] if len(rest) > 1 else 2
        f = Fused(hidden, inter, dev, torch.bfloat16, P=p, warps=warps, C=c, BR=br, Q=q, PB=pb, MODE=mode, DEPTH=depth)
        outs = [torch.empty(hidden, device=dev, dtype=torch.bfloat16) for _ in mlps]

        def fused(f: Fused = f, outs: list[torch.Tensor] = outs) -> None:
            x = x0[0]
            for m, o in zip(mlps, outs, strict=True):
                x = f(m, x, o)

        variants[spec] = (fused, outs)
    for rnd in range(2):
        t_lib = graph_time_ms(library) * 1e3
        res["runs"].append({"round": rnd, "library_us": t_lib})
        print(f"round {rnd}: library {t_lib:.1f} us ({t_lib / args.layers:.2f} a layer, {mb / t_lib:.3f} TB/s)")
        for spec, (fn, outs) in variants.items():
            t0 = time.time()
            us = graph_time_ms(fn) * 1e3
            errs = []
            for i in (0, 1, args.layers - 1):
                xin = x0 if i == 0 else outs[i - 1][None]
                ref = mlps[i].reference(xin).float()
                errs.append(float((outs[i].float() - ref[0]).norm() / ref.norm()))
            ref0 = mlps[0].reference(x0).float()
            lib_err = float((lib_outs[0].float() - ref0).norm() / ref0.norm())
            res["runs"].append({"round": rnd, "spec": spec, "us": us, "errs": errs, "library_err0": lib_err})
            print(
                f"  {spec}: {us:.1f} us ({us / args.layers:.2f} a layer, {mb / us:.3f} TB/s), errs {max(errs):.2e} "
                f"(library {lib_err:.2e}), {time.time() - t0:.0f} s"
            )
    with open(args.json, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
