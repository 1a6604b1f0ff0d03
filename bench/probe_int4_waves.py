# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: the int4 gate_up GEMV in one wave of programs, each taking several tiles, against the library's two waves.

The library's gate_up (8 rows x 1,024 bytes over 2 warps, 72 registers: 14 programs a
multiprocessor) launches 3,584 programs, about two waves; its second wave drains over the last
~7 us of 26.6 (``probe_handoff``'s timeline, 2026-11-28). Here the same loop (``_int4_h2_step``,
the same arithmetic, so the same bits) runs ``T`` tiles a program: 1,792 programs at ``T = 2`` fit
in one wave, all start at once, and no program starts late. Tiles are taken in strides of the grid
(``tile = pid + i * P``) or in runs (``tile = pid * T + i``). us a launch over the 32 layers'
[gate; up] weights in one CUDA graph with PDL, alternated with the library's launch in one process.
Outputs checked bit-equal against the library's.

    python -m bench.probe_int4_waves --json $OUT/probe_int4_waves.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.engine_gpu import SHAPES, graph_time_ms
from bench.gpu_decoder import Decoder
from kernels._common import pdl_args, tl, triton
from kernels._matmul_config import config_for
from kernels.int4_matmul import int4_matmul

GROUP = 128
"""The int4 group of the 8B weights timed."""

if triton is not None:
    from kernels._common import pdl_enter_after_wait
    from kernels.int4_gemv import _int4_h2_step, _word_tile

    @triton.jit
    def _waves_kernel(
        x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, N, K2, sw_n, ss_n,
        G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, T: tl.constexpr, RUNS: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        """``T`` GLU tiles of ``BLOCK_N`` [gate; up] rows each, one row of x; ``kernels.int4_matmul``'s half2 GEMV per tile."""
        pid = tl.program_id(0)
        P = tl.num_programs(0)
        NG: tl.constexpr = BLOCK_K // G
        pairs: tl.constexpr = BLOCK_N // 2
        r = tl.arange(0, BLOCK_N)
        pdl_enter_after_wait(PDL)
        for i in tl.static_range(T):
            tile = pid * T + i if RUNS else pid + i * P
            j = tile * pairs + r // 2  # the pair of each row: gate row j, up row j + N / 2
            rn = j + (r % 2) * (N // 2)
            nmask = j < N // 2
            w32 = w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None] * (sw_n // 4)
            acc2 = tl.zeros((BLOCK_N, NG), tl.float32)
            for k0 in range(0, K2, BLOCK_K):
                cw = _word_tile(w32, k0, K2, K2, nmask, BLOCK_K, G // 4, 1)
                acc2 = _int4_h2_step(acc2, cw, k0, K2, x_ptr, K2, s_ptr, z_ptr, rn, ss_n, nmask, G, 1)
            acc = tl.sum(acc2, axis=1)[None, :]  # (1, BLOCK_N)
            dt = out_ptr.dtype.element_ty
            a, b = tl.split(tl.reshape(acc.to(dt).to(tl.float32), (1, pairs, 2)))  # (1, pairs) each
            y = a / (1.0 + tl.exp(-a)) * b
            jp = tile * pairs + tl.arange(0, pairs)
            tl.store(out_ptr + jp[None, :], y.to(dt), mask=(jp < N // 2)[None, :])


def waves_gate_up(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int, t: int, runs: bool
) -> torch.Tensor:
    """``silu_and_mul(x @ W.T)`` for one row of x, ``t`` of the library's default tiles a program.

    The tile, step and warps are the launcher's own (``config_for``), which must be the plain half2
    loop this kernel runs (no tile in flight, no ``ahead``, one run). Capped at the library's 72
    registers a thread for that tile (80 uncapped; ptxas: no spills), so that 14 programs fit a
    multiprocessor as the library's do and 1,792 programs make one wave.
    """
    n, k2 = packed.shape
    cfg = config_for("int4", 1, n, 2 * k2, k2, group, x.device)
    if cfg.prefetch or cfg.ahead or cfg.runs != 1 or cfg.split_k != 1:
        raise ValueError(f"the default tile is not the plain half2 loop this probe runs: {cfg}")
    out = torch.empty((1, n // 2), dtype=x.dtype, device=x.device)
    tiles = n // cfg.block_n  # each block_n / 2 [gate; up] pairs
    assert tiles % t == 0
    _waves_kernel[(tiles // t,)](
        x, packed, scales, zeros, out, n, k2, packed.stride(0), scales.stride(0),
        G=group, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, T=t, RUNS=runs,
        num_warps=cfg.num_warps, maxnreg=72, **pdl_args(x),
    )  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", default="1,2,4", help="tiles a program")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dec = Decoder(SHAPES["llama3-8b"], "int4", GROUP)
    ws = [(w[0], w[1], w[2]) for w in (lay.gate_up.tensors for lay in dec.layers)]
    x = (torch.randn(1, 4096, device="cuda") * 0.5).to(torch.bfloat16)
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m bench.probe_int4_waves " + " ".join(f"--{k} {v}" for k, v in vars(a).items() if v),
    }
    want = int4_matmul(x, *ws[0], GROUP, glu=True)
    variants: dict[str, tuple[int, bool] | None] = {"library": None}
    for t in (int(v) for v in a.tiles.split(",")):
        for runs in (False, True) if t > 1 else (False,):
            variants[f"{t} tiles a program, {'runs' if runs else 'strided'}"] = (t, runs)
    checks = {}
    for name, v in variants.items():
        if v is not None:
            got = waves_gate_up(x, *ws[0], GROUP, *v)
            checks[name] = bool(torch.equal(got, want))
    print(f"bit-equal to the library: {checks}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(a.rounds):
        for name, v in variants.items():

            def run(v: tuple[int, bool] | None = v) -> None:
                for w in ws:
                    if v is None:
                        int4_matmul(x, *w, GROUP, glu=True)
                    else:
                        waves_gate_up(x, *w, GROUP, *v)

            times[name].append(graph_time_ms(run, 3) * 1e3 / len(ws))
        print({k: [round(t, 2) for t in v] for k, v in times.items()}, flush=True)
    res.update(checks=checks, us_a_launch=times, medians={k: statistics.median(v) for k, v in times.items()})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
