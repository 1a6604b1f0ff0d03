"""Every Triton kernel compiles for the H100 (sm_90), checked on any host (``tests.kernels.sm90_build``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _jit_kernels() -> set[str]:
    """Names of the ``@triton.jit`` functions in ``kernels/`` that are launched (``_*_kernel``)."""
    names = set()
    for path in (ROOT / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            jit = isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)
            if jit and node.name.endswith("_kernel"):
                names.add(node.name)
    return names


def test_every_kernel_compiles_to_a_cubin_for_sm90(tmp_path):
    """The compiler, not the interpreter, sees every launched kernel, and no kernel is left out of the build list."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a real build, not a cached one
    script = (
        "import sys\n"
        "from tests.kernels import sm90_build\n"
        "print('covered:', ' '.join(sorted({case.fn.__name__ for case in sm90_build.cases()})))\n"
        "sys.exit(sm90_build.main())\n"
    )
    proc = subprocess.run(  # noqa: S603 (our own interpreter and module)
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    covered = set(proc.stdout.splitlines()[0].removeprefix("covered: ").split())
    assert covered == _jit_kernels()
    assert "FAILED" not in proc.stdout


def _sass_lines(tmp_path: Path, pattern: str) -> list[str]:
    """``sm90_build --sass pattern``'s output lines, built afresh (no Triton cache)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run(  # noqa: S603 (our own interpreter and module)
        [sys.executable, "-m", "tests.kernels.sm90_build", "--sass", pattern],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout.splitlines()


def _counts(text: str) -> tuple[int, dict[str, int]]:
    """``"N instructions; OP n, ..."`` -> ``(N, {OP: n})``."""
    total, _, ops = text.partition(" instructions; ")
    return int(total), {op: int(n) for op, n in (o.rsplit(" ", 1) for o in ops.split(", "))}


def test_sass_flag_builds_only_the_matching_cases_and_counts_their_instructions(tmp_path):
    lines = _sass_lines(tmp_path, "^silu and mul$")
    assert len(lines) == 2 and lines[0].startswith("ok: silu and mul ("), lines
    total, counts = _counts(lines[1].removeprefix("  sass: "))
    assert total >= sum(counts.values()) > 0
    assert "MUFU" in counts  # the sigmoid's exp2 on the special function unit


def test_sass_flag_counts_one_pass_of_each_loop(tmp_path):
    lines = _sass_lines(tmp_path, "^int4 gemv glu pairs$")
    total, _ = _counts(lines[1].removeprefix("  sass: "))
    loops = [line.removeprefix("  loop ").partition(": ") for line in lines[2:]]
    assert loops and all(label.startswith(".L_x_") for label, _, _ in loops), lines
    # the K loop, the largest: its half2 FMAs are there, and one pass holds fewer instructions than the kernel
    count, ops = max((_counts(rest) for _, _, rest in loops), key=lambda c: c[0])
    assert 0 < count < total
    assert "HFMA2" in ops
