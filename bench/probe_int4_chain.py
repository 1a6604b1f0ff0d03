# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: a chain of dependent int4 GEMVs in one persistent kernel whose weights stream through the boundaries.

``bench.probe_int4_mma`` found that a batch-1 GEMV loses 3.5-5.4 us at its edges (the PDL wait, x,
its last programs) while its weights do not stream, and that a second chain of GEMVs on another
stream fills those edges (two chains within 4-5 % of the copy ceiling). A decode step has no second
chain, but its weights do not depend on x. This probe asks whether one chain can fill its own edges:
``y_i = W_i x_i`` with ``x_{i+1} = y_i[:K]``, L times, in one launch of one program a multiprocessor.

Each program owns the same ``2X`` rows of every ``W_i`` and streams its tiles (``2X`` rows x 128
bytes, one step) into a ring of shared memory by TMA, ``STAGES`` ahead, whatever GEMV they belong
to: the ring runs on into ``W_{i+1}`` while GEMV ``i`` waits for its x. Only the arithmetic waits:
before GEMV ``i`` a program spins until all programs have counted ``i - 1`` done (an acquire load of
a counter their releases raise), then makes x's pairs (``_x_pairs``) and runs the steps as
``bench.probe_int4_mma_kernels._tma_kernel`` does. Needs every program resident at once (one a
multiprocessor, grid <= SMs): they wait on each other.

Times the chain against the library's GEMVs launched one by one with PDL in a CUDA graph over the
same weights (each output feeding the next input), checks every link against ``kernels.reference``
on the input it was given.

    python -m bench.probe_int4_chain --json $OUT/probe_int4_chain.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench.engine_gpu import graph_time_ms
from bench.gpu_decoder import QLinear
from bench.probe_int4_mma_kernels import STEP, X_SMEM, _group_scales, _ring_take, _step, _step_view, _x_pairs
from kernels import reference
from kernels.int4_matmul import int4_matmul

if TYPE_CHECKING:
    from bench.probe_int4_mma import Weight


@gluon.jit
def _spin_until(cnt_ptr, target):
    """Spin until the int32 at ``cnt_ptr`` reaches ``target`` (acquire: what its releasers wrote is then visible)."""
    seen = gl.atomic_add(cnt_ptr, 0, sem="acquire")
    while seen < target:
        seen = gl.atomic_add(cnt_ptr, 0, sem="acquire")


