# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Greedy picks: the index of each row's largest score, in one launch spread over the whole GPU.

A row of a large vocabulary (128,256 scores for Llama 3) is cut into tiles of a few thousand
scores, one program each; every program writes its tile's best, and the last of a row's programs
to arrive (an arrival counter per row, as split-K uses) picks the row's best among them. torch's
argmax (its generic reduction kernel) took 33-38 us a decode step on the H100 over that vocabulary
(the 8B bench's profile, 2026-11-25); this kernel 3.9 us (2026-11-26).

Owns the Triton kernel and its launcher; semantics are ``kernels.reference.argmax`` (torch's:
the first index of the maximum, a NaN counting as the maximum), which the launcher falls back to
where no kernel can run. Does not own sampling (``selfhost.sampling``).
"""

from __future__ import annotations

import torch

from kernels import reference
from kernels._common import (
    arrival_counters,
    can_launch,
    check,
    check_dtype,
    check_last_contiguous,
    next_pow2,
    pdl_args,
    tl,
    triton,
)

BLOCK = 4096
"""Scores a program reads (fewer for a smaller row)."""

if triton is not None:
    from kernels._common import pdl_enter

    @triton.jit
    def _order_key(x):
        """fp32 -> int32 keys in the order of the values; -0.0 equals +0.0 and a NaN beats every number."""
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 -> +0.0
        # negative floats order backwards in their low 31 bits: flipping them orders them as integers
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        return tl.where(x != x, 2147483647, key)

    @triton.jit
    def _best(keys, idx):
        """The largest key and the smallest index holding it."""
        top = tl.max(keys, 0)
        return top, tl.min(tl.where(keys == top, idx, 2147483647), 0)

    # NOTE(h7): the row count is not specialised on. The sampler runs this kernel outside the step's
    # CUDA graph, on as many rows as the step samples. Specialised (B == 1, B % 16 == 0), the first
    # 129-row step of a SmolLM2 engine process (128 decodes and a prompt's last chunk) stopped
    # 258 ms for a compile on a fresh H100 machine, and 3-4 ms in each later process for the cached
    # variant's load (2026-12-06, docs/benchmarks.md). B only offsets the partials.
    @triton.jit(do_not_specialize=["B"])
    def _argmax_kernel(
        x_ptr,  # (B, V) scores
        out_ptr,  # (B,) int64 picks
        part_ptr,  # (2, B, P) int32: each program's best key, then its index
        cnt_ptr,  # (B,) arrival counters, zero between launches
        stride_x,  # row stride of x
        B,  # rows
        V,  # scores a row
        P,  # programs a row
        BLOCK: tl.constexpr,  # scores a program
        BLOCK_P: tl.constexpr,  # power of two >= P
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels._common.pdl_args)
    ):
        pdl_enter(PDL)
        row = tl.program_id(0)
        pid = tl.program_id(1)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        inside = offs < V
        x = tl.load(x_ptr + row * stride_x + offs, mask=inside, other=0.0).to(tl.float32)
        # below every real key (-inf's is -2139095041), so padding never wins
        keys = tl.where(inside, _order_key(x), -2147483648)
        top, idx = _best(keys, offs)
        if P == 1:
            tl.store(out_ptr + row, idx.to(tl.int64))
        else:
            tl.store(part_ptr + row * P + pid, top)
            tl.store(part_ptr + (B + row) * P + pid, idx)
            # NOTE(h7): the partial stores must precede the release of the counter increment
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel")
            if arrived == P - 1:
                ps = tl.arange(0, BLOCK_P)
                pmask = ps < P
                # .cg: other multiprocessors wrote these; skip this one's L1
                tops = tl.load(part_ptr + row * P + ps, mask=pmask, other=-2147483648, cache_modifier=".cg")
                idxs = tl.load(part_ptr + (B + row) * P + ps, mask=pmask, other=2147483647, cache_modifier=".cg")
                _, pick = _best(tops, idxs)
                tl.store(out_ptr + row, pick.to(tl.int64))
                tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed")  # as in kernels._matmul_launch._store_tile


def argmax(x: torch.Tensor, out: torch.Tensor | None = None, *, pdl: bool = True) -> torch.Tensor:
    """``(B, V) -> (B,)`` int64: each row's first index of its maximum (``torch.argmax(x, -1)``).

    Args:
        x: ``(B, V)`` scores, fp32, fp16 or bf16, contiguous along V.
        out: where to write the picks, a ``(B,)`` int64 tensor on x's device (a CUDA graph's static
            ids, say); a new tensor when None.
        pdl: launch with programmatic dependent launch (``kernels._common.pdl_args``) where the
            device has it: inside a step, after the kernel that wrote x; off after a graph replay.

    Raises:
        ValueError: x is not 2-D with at least one column, has an unsupported dtype, or ``out`` does
            not fit (shape, dtype, device, or a strided view).
    """
    check(x.dim() == 2 and x.shape[1] >= 1, f"x must be (B, V) with V >= 1, got {tuple(x.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)
    rows, vocab = x.shape
    if out is None:
        out = torch.empty(rows, dtype=torch.long, device=x.device)
    check(
        out.shape == (rows,) and out.dtype == torch.long,
        f"out must be ({rows},) int64, got {tuple(out.shape)} {out.dtype}",
    )
    check(out.device == x.device, f"out must be on {x.device}, got {out.device}")
    check(out.is_contiguous(), f"out must be contiguous, got stride {out.stride()}")
    if not can_launch(x):
        return out.copy_(reference.argmax(x))
    check_last_contiguous("x", x)
    check(vocab < 2**31, f"rows of at most 2^31 - 1 scores, got {vocab}")
    if rows == 0:
        return out
    block = min(BLOCK, next_pow2(vocab))
    programs = -(-vocab // block)
    part = torch.empty((2, rows, programs), dtype=torch.int32, device=x.device)
    _argmax_kernel[(rows, programs)](
        x,
        out,
        part,
        arrival_counters(x.device, rows),
        x.stride(0),
        rows,
        vocab,
        programs,
        BLOCK=block,
        BLOCK_P=next_pow2(programs),
        num_warps=4 if block >= 1024 else 1,
        **(pdl_args(x) if pdl else {}),
    )
    return out
