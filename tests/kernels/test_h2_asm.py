"""The half2 int4 GEMV's PTX (``kernels.int4_gemv._h2_asm``) run instruction by instruction on the CPU.

Triton's interpreter runs no inline PTX, so the CPU tests never reach ``_h2_dot``; the GPU tests do.
This executes the generated text with numpy (each f16x2 op rounded once to fp16, as the hardware
does) to check the arithmetic the docstring promises: for 4 packed words, the lanes of ``$0, $1``
sum ``(q - 8) x / 4`` over the low half's 16 columns and those of ``$2, $3`` over the high half's,
exact but for fp16 rounding, and finite up to the bound the NOTE gives.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from kernels.int4_gemv import _h2_asm


def _halves(v: int) -> np.ndarray:
    return np.array([v & 0xFFFF, v >> 16], dtype=np.uint16).view(np.float16)


def _word(h: np.ndarray) -> int:
    lo, hi = (int(b) for b in h.astype(np.float16).view(np.uint16))
    return lo | (hi << 16)


def _run(operands: dict[str, int]) -> list[float]:
    """Execute ``_h2_asm()`` with ``$4-$23`` given (uint32); return ``$0-$3`` as floats."""
    regs: dict[str, Any] = dict(operands)

    def val(tok: str) -> int:
        return int(tok, 16) if tok.startswith("0x") else int(regs[tok])

    def f16x2(op: str, args: list[str]) -> int:
        a, b = (_halves(val(t)).astype(np.float64) for t in args[:2])
        if op == "fma":
            r = a * b + _halves(val(args[2])).astype(np.float64)  # one rounding, as fma.rn
        else:
            r = {"sub": a - b, "mul": a * b, "add": a + b}[op]
        with np.errstate(over="ignore"):  # past 65504 is inf, as on the GPU
            return _word(r.astype(np.float16))

    for line in _h2_asm().strip("{}\n").split("\n"):
        op, _, rest = line.rstrip(";").partition(" ")
        if op.startswith(".reg"):
            continue
        if op == "mov.b32" and rest.startswith("{"):
            h0, h1, src = re.findall(r"[\w$]+", rest)
            regs[h0], regs[h1] = _halves(val(src))
            continue
        dst, *args = (t.strip() for t in rest.split(","))
        if op == "mov.b32":
            regs[dst] = val(args[0])
        elif op == "lop3.b32":
            assert args[3] == "0xEA"  # (a & b) | c
            regs[dst] = (val(args[0]) & val(args[1])) | val(args[2])
        elif op == "shr.u32":
            regs[dst] = val(args[0]) >> int(args[1])
        elif op == "cvt.f32.f16":
            regs[dst] = float(regs[args[0]])
        else:
            name = op.split(".")[0]
            assert op.endswith("f16x2"), op
            regs[dst] = f16x2(name, args)
    return [float(regs[f"${i}"]) for i in range(4)]


def _operands(q: np.ndarray, x: np.ndarray) -> dict[str, int]:
    """``$4-$23`` for one row's 4 words: ``q`` (2, 16) nibbles (low, high half), ``x`` (2, 16) its x."""
    packed = (q[0] | (q[1] << 4)).astype(np.uint8)  # byte j: column j low, column j + K/2 high
    words = packed.view("<u4")  # (4,)
    ops = {f"${4 + c}": int(w) for c, w in enumerate(words)}
    for half, scale in ((0, 0.25), (1, 0.25 / 16)):
        h = (x[half] * scale).astype(np.float16).reshape(4, 4)  # (word, byte)
        for j, (first, second) in enumerate(((0, 2), (1, 3))):  # xa / xb, then xc / xd
            for c in range(4):
                ops[f"${8 + 4 * (2 * half + j) + c}"] = _word(h[c, [first, second]])
    return ops


@pytest.mark.parametrize("seed", range(8))
def test_h2_asm_sums_q_minus_8_times_x_over_4_by_half(seed):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, size=(2, 16)).astype(np.uint32)
    x = rng.standard_normal((2, 16)).astype(np.float32) * 3.0
    out = _run(_operands(q, x))
    want = ((q.astype(np.float64) - 8.0) * x).sum(axis=1) / 4.0  # (low, high)
    got = np.array([out[0] + out[1], out[2] + out[3]])
    # fp16: x rounded to 11 bits, each lane's 8 products summed in fp16
    tol = 2e-3 * np.abs((q - 8.0) * x).sum(axis=1) / 4.0
    assert np.all(np.abs(got - want) <= tol), (got, want, tol)


def test_h2_asm_lanes_are_the_column_pairs_the_x_pairs_name():
    """Lane 0 of the low sums holds columns 4c and 4c+1 of each word, lane 1 columns 4c+2 and 4c+3."""
    q = np.full((2, 16), 9, dtype=np.uint32)  # q - 8 = 1 everywhere
    x = np.zeros((2, 16), dtype=np.float32)
    x[0, [0, 1, 4, 5, 8, 9, 12, 13]] = 1.0  # lane 0's columns of the low half
    x[1, [2, 3, 6, 7, 10, 11, 14, 15]] = 2.0  # lane 1's columns of the high half
    assert _run(_operands(q, x)) == [2.0, 0.0, 0.0, 4.0]  # 8 x 1 / 4 and 8 x 2 / 4


@pytest.mark.parametrize(("magnitude", "finite"), [(4094.0, True), (4200.0, False)])
def test_h2_asm_stays_finite_up_to_the_documented_bound(magnitude, finite):
    """8 products of |q - 8| = 8 and x / 4 in one lane: 8 * 8 * |x| / 4 < 65504 up to |x| = 4,094."""
    q = np.zeros((2, 16), dtype=np.uint32)  # q - 8 = -8
    x = np.full((2, 16), magnitude, dtype=np.float32)
    out = _run(_operands(q, x))
    assert all(np.isfinite(out)) == finite
