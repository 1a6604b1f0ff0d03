"""Compile every Triton kernel for the H100 (sm_90) on a host with no GPU: ``python -m tests.kernels.sm90_build``.

The CPU tests run the kernels under Triton's interpreter, which accepts code the compiler rejects
(an early ``return`` before constexpr-dead code, for one, once cost a GPU session). This builds
each kernel to a cubin, with the constexpr variants its launcher uses, through Triton's own
compiler and bundled ptxas; no driver is needed. Pointers and integer arguments are marked
16-divisible, as Triton's launcher specializes them for the models' shapes, so the vectorized
loads are what gets built. Each case also reports its registers a thread (``ptxas -v``): a GEMV
that doubled them halved its occupancy once (``kernels.int4_matmul``'s note), and its shared
memory, which Triton's pipeline stages multiply. Must run without ``TRITON_INTERPRET`` (the
decorator reads it at import). Prints one line per case and exits 1 if any failed, spilled
registers or took more shared memory than an sm_90 block may. ``--sass PATTERN`` builds only the
cases whose name matches and prints their SASS opcode counts (the bundled ``nvdisasm``), the whole
kernel's and one pass of each loop's: how many instructions a change to a loop takes or adds, read
without a GPU.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from kernels._matmul_config import Kind

TARGET = ("cuda", 90, 32)
MAX_SHARED_BYTES = 227 * 1024
"""The most shared memory one block can take on sm_90; a build past it compiles but fails to launch."""


def _signature(fn: Any, consts: dict[str, Any], types: dict[str, str]) -> dict[str, str]:
    """Every argument's type: constexprs as such, ``types`` where given, pointers bf16, other scalars i32."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        else:
            sig[name] = types.get(name, "*bf16" if name.endswith("_ptr") else "i32")
    return sig


def _attrs(fn: Any, sig: dict[str, str]) -> dict[tuple[int, ...], list[list[object]]]:
    """``tt.divisibility`` 16 on every pointer and integer argument (the launcher's usual specialization)."""
    return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n][0] in "*i"}


