"""Helpers shared by the kernel launchers: argument checks, interpreter detection, small math.

Owns nothing numeric; each op's kernel and launcher live in their own file. Imports only torch and
triton (the ``kernels`` dependency rule).
"""

from __future__ import annotations

import functools
import os

import torch

try:  # triton is optional on CPU-only installs; the reference ops then stay the only path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

__all__ = [
    "HAS_TRITON",
    "WEIGHT_EVICTION",
    "arrival_counters",
    "can_launch",
    "check",
    "check_dtype",
    "check_last_contiguous",
    "dot_in_fp32",
    "interpreting",
    "next_pow2",
    "num_sms",
    "pdl_args",
    "pdl_enter",
    "set_pdl",
    "tl",
    "triton",
]

HAS_TRITON = triton is not None
"""Whether triton imports here (the launchers need it; the references do not)."""


# NOTE(h7): read once, at import: ``triton.jit`` decides at decoration time whether a kernel is
# interpreted, so a later change of the variable must not make launchers think otherwise.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """Whether kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return _INTERPRET


def can_launch(*tensors: torch.Tensor) -> bool:
    """Whether a Triton kernel can run over these tensors: on CUDA, or on the CPU under the interpreter."""
    if not HAS_TRITON:
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    return on_cuda or (interpreting() and all(t.device.type == "cpu" for t in tensors))