@gluon.jit
def _chain_kernel(
    w_desc, x_ptr, y_ptr, s_ptr, z_ptr, cnt_ptr, N, K2, ss_n, L,
    NSTEP: gl.constexpr,  # steps a row: K / 2 / STEP
    NSTEP_P: gl.constexpr,
    WARPS: gl.constexpr,
    STAGES: gl.constexpr,
    SUB: gl.constexpr,  # _mma_asm's q - 8 in fp16 (else 1024 + q, the offset taken out in fp32)
):  # fmt: skip
    """``y[i] = W_i x_i`` for ``i < L`` (``x_0`` at ``x_ptr``, then ``y[i - 1][:K]``); ``cnt`` (L,) zeros at launch."""
    X: gl.constexpr = 8 * WARPS
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    row0 = pid * (2 * X)
    top = row0 + gl.arange(0, X, layout=gl.SliceLayout(1, BL))  # the tile's rows 0..X-1; X..2X-1 below
    bot = top + X
    tmask = top < N
    bmask = bot < N
    total = L * NSTEP  # tiles this program streams, GEMV by GEMV
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES, 2 * X, 32], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_s = gl.allocate_shared_memory(gl.int64, [NSTEP_P, 32], X_SMEM)
    cd_s = gl.allocate_shared_memory(gl.int64, [NSTEP_P, 32], X_SMEM)
    ab_v = _step_view(ab_s, NSTEP_P)
    cd_v = _step_view(cd_s, NSTEP_P)
    for j in gl.static_range(STAGES):
        mbarrier.init(bars.index(j), count=1)
    for j in gl.static_range(STAGES):
        if j < total:
            mbarrier.expect(bars.index(j), 2 * X * STEP)
            tma.async_copy_global_to_shared(
                w_desc, [(j // NSTEP) * N + row0, (j % NSTEP) * 32], bars.index(j), bufs.index(j)
            )
    for i in range(L):
        x_i = x_ptr
        if i > 0:
            _spin_until(cnt_ptr + i - 1, P)
            x_i = y_ptr + (i - 1) * N
        ab, cd = _x_pairs(x_i, 0, K2, NSTEP, NSTEP_P, WARPS)
        gl.thread_barrier()  # every lane is done with the last GEMV's pairs
        ab_s.store(ab)
        cd_s.store(cd)
        gl.thread_barrier()
        s_i = s_ptr + i * N * ss_n
        z_i = z_ptr + i * N * ss_n
        sc = _group_scales(s_i, z_i, top, bot, ss_n, 0, K2 // STEP, tmask, bmask)
        acc = gl.zeros([X, 32], gl.float32, BL)
        for s in range(NSTEP):
            t = i * NSTEP + s  # this program's tile number
            wt, wb = _ring_take(bufs, bars, t, X, BL, STAGES)
            st = t % STAGES
            nj = t + STAGES
            if nj < total:  # the ring runs on, into the next GEMV's weights if need be
                mbarrier.expect(bars.index(st), 2 * X * STEP)
                tma.async_copy_global_to_shared(
                    w_desc, [(nj // NSTEP) * N + row0, (nj % NSTEP) * 32], bars.index(st), bufs.index(st)
                )
            csc = sc
            more = s + 1 < NSTEP
            sc = _group_scales(s_i, z_i, top, bot, ss_n, s + 1, K2 // STEP, tmask & more, bmask & more)
            acc += _step(wt, wb, ab_v.index(s).load(BL), cd_v.index(s).load(BL), csc, SUB)
        cols = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, BL)), 0)
        pos = cols % 4
        tsum = gl.sum(gl.where(pos == 0, acc, 0.0), axis=1) * 0.25
        bsum = gl.sum(gl.where(pos == 1, acc, 0.0), axis=1) * 0.25
        gl.store(y_ptr + i * N + top, tsum.to(y_ptr.dtype.element_ty), mask=tmask)
        gl.store(y_ptr + i * N + bot, bsum.to(y_ptr.dtype.element_ty), mask=bmask)
        gl.thread_barrier()  # every lane's stores before the release
        gl.atomic_add(cnt_ptr + i, 1, sem="release")


def check_resident(smem_bytes: int, per_sm: int) -> None:
    """Raise unless ``per_sm`` programs of ``smem_bytes`` shared memory fit a multiprocessor together.

    The persistent kernels' programs wait on each other: one not resident never runs, and the rest
    spin forever (a launch with 2 x 128 KB a multiprocessor on the H100 hung so).
    """
    props = torch.cuda.get_device_properties(0)
    per_mp = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    if per_sm * (smem_bytes + 1024) > per_mp:  # 1 KB a block the hardware keeps for itself
        raise ValueError(f"{per_sm} programs of {smem_bytes} B shared memory do not fit a multiprocessor's {per_mp} B")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", type=int, default=32, help="GEMVs in the chain")
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--per-sm", type=int, default=1, help="programs a multiprocessor (all must be resident)")
    ap.add_argument("--sub", type=int, default=1, help="1: q - 8 in fp16; 0: 1024 + q, the offset out in fp32")
    ap.add_argument("--stages", default="4,8,12", help="ring depths to try")
    ap.add_argument("--json", default="bench/results/probe_int4_chain.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    programs = torch.cuda.get_device_properties(0).multi_processor_count * args.per_sm
    rows = 16 * args.warps
    n, k, links = programs * rows, args.k, args.links  # one tile a program
    ws: list[Weight] = []
    for _ in range(links):  # std 1 / sqrt(K): the chain's values keep their size
        packed, scales, zeros = QLinear((torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16), "int4", 128).tensors  # fmt: skip
        ws.append((packed, scales, zeros))
    words = torch.cat([w[0] for w in ws]).view(torch.int32)  # (L N, K / 8)
    scales = torch.cat([w[1] for w in ws])
    zeros = torch.cat([w[2] for w in ws])
    x0 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    mb = sum(t.numel() * t.element_size() for w in ws for t in w) / 1e6
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
    res.update({"n": n, "k": k, "links": links, "mb": mb, "streaming_us_at_3tbs": mb / 3.0})
    res.update({"warps": args.warps, "programs": programs, "sub": bool(args.sub)})

    outs: list[torch.Tensor] = []

    def library() -> None:  # each output's first K columns are the next input, as they lie (no copy)
        outs.clear()
        x = x0
        for w in ws:
            outs.append(int4_matmul(x, *w, 128))
            x = outs[-1][:, :k]

    def errors(y: list[torch.Tensor]) -> list[float]:
        out = []
        for i, w in enumerate(ws):
            x = (x0 if i == 0 else y[i - 1][:, :k]).float()
            ref = reference.int4_matmul(x, *w, 128)
            out.append(float((y[i].float() - ref).norm() / ref.norm()))
        return out

    library()
    res["library_err_max"] = max(errors(outs))
    res["library_us"] = [graph_time_ms(library) * 1e3 for _ in range(3)]
    print(
        f"{links} x ({n} x {k}), {mb:.0f} MB, {mb / 3.0:.0f} us at 3 TB/s; library {res['library_us']} us", flush=True
    )
    cnt = torch.zeros(links, dtype=torch.int32, device="cuda")
    steps = k // 2 // STEP.value
    res["chain"] = {}
    for stages in (int(s) for s in args.stages.split(",")):
        check_resident(stages * rows * STEP.value + 2 * steps * 32 * 8, args.per_sm)
        lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
        desc = TensorDescriptor.from_tensor(words, [rows, 32], lay)
        yc = torch.empty(links, n, device="cuda", dtype=torch.bfloat16)

        def chain(desc: Any = desc, yc: torch.Tensor = yc, stages: int = stages) -> None:
            cnt.zero_()
            _chain_kernel[(programs,)](
                desc, x0, yc, scales, zeros, cnt, n, k // 2, scales.shape[1], links,
                NSTEP=steps, NSTEP_P=steps, WARPS=args.warps, STAGES=stages, SUB=bool(args.sub),
                num_warps=args.warps,
            )  # fmt: skip

        chain()
        torch.cuda.synchronize()
        err = max(errors([yc[i : i + 1] for i in range(links)]))
        us = [graph_time_ms(chain) * 1e3 for _ in range(3)]  # the counters' zeroing and the launch, in a graph
        res["chain"][stages] = {"err_max": err, "us": us}
        print(f"chain, {stages} stages: {us} us, max rel err {err:.2e}", flush=True)
    res["library_us_after"] = [graph_time_ms(library) * 1e3 for _ in range(2)]
    print(f"library again: {res['library_us_after']}")
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