def _bundled(tool: str) -> Path:
    """A CUDA tool that ships with Triton (``ptxas``, ``nvdisasm``)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool


def _registers(ptx: str) -> tuple[int, int]:
    """(registers a thread, bytes of spill stores) of one kernel's PTX, from the bundled ptxas."""
    ptxas = _bundled("ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run(  # noqa: S603 (Triton's own ptxas)
            [str(ptxas), f"-arch=sm_{TARGET[1]}a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else 0


_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
"""An instruction's opcode in ``nvdisasm -c`` output: "/*0040*/  @!P0 IMAD.MOV.U32 R1, ..." -> IMAD."""


def _sass(cubin: bytes) -> str:
    """A cubin's SASS, from the bundled nvdisasm."""
    nvdisasm = _bundled("nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run(  # noqa: S603 (Triton's own nvdisasm)
            [str(nvdisasm), "-c", str(path)], capture_output=True, text=True, check=True
        ).stdout


def _opcodes(sass: str) -> Counter[str]:
    """Opcode counts of SASS text (``IMAD.MOV.U32`` counts as ``IMAD``)."""
    return Counter(_OPCODE.findall(sass))


def _loops(sass: str) -> list[tuple[str, Counter[str]]]:
    """Each loop of the SASS, in the order they close: its label and the opcode counts of one pass.

    A loop runs from a label to a branch back to it; a pass is what lies between, the branch included.
    The branch to itself after a kernel's last ``EXIT`` is no loop.
    """
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i - 1:
            loops.append((m.group(1), _opcodes("\n".join(lines[labels[m.group(1)] : i + 1]))))
    return loops


def _top(ops: Counter[str]) -> str:
    """``N instructions; OP n, ...`` of the 12 most frequent."""
    return f"{sum(ops.values())} instructions; " + ", ".join(f"{op} {n}" for op, n in ops.most_common(12))


class Case(NamedTuple):
    """One kernel variant: its constexprs, argument types (beyond ``_signature``'s defaults) and warps."""

    name: str
    fn: Any
    consts: dict[str, Any]
    types: dict[str, str]
    warps: int = 4
    max_registers: int = 0
    """Triton's ``maxnreg`` (0: none), as the launcher passes it."""
    stages: int = 3
    """Triton's ``num_stages``, as the launcher passes it."""


def _default(kind: Kind, rows: int, n: int, k_iter: int, group: int) -> tuple[dict[str, Any], int, bool, int]:
    """The launcher's default tile of a matmul on the H100 (132 multiprocessors): constexprs, warps, prefetch, pairs' register cap."""
    from kernels._matmul_config import default_config

    cfg = default_config(kind, rows, n, k_iter, group, interp=False, sms=132)
    tile: dict[str, Any] = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}
    if kind == "int4":
        tile["AHEAD"] = cfg.ahead
        tile["R"] = cfg.runs
    return tile, cfg.num_warps, cfg.prefetch, cfg.pairs_registers


def _words_a_thread(ttgir: str) -> list[int]:
    """Contiguous elements a thread of ``kernels.int4_gemv._h2_dot``'s result (its half2 FMAs, 4 words a call).

    A blocked layout says it in ``sizePerThread``; a linear one (a tile of ``Config.runs``) in its
    leading register bases, each doubling the run along the last dimension.
    """
    out = []
    for line in ttgir.splitlines():
        if "packed_element = 4" in line and "fma.rn.f16x2" in line:
            layout = re.search(r"-> tensor<[0-9x]+xf32, (#\w+)>", line)
            assert layout, line
            attr = re.search(rf"^{layout.group(1)} = (.*)$", ttgir, re.M)
            assert attr, layout.group(1)
            blocked = re.search(r"sizePerThread = \[([0-9, ]+)\]", attr.group(1))
            if blocked:
                out.append(int(blocked.group(1).split(",")[-1]))
                continue
            bases = re.search(r"register = \[(.*?)\], lane", attr.group(1))
            assert bases, attr.group(1)
            run = 1
            for base in re.findall(r"\[([0-9, ]+)\]", bases.group(1)):
                *lead, last = (int(v) for v in base.split(","))
                if any(lead) or last != run:
                    break
                run *= 2
            out.append(run)
    return out


def cases() -> list[Case]:
    """The variants the launchers use, with their default configs' tile sizes and warps (the 8B down projection's)."""
    import itertools

    import torch

    from kernels import (
        activation,
        argmax,
        dense_gemv,
        int4_gemv,
        int4_matmul,
        paged_attention,
        paged_prefill,
        quant_matmul,
        rmsnorm,
        rope_kv,
    )

    rope = {"pos_ptr": "*i64", "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
    mm = {"part_ptr": "*fp32", "cnt_ptr": "*i32", "s_ptr": "*fp32", "z_ptr": "*fp32", **rope}
    mm |= {"pa_ptr": "*i32", "pb_ptr": "*i32", "xs_ptr": "*fp32"}  # the int4 GEMV's x as XPairs
    gemv = {"GEMV": True, "DOT_F32": False, "ASM": True, "PDL": True, "ROPE": 0}
    tiled = {"GEMV": False, "DOT_F32": False, "ASM": True, "PDL": True, "ROPE": 0}
    n, k = 4096, 14336  # the 8B down projection
    gu_n, gu_k = 28672, 4096  # the 8B [gate; up], SiLU-and-mul applied as its tiles are written
    qkv_n = 6144  # the 8B [q; k; v], rotary and the KV write applied as its tiles are written
    out = []
    for small in (False, True):  # the 8B qkv's epilogue (half a head 64) and SmolLM2's (32)
        rn, rk, half = (960, 576, 32) if small else (qkv_n, gu_k, 64)
        for fn, kind, w in (
            (quant_matmul._int8_kernel, "int8", "*i8"),
            (int4_matmul._int4_kernel, "int4", "*u8"),
            (dense_gemv._dense_gemv_kernel, "dense", "*bf16"),
        ):
            tile, warps, prefetch, _ = _default(
                kind, 1, rn, rk // 2 if kind == "int4" else rk, 32 if kind == "int4" else 0
            )
            c = {**gemv, **tile, "GLU": False, "ROPE": half, "PREFETCH": prefetch}
            if kind == "int4":
                c.update(G=32, EXACT=False, H2=rk // 2 >= int4_gemv.HALF2_MIN_BYTES)
            elif kind == "int8":
                c["G"] = 0
            else:
                del c["ASM"]
            out.append(Case(f"{kind} gemv rope {rn}x{rk}", fn, c, {**mm, "w_ptr": w}, warps))
    for g in (0, 128):
        w8 = {**mm, "w_ptr": "*i8"}
        kind: Kind = "int8g" if g else "int8"
        for rows, cols, glu in ((n, k, False), (gu_n, gu_k, True)):
            tile, warps, prefetch, _ = _default(kind, 1, rows, cols, g)
            c = {**gemv, **tile, "G": g, "GLU": glu, "PREFETCH": prefetch}
            out.append(Case(f"int8 gemv G={g} glu={glu}", quant_matmul._int8_kernel, c, w8, warps))
        tile, warps, _, _ = _default(kind, 64, n, k, g)
        out.append(
            Case(f"int8 tiled G={g}", quant_matmul._int8_kernel, {**tiled, **tile, "G": g, "GLU": False}, w8, warps)
        )
    for small_n, small_k, glu in ((960, 576, False), (576, 1536, False), (3072, 576, True)):  # SmolLM2's int8
        tile, warps, prefetch, _ = _default("int8", 1, small_n, small_k, 0)
        c = {**gemv, **tile, "G": 0, "GLU": glu, "PREFETCH": prefetch}
        out.append(Case(f"int8 gemv {small_n}x{small_k}", quant_matmul._int8_kernel, c, {**mm, "w_ptr": "*i8"}, warps))
    w4 = {**mm, "w_ptr": "*u8"}
    tile, warps, _, regs = _default("int4", 1, n, k // 2, 128)
    loads = [
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (False, True, True),
        (False, False, True),
    ]
    for exact, prefetch, ahead in loads:  # int4 leaves the tile in flight and ``ahead`` to tuning
        c = {**gemv, **tile, "G": 128, "GLU": False, "EXACT": exact, "H2": not exact}
        c.update(PREFETCH=prefetch, AHEAD=ahead)
        name = f"int4 gemv exact={exact} prefetch={prefetch} ahead={ahead}"
        out.append(Case(name, int4_matmul._int4_kernel, c, w4, warps))
    c = {**gemv, **tile, "G": 128, "GLU": False, "EXACT": False, "H2": True, "PREFETCH": True, "AHEAD": True}
    out.append(Case("int4 gemv pairs (down's tile)", int4_matmul._int4_kernel, {**c, "XP": True}, w4, warps, regs))
    tile, warps, prefetch, regs = _default("int4", 1, qkv_n, gu_k // 2, 128)
    c = {**gemv, **tile, "G": 128, "GLU": False, "EXACT": False, "H2": True, "PREFETCH": prefetch, "XP": True}
    out.append(Case("int4 gemv pairs (qkv's tile)", int4_matmul._int4_kernel, c, w4, warps, regs))
    tile, warps, prefetch, regs = _default("int4", 1, gu_n, gu_k // 2, 128)
    c = {**gemv, **tile, "G": 128, "GLU": True, "EXACT": False, "H2": True, "PREFETCH": prefetch}
    out.append(Case("int4 gemv glu", int4_matmul._int4_kernel, c, w4, warps))
    out.append(Case("int4 gemv glu pairs", int4_matmul._int4_kernel, {**c, "XP": True}, w4, warps, regs))
    for bn, bk, warps in ((16, 128, 4), (4, 512, 4), (2, 1024, 2)):  # the smallest tiles takes_half2 lets in
        c = {**gemv, "BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "G": 32, "GLU": False, "EXACT": False, "H2": True}
        for ahead, runs in ((False, 1), (True, 1), (True, 2)):  # runs: 2 of GGUF's 8-word groups a thread
            name = f"int4 gemv half2 {bn}x{bk} ahead={ahead} runs={runs}"
            c_run = {**c, "PREFETCH": True, "AHEAD": ahead, "R": runs}
            out.append(Case(name, int4_matmul._int4_kernel, c_run, w4, warps))
    for small_n, small_k in ((576, 1536), (49152, 576)):  # SmolLM2's down and LM head, GGUF's group of 32
        tile, warps, prefetch, _ = _default("int4", 1, small_n, small_k // 2, 32)
        c = {**gemv, **tile, "G": 32, "GLU": False, "EXACT": False, "H2": False, "PREFETCH": prefetch}
        out.append(Case(f"int4 gemv {small_n}x{small_k}", int4_matmul._int4_kernel, c, w4, warps))
    tile, warps, _, _ = _default("int4", 64, n, k // 2, 128)
    c = {**tiled, **tile, "G": 128, "GLU": False, "EXACT": False}
    out.append(Case("int4 tiled", int4_matmul._int4_kernel, c, w4, warps))
    for rows, cols, glu in ((n, k, False), (gu_n, gu_k, True)):
        tile, warps, prefetch, _ = _default("dense", 1, rows, cols, 0)
        c = {**gemv, **tile, "GLU": glu, "PREFETCH": prefetch}
        del c["ASM"]
        out.append(Case(f"dense glu={glu}", dense_gemv._dense_gemv_kernel, c, mm, warps))
    attn = {
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
        "table_ptr": "*i32",
        "lens_ptr": "*i32",
        "scale_log2": "fp32",
    }
    for g, hd in ((4, 128), (3, 64)):
        c = {
            "G": g,
            "HD": hd,
            "BS": 16,
            "BLOCK_G": 16,
            "BLOCK_D": hd,
            "BLOCK_N": 64,
            "DOT_F32": False,
            "PRECISION": "tf32",
            "PDL": True,
            "ONE": False,
        }
        out.append(Case(f"decode split G={g} hd={hd}", paged_attention._decode_split_kernel, c, attn))
        name = f"decode split G={g} hd={hd}, one partition"
        out.append(Case(name, paged_attention._decode_split_kernel, {**c, "ONE": True}, attn))
    c = {"NH": 32, "HD": 128, "BLOCK_S": 32, "BLOCK_D": 128, "PDL": True}
    out.append(Case("decode reduce", paged_attention._decode_reduce_kernel, c, attn))
    pre = {**attn, "qstart_ptr": "*i32", "qlen_ptr": "*i32", "slen_ptr": "*i32"}
    # the 8B's and SmolLM2's heads, and a head dim of 256 (the launcher's tile for wide rows)
    for (g, hd), split in itertools.product(((4, 128), (3, 64), (2, 256)), (False, True)):
        m, n, warps, stages = paged_prefill._default_blocks(hd * 2, torch.device("cuda"))
        c = {
            "G": g,
            "HD": hd,
            "BS": 16,
            "SPLIT": split,
            "BLOCK_M": m,
            "BLOCK_N": n,
            "DOT_F32": False,
            "PRECISION": "tf32",
            "PDL": True,
        }
        name = f"prefill G={g} hd={hd} split={split}"
        out.append(Case(name, paged_prefill._prefill_kernel, c, pre, warps, 0, stages))
    for nh, hd, bh in ((32, 128, 1), (9, 64, 2)):  # 32 splits: the 8B's and SmolLM2's prefix-hit tails
        c = {"NH": nh, "HD": hd, "BLOCK_S": 32, "BLOCK_H": bh, "BLOCK_B": 8, "PDL": True}
        out.append(Case(f"prefill merge hd={hd}", paged_prefill._prefill_merge_kernel, c, pre))
    norm = {"w_ptr": "*fp32", "eps": "fp32", "pa_ptr": "*i32", "pb_ptr": "*i32", "xs_ptr": "*fp32"}
    for res, pairs in ((False, False), (True, False), (True, True)):  # pairs: the int4 GEMV's x (XPairs)
        c = {"HAS_RESIDUAL": res, "BLOCK_C": 4096, "PAIRS": pairs, "G": 128 if pairs else 0, "PDL": True}
        out.append(Case(f"rmsnorm residual={res} pairs={pairs}", rmsnorm._rms_norm_residual_kernel, c, norm, 16))
    c = {"NH": 32, "NKV": 8, "HALF": 64, "BLOCK_H": 32, "BLOCK_D": 64, "PDL": True}
    rope = {"pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64"}
    out.append(Case("rope + kv write", rope_kv._rope_write_kv_kernel, c, rope))
    out.append(Case("silu and mul", activation._silu_and_mul_kernel, {"BLOCK": 1024, "PDL": True}, {}))
    for x_type in ("*bf16", "*fp32"):
        types = {"x_ptr": x_type, "out_ptr": "*i64", "part_ptr": "*i32", "cnt_ptr": "*i32"}
        c = {"BLOCK": argmax.BLOCK, "BLOCK_P": 32, "PDL": True}
        out.append(Case(f"argmax x={x_type[1:]}", argmax._argmax_kernel, c, types))
    for case in out:  # a constexpr left out would build as an i32 argument
        if case.fn is int4_matmul._int4_kernel:
            case.consts.setdefault("R", 1)
            case.consts.setdefault("XP", False)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build every Triton kernel for sm_90 without a GPU.")
    ap.add_argument("--sass", metavar="PATTERN", help="build only the cases matching this regex; print their SASS")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("sm90_build: unset TRITON_INTERPRET (kernels built for the interpreter cannot be compiled)")
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failed = 0
    for name, fn, consts, types, warps, max_registers, stages in cases():
        if a.sass and not re.search(a.sass, name):
            continue
        try:
            sig = _signature(fn, consts, types)
            src = ASTSource(fn, signature=sig, constexprs=consts, attrs=_attrs(fn, sig))
            options = {
                "num_warps": warps,
                "num_stages": stages,
                **({"maxnreg": max_registers} if max_registers else {}),
            }
            kernel = triton.compile(src, target=GPUTarget(*TARGET), options=options)
            regs, spills = _registers(kernel.asm["ptx"])
            # _h2_dot's 4 elements a call must be 4 consecutive words of a row (int4_gemv.takes_half2)
            words = _words_a_thread(kernel.asm["ttgir"])
            shared = kernel.metadata.shared
            ok = (
                bool(kernel.asm.get("cubin"))
                and spills == 0
                and all(w % 4 == 0 for w in words)
                and shared <= MAX_SHARED_BYTES
            )
            half2 = f", {words[0]} words a thread" if words else ""
            print(
                f"{'ok' if ok else 'FAILED'}: {name} "
                f"({regs} registers, {spills} bytes spilled, {shared / 1024:.1f} KB shared{half2})"
            )
            failed += not ok
            if a.sass:
                sass = _sass(kernel.asm["cubin"])
                print(f"  sass: {_top(_opcodes(sass))}")
                for label, ops in _loops(sass):
                    print(f"  loop {label}: {_top(ops)}")
        except Exception:  # noqa: BLE001 (report every case, then fail)
            print(f"FAILED: {name}\n{traceback.format_exc(limit=3)}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