def check(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` when ``cond`` is false (launchers validate before launching)."""
    if not cond:
        raise ValueError(msg)


def check_dtype(name: str, t: torch.Tensor, *dtypes: torch.dtype) -> None:
    """Raise unless ``t`` has one of ``dtypes``."""
    check(t.dtype in dtypes, f"{name} must be one of {dtypes}, got {t.dtype}")


def check_last_contiguous(name: str, t: torch.Tensor) -> None:
    """Raise unless the last dim of ``t`` is unit-stride (the kernels vectorise along it)."""
    check(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (and >= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; a nominal 8 for the CPU interpreter (only grid shapes depend on it)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 8


MAX_SPLITS = 32
"""Most programs that share one split-KV reduction (decode and prefill attention)."""


def split_count(programs: int, device: torch.device) -> int:
    """Splits that bring ``programs`` up to two per multiprocessor: between 1 and ``MAX_SPLITS``."""
    want = -(-2 * num_sms(device) // max(1, programs))
    return max(1, min(MAX_SPLITS, want))


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_ALL_COUNTERS: list[torch.Tensor] = []


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` int32 arrival counters (the last of a group of programs to arrive finishes its work).

    NOTE(h7): every launch leaves its counters at zero, so launches in one stream can share them; two
    streams running such kernels at the same time could not. A buffer is never freed once made: a
    captured CUDA graph keeps its address.
    """
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
        _ALL_COUNTERS.append(buf)
        _COUNTERS[device] = buf
    return buf


_PDL = {"enabled": True}


def set_pdl(enabled: bool) -> None:
    """Allow (the default) or forbid programmatic dependent launch; benchmarks compare the two.

    Takes effect for launches (and CUDA graph captures) made afterwards.
    """
    _PDL["enabled"] = enabled


@functools.cache
def _cc_major(index: int) -> int:
    return int(torch.cuda.get_device_capability(index)[0])


def pdl_args(t: torch.Tensor) -> dict[str, bool]:
    """The launch arguments that turn programmatic dependent launch on for a kernel over ``t``.

    On Hopper and newer, a kernel launched this way may be scheduled while the kernel before it in
    the stream is still running; it waits in ``pdl_enter`` until that kernel has finished and its
    writes are visible. What it saves is the launch latency between two kernels (a few
    microseconds), which is most of the time of the small kernels of a batch-1 decode step. Every
    kernel launched with these arguments must call ``pdl_enter(PDL)`` (or ``pdl_enter_after_wait``)
    before it writes memory or reads anything a kernel of the step writes; weights (and norm
    weights, scales) may load before it.
    """
    if _PDL["enabled"] and t.is_cuda and not _INTERPRET and _cc_major(t.device.index or 0) >= 9:
        return {"PDL": True, "launch_pdl": True}
    return {}  # the kernels' PDL defaults to False


def dot_in_fp32() -> bool:
    """Whether ``tl.dot`` operands must be widened to fp32 first.

    NOTE(h7): triton 3.6's interpreter returns garbage for ``tl.dot`` on bf16 operands (checked:
    errors of 1e10 on a 16x16 product), so under the interpreter the kernels widen them; on the GPU
    they stay bf16 for the tensor cores.
    """
    return interpreting()


def _patch_interpreter_index() -> None:
    """Let the CPU interpreter use run-time scalars as loop bounds under NumPy >= 2.4.

    NOTE(h7): triton 3.6's interpreter holds scalars as 1-element arrays and converts them with
    ``int(array)``, which NumPy 2.4 rejects ("only 0-dimensional arrays can be converted"), so every
    ``range(start, end)`` over run-time values fails there. This wraps its tensor patching to
    convert through ``.reshape(-1)[0]``; it touches only the interpreter, never compiled kernels.
    """
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_crossway_patched", False):
        return

    def patched(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))  # type: ignore[attr-defined]

    patched._crossway_patched = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


if HAS_TRITON and _INTERPRET:
    _patch_interpreter_index()

if triton is not None:
    WEIGHT_EVICTION = tl.constexpr("evict_first")
    """L2 eviction policy of the GEMVs' weight loads: a decode step reads each weight once.

    The tiled path's loads keep the default: programs of other row blocks read the same weight tile.

    NOTE(h7): evicted first, the streamed weights leave L2 to what is read again (activations,
    split-K partials, counters, rotary tables, the KV cache). On the H100 at batch 1, defaults,
    alternated in three rounds (2026-11-27): the 8B shape's bf16 194.6-194.7 -> 196.7-196.8 tok/s,
    int8 331.6-332.3 -> 335.3-335.7, int4 456.9-457.0 -> 458.9-459.0 (its qkv GEMV alone slower, 8.5
    -> 10.6-11.2 us, its LM head faster, 103-106 -> 98-100.5); SmolLM2's shape bf16 2,163-2,174 ->
    2,227-2,240, int8 2,593-2,595 -> 2,592-2,602, int4 1,901-1,906 -> 1,965-1,966. ``.cg`` loads
    instead (one round): within 0.6 % of before.
    """

    @triton.jit  # type: ignore[untyped-decorator]
    def pdl_enter(PDL: tl.constexpr):  # type: ignore[no-untyped-def]
        """Let the next kernel launch, then wait for the previous one (a kernel launched with ``pdl_args``).

        NOTE(h7): the wait comes before any store and any load of what an earlier kernel writes, so
        neither a read of an earlier kernel's output nor a write over its input can race it. Letting
        dependents launch first means a kernel may start as soon as the one before it has started,
        so a chain of such kernels runs ahead of the work it waits on, its programs placed and their
        weight loads in flight while earlier kernels still run: loads before the wait may read only
        what no kernel of the chain writes (weights, scales, norm weights; what the host staged and
        earlier steps wrote). Completion is still in order: a wait returns once the kernel before has
        finished, and that kernel finished only after its own wait returned. On the H100 (SmolLM2's
        shape at batch 1, ``bench.engine_gpu --no-tune``, alternated, 2026-11-26): bf16 1,696-1,697 ->
        1,999-2,000 tok/s, int8 1,947-1,953 -> 2,095, int4 1,870-1,871 -> 1,928-1,933; the 8B
        shape's bf16 189.0-189.1 -> 192.3, its int8 317.8-318.4 -> 318.6 (the quantized matmuls
        themselves still waiting first there). The int4 matmul keeps that order (``pdl_enter_after_wait``).
        """
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()

    @triton.jit  # type: ignore[untyped-decorator]
    def pdl_enter_after_wait(PDL: tl.constexpr):  # type: ignore[no-untyped-def]
        """``pdl_enter`` with the wait first: the next kernel launches once this one has passed its wait.

        NOTE(h7): the int4 matmul (``kernels.int4_matmul``). With the tiles tuned for this order,
        launching the quantized GEMVs' dependents first took SmolLM2's shape at batch 1 on the H100
        from 2,095 to 1,679-1,687 tok/s in int8 and from 1,928-1,933 to 1,623-1,630 in int4
        (alternated, 2026-11-26), the qkv projection most of it (int8 2,077-2,083 -> 1,853-1,859
        alone). Retuned for launching first, int8 took wider tiles with K split and gained instead
        (2,097-2,099 -> 2,359-2,365 with the new defaults), so it uses ``pdl_enter``; int4 was not
        retuned, and keeps this order on both paths.
        """
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
