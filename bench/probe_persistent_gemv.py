# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""GPU probe: a persistent int8 GEMV against the engine's, over the Llama-3-8B shapes at batch 1.

The engine's int8 GEMV launches one program per output tile, and each program loads a weight tile,
multiplies, then loads the next: between waves and within a program the memory system waits. Here
a fixed number of programs (a few a multiprocessor) walk their tiles' K steps as one flattened loop
that Triton's pipeliner (``tl.range(num_stages=...)``) keeps ``stages - 1`` weight tiles ahead of,
across tile boundaries too. Each shape is timed over 32 layers' distinct weights in one CUDA graph
(so they stream from HBM), the engine's default config against a grid of persistent configs, and
each persistent result is checked against the engine's output first.

    python -m bench.probe_persistent_gemv --json $OUT/probe_persistent_gemv.json
    TRITON_INTERPRET=1 python -m bench.probe_persistent_gemv --check   # the CPU, small shapes
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from kernels import quant_matmul, reference
from kernels._common import interpreting, num_sms, pdl_args, tl, triton
from kernels._matmul_launch import _load_x
from kernels.quant_matmul import _int8_to_f32

LAYERS = 32
SHAPES = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "down": (4096, 14336, True), "gate_up": (28672, 4096, False)}  # fmt: skip

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _int8_gemv_persistent(
        x_ptr,  # (M, K) activations, or (M, 2K) [gate | up] when GATED
        w_ptr,  # (N, K) int8
        s_ptr,  # (N,) per-row scales
        out_ptr,  # (M, N)
        N,
        K,
        sx_m,
        sw_n,
        so_m,
        GATED: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        STAGES: tl.constexpr,
        ASM: tl.constexpr = False,
        PDL: tl.constexpr = False,
    ):
        pid = tl.program_id(0)
        progs = tl.num_programs(0)
        row = tl.program_id(1)
        tiles = tl.cdiv(N, BLOCK_N)
        k_steps = tl.cdiv(K, BLOCK_K)
        mine = tl.cdiv(tiles - pid, progs)  # tiles pid, pid + progs, ...
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        pdl_enter(PDL)
        for i in tl.range(0, mine * k_steps, num_stages=STAGES):
            t = pid + (i // k_steps) * progs
            ks = i % k_steps
            rn = t * BLOCK_N + tl.arange(0, BLOCK_N)
            rk = ks * BLOCK_K + tl.arange(0, BLOCK_K)
            nmask = rn < N
            kmask = rk < K
            w = tl.load(w_ptr + rn[:, None] * sw_n + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0)
            x = _load_x(x_ptr + row * sx_m + rk, kmask, K, GATED).to(tl.float32)
            acc2 += _int8_to_f32(w, ASM) * x[None, :]
            if ks == k_steps - 1:
                s = tl.load(s_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
                acc = tl.sum(acc2, axis=1) * s
                tl.store(out_ptr + row * so_m + rn, acc.to(out_ptr.dtype.element_ty), mask=nmask)
                acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)


def persistent_int8(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    *,
    gated: bool,
    block_n: int,
    block_k: int,
    stages: int,
    progs: int,
    warps: int,
) -> torch.Tensor:
    """``x @ (q * s).T`` (SiLU-and-mul on x's halves first when ``gated``) by the persistent kernel."""
    n, k = q.shape
    m = x.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _int8_gemv_persistent[(progs, m)](
        x,
        q,
        s,
        out,
        n,
        k,
        x.stride(0),
        q.stride(0),
        out.stride(0),
        GATED=gated,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        STAGES=stages,
        ASM=not interpreting(),
        num_warps=warps,
        **pdl_args(x),
    )
    return out


def check_cpu() -> None:
    """The persistent kernel against the reference on irregular small shapes (under TRITON_INTERPRET=1)."""
    g = torch.Generator().manual_seed(0)
    for n, k, gated, bn, bk, progs in (
        (37, 100, False, 8, 32, 3),
        (16, 64, True, 4, 32, 5),
        (50, 96, False, 16, 64, 1),
    ):
        w = torch.randn(n, k, generator=g)
        q, s = reference.quantize_int8(w)
        x = torch.randn(2, 2 * k if gated else k, generator=g)
        want = reference.int8_matmul(reference.silu_and_mul(x) if gated else x, q, s)
        got = persistent_int8(x, q, s, gated=gated, block_n=bn, block_k=bk, stages=2, progs=progs, warps=1)
        err = (got - want).abs().max().item()
        print(f"n={n} k={k} gated={gated} bn={bn} bk={bk} progs={progs}: max abs err {err:.2e}")
        assert err < 1e-3, err


def probe_shape(n: int, k: int, gated: bool, sms: int) -> dict[str, object]:
    """The engine's default GEMV and every persistent config on one shape: us a layer, and each one's error."""
    from bench.engine_gpu import graph_time_ms

    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [
        reference.quantize_int8((torch.randn(n, k, generator=gen, device="cuda") * 0.02).to(torch.bfloat16))
        for _ in range(LAYERS)
    ]
    x = torch.randn(1, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
    engine = quant_matmul.int8_matmul(x, *ws[0], gated=gated)
    base_us = graph_time_ms(lambda: [quant_matmul.int8_matmul(x, q, s, gated=gated) for q, s in ws]) / LAYERS * 1e3
    tries: list[dict[str, object]] = []
    row: dict[str, object] = {"n": n, "k": k, "gated": gated, "engine_us": base_us, "tries": tries}
    print(f"{n}x{k}: engine {base_us:.2f} us", flush=True)
    best: tuple[float, str] | None = None
    for bn, bk, warps, stages, per_sm in itertools.product((2, 4, 8), (512, 1024), (2, 4), (3, 4), (4, 8, 16)):
        if not 4 * 32 * warps <= bn * bk <= 64 * 32 * warps:
            continue
        cfg = {"block_n": bn, "block_k": bk, "warps": warps, "stages": stages, "progs": per_sm * sms}

        def run(q: torch.Tensor, s: torch.Tensor, cfg: dict[str, int] = cfg) -> torch.Tensor:
            return persistent_int8(x, q, s, gated=gated, **cfg)

        try:
            err = (run(*ws[0]).float() - engine.float()).abs().max().item()
            us = graph_time_ms(lambda run=run: [run(q, s) for q, s in ws]) / LAYERS * 1e3  # type: ignore[misc]
        except Exception as e:  # noqa: BLE001 (a config the compiler rejects is reported and skipped)
            tries.append({**cfg, "error": str(e)[:200]})
            continue
        tries.append({**cfg, "us": us, "max_abs_err": err})
        if best is None or us < best[0]:
            best = (us, json.dumps(cfg))
    if best is not None:
        row["best_us"], row["best"] = best
        print(f"  persistent best {best[0]:.2f} us {best[1]}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="")
    ap.add_argument("--check", action="store_true", help="check the kernel on the CPU (TRITON_INTERPRET=1) and exit")
    ap.add_argument("--shapes", default="qkv,o,down")
    args = ap.parse_args()
    if args.check:
        check_cpu()
        return
    sms = num_sms(torch.device("cuda"))
    results: dict[str, object] = {"device": torch.cuda.get_device_name(), "sms": sms, "layers": LAYERS}
    for name in args.shapes.split(","):
        results[name] = probe_shape(*SHAPES[name], sms)
        torch.cuda.empty_cache()
        if args.json:  # after each shape: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
