"""Launch configs of the weight-only matmuls: ``Config``, the table benchmarks pin, the default per shape.

Owns ``Config``, the config table (``set_config``, ``config_for``) and the default config of each
shape (``default_config``), with the measurements that chose them. Needs no device, so the sm_90
build check can ask for the tiles launched. Does not launch anything (``kernels._matmul_launch``)
nor own the kernels (``kernels.quant_matmul``, ``kernels.int4_matmul``, ``kernels.dense_gemv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kernels._common import num_sms

if TYPE_CHECKING:
    import torch

GEMV_MAX_ROWS = 4
"""Rows of ``x`` up to which the GEMV path can be the default (``_gemv_default``)."""


@dataclass(frozen=True, slots=True)
class Config:
    """How one matmul is launched."""

    path: Literal["gemv", "tiled"]
    """GEMV (elementwise FMAs) or tiled (``tl.dot``)."""
    block_n: int
    """Output columns per program."""
    block_k: int
    """K per loop step (for int4: packed bytes per half, i.e. columns of each half of K)."""
    split_k: int
    """Programs that share one output tile's K range."""
    num_warps: int = 4
    """Warps per program."""
    block_m: int = 16
    """Rows per program on the tiled path."""
    prefetch: bool = False
    """GEMV path: load the first weight tile before the PDL wait (the weight is no earlier kernel's
    output, so the load overlaps the previous kernel's tail); the int4 half2 loop then keeps loading
    a tile ahead."""
    ahead: bool = False
    """int4 half2 GEMV: each step's scales, zeros and x load a step ahead (with its weights, under
    ``prefetch``): more registers a thread, their latency off the step."""
    runs: int = 1
    """int4 half2 GEMV: each thread holds this many runs of a group's words, so the group's sums
    take fewer cross-thread steps (``kernels.int4_gemv._word_cols``); 1 keeps the plain tile."""
    pairs_registers: int = 0
    """int4 half2 GEMV reading x as pairs (``kernels.int4_gemv.XPairs``): registers a thread the
    compiler may use (Triton's ``maxnreg``); 0: its own choice."""


_CONFIGS: dict[tuple[str, int, int, int], Config] = {}


Kind = Literal["int8", "int8g", "int4", "dense"]
"""Weight format of a matmul: int8 per channel, int8 per group (GGUF Q8_0), int4 per group, float (GEMV only)."""


def set_config(kind: Kind, rows: int, n: int, k: int, config: Config | None) -> None:
    """Pin (or with None, forget) the launch config of one ``(kind, rows of x, N, K)`` matmul (benchmarks tune these)."""
    key = (kind, rows, n, k)
    if config is None:
        _CONFIGS.pop(key, None)
    else:
        _CONFIGS[key] = config


def config_for(kind: Kind, m: int, n: int, k: int, k_iter_cols: int, group: int, device: torch.device) -> Config:
    """The pinned config of ``(kind, m, n, k)``, else the default one.

    ``k_iter_cols`` is the K extent the kernel loops over (packed bytes per half for int4); ``group``
    the columns per scale (0: one scale per row). A GEMV step covers whole groups, a tiled step lies
    inside one group.
    """
    pinned = _CONFIGS.get((kind, m, n, k))
    if pinned is not None:
        return pinned
    return default_config(kind, m, n, k_iter_cols, group, interp=device.type == "cpu", sms=num_sms(device))


def _gemv_default(kind: Kind, m: int, n: int, k_iter_cols: int) -> bool:
    """Whether ``m`` rows take the GEMV path by default (the dense kind has no other).

    NOTE(h7): each GEMV program dequantizes its weight tile for its one row, so the GEMV's time grows
    with the rows while the tiled path's stays flat up to 16. On the H100 (defaults timed by
    ``bench.engine_gpu --no-tune``, 2026-11-26) the tiled path won from 3 rows on every 8B shape
    (int8 qkv at 4 rows 14.8 against 28.1 us, int4 gate_up 48.5 against 77.3), and on SmolLM2's
    shapes only above 2^20 loop columns (``n * k_iter_cols``: an int8 weight's bytes, half an int4
    weight's; int8 gate_up, 3,072 x 576, at 3 rows 5.0 against 6.7; its LM head 13.4 against 93.4);
    smaller ones kept the GEMV (int8 o at 4 rows 1.9 against 3.9).
    A wide weight with a short K (SmolLM2's int8 LM head, 49,152 x 576) is tiled at any row count:
    its GEMV took 35-37 us at 1 row and 65-66 at 2, the tiled path 13-14 (27 once).
    """
    if kind == "dense":
        return True
    if kind in ("int8", "int8g") and k_iter_cols < 1024 and n * k_iter_cols > 1 << 22:
        return False
    return m <= 2 or (m <= GEMV_MAX_ROWS and n * k_iter_cols <= 1 << 20)


def default_config(kind: Kind, m: int, n: int, k_iter_cols: int, group: int, *, interp: bool, sms: int) -> Config:
    """The default config of a matmul on a device with ``sms`` multiprocessors (``interp``: the CPU interpreter).

    Needs no device, so the sm_90 build check (``tests/kernels/sm90_build.py``) compiles the tiles launched.
    """
    warps, prefetch, ahead, runs, pairs_registers = 4, False, False, 1, 0
    split: int | None = None  # set where tuning chose it; else the rule below
    if _gemv_default(kind, m, n, k_iter_cols):
        if interp:
            bn, bk = 16, 32
        elif kind == "dense" and k_iter_cols >= 4096:
            # NOTE(h7): the Llama-3-8B shapes on the H100 at batch 1: 2,048-wide K steps over 8 warps,
            # two rows a program for the wide gate_up and LM head (74.7, 332.4 us) and four for qkv,
            # o and down (16.8, 11.3, 39.5 us; two rows took 11.8 and 40.8 on o and down), as the
            # bench's tuning chose (2026-11-26); the configs tuned before that (4 x 1,024 and 32 x 512
            # over 4 warps) took 20.9, 13.9, 80.6 and 415 us on qkv, o, gate_up and the LM head
            bn, bk, warps, prefetch = (4 if n <= 8192 else 2), 2048, 8, True
        elif kind == "dense":
            # NOTE(h7): tuned on the H100 over SmolLM2's shapes at batch 1 (K 576 and 1536): narrow
            # tiles and one long K step, 1.8-3.9 us a layer against 3.4-7.1 us for cuBLAS (and 5-14 us
            # for the quantized kernels' 32 x 128 default); more programs, each with one load in flight
            bn, bk = (8 if n <= 4096 and k_iter_cols <= 1024 else 4), (1024 if k_iter_cols <= 1024 else 512)
            prefetch = True
        elif kind in ("int8", "int8g") and k_iter_cols >= 8192:
            # NOTE(h7): the 8B down projection (K 14,336) on the H100 at batch 1, tuned once its input
            # came activated from gate_up (``glu``): 2 rows x 2,048 columns over 4 warps, 21.3 us,
            # where 8 x 1,024 took 22.1; while it applied SiLU-and-mul on its own loads, 8 x 1,024
            # had won (23.7 us), every program recomputing the activation over its K range (2026-11-27)
            bn, bk, warps, prefetch = 2, 2048, 4, True
        elif kind in ("int8", "int8g") and k_iter_cols <= 2048:
            # NOTE(h7): SmolLM2's int8 shapes (K 576 and 1,536) on the H100 at batch 1, tuned with the
            # kernel launching its dependents first (kernels._common.pdl_enter): wider tiles, K split
            # in two or four; qkv 16 x 1,024 split 4 over 8 warps, o 8 x 1,024 split 4 over 4, gate_up
            # 16 x 1,024 split 2 over 8, down 8 x 2,048 split 2 over 8 (2026-11-26)
            bn = 16 if n >= 960 and k_iter_cols <= 1024 else 8
            bk = 2048 if k_iter_cols > 1024 else 1024
            warps, prefetch = (8 if bn == 16 or bk == 2048 else 4), True
            split = 4 if n < 1024 and k_iter_cols <= 1024 else 2
        elif kind in ("int8", "int8g"):
            # NOTE(h7): the byte-permute GEMV over the 8B shapes: 2 rows x 1,024 columns over 2 warps
            # was the fastest for o and gate_up and within 4 % of the fastest for the LM head; for qkv
            # (6,144 columns) the bench's tuning chose 8 rows x 512 over 8 warps in three of four runs
            # (10.1-10.4 us; 2026-11-26)
            bn, bk, warps, prefetch = (8, 512, 8, True) if 4096 < n <= 8192 else (2, 1024, 2, True)
        elif k_iter_cols >= 1024 and n <= 8192:
            # NOTE(h7): the half2 int4 GEMV (kernels.int4_gemv._h2_dot) over the 8B qkv (6,144 columns),
            # o and down on the H100, tiles chosen by the decode step's rate (bench/tune_step.py), each
            # with its scales and x a step ahead (``ahead``): qkv 16 rows x 1,024 bytes, o 16 x 2,048
            # (the whole row in one step), down 16 x 512 split 2, all over 4 warps, unsplit but down.
            # The tool's run from the tiles before (qkv 16 x 1,024, o and down 32 x 512 split 4, none
            # ahead) kept one a shape: 483.9 / 483.8 -> 499.4 / 499.7 tok/s, alternated. Alone, qkv
            # 8.5 -> 6.8 us; o 6.2 -> 6.0 and down 15.4 -> 15.6 (faster alone without ``ahead``, slower
            # in the step; 2026-11-27); down's tile since, below
            # NOTE(h7): down also holds 2 runs of each group a thread (``runs``): 11 % fewer loop
            # instructions (sm_90 SASS, 497 against 559 a step), alone 14.5 against 15.3-15.6 us, and
            # the step 499.3-499.6 -> 504.6-504.8 tok/s, alternated twice. The same for qkv, o,
            # gate_up or the LM head was no faster or slower in the step (2026-11-27)
            # NOTE(h7): down unsplit, 16 x 1,024 over 8 warps (126 registers): no split-K partials,
            # arrival, nor a last program summing them at the layer's end. Tried in the step
            # (bench.tune_step's grid then held 2 and 4 warps only): 535.7-535.9 against
            # 531.8-532.0 tok/s for 16 x 512 split 2 over 4 warps, alternated four times on the
            # H100; 4 warps, 32 rows, 8 rows, 2,048 bytes, runs 1 or 4, or no ``ahead`` at this
            # tile were slower (2026-12-07, bench/results/int4_step_tiles_2026-12-07_h100.json)
            bn, warps, split, prefetch, ahead = 16, 4, 1, True, True
            if n > 4096:
                bk = 1024
            elif k_iter_cols <= 2048:
                bk = 2048
            else:
                bk, warps, runs = 1024, 8, (2 if group % 32 == 0 else 1)
                # a narrower down (a smaller model's) keeps a program a multiprocessor; not measured
                split = 1 if -(-n // bn) >= sms else 2
        elif k_iter_cols >= 1024:
            # NOTE(h7): the half2 int4 GEMV over the 8B gate_up and LM head on the H100: 8 rows x 1,024
            # bytes over 2 warps, 25.3 and 103.3 us; the fp32 FMA loop's best tiles of up to 512 bytes
            # took 27.4 and 104.7 (it was not timed at 1,024); a tile in flight, 26.1 and 104.8 at best
            # NOTE(h7): x as pairs (kernels.int4_gemv.XPairs) leaves the loop 56 registers a thread
            # where x's own loads took 72, and uncapped it ran slower than with x's loads (H200,
            # 2026-11-28: gate_up 24.0 against 23.3 us); held to 72 it ran 18.0, the LM head 72
            # against 98 (bench/probe_int4_xpack.py). x's own loads spill under that cap
            bn, bk, warps, pairs_registers = 8, 1024, 2, 72
        elif n * k_iter_cols > 1 << 22:
            # NOTE(h7): the int4 GEMV over SmolLM2's LM head (49,152 x 576, GGUF's group of 32) on the
            # H100 at batch 1: 16 rows x 128 bytes over 1 warp, 13.2 us, where 32 rows over 4 warps
            # took 16.9 (2026-11-26)
            bn, bk, warps = 16, 128, 1
        else:
            # NOTE(h7): SmolLM2's other int4 shapes (K 576 and 1,536) on the H100 at batch 1: 2 to 4
            # rows a program, the row's K in one or two 512-byte steps, 1.5-2.7 us a shape, where 32
            # rows x 128 bytes over 4 warps took 2.8-6.5 (qkv 1.5 / 2.9, o 1.5 / 2.9, gate_up 2.0 /
            # 3.8, down 2.7 / 6.5; 2026-11-26): more programs, each with its loads at once in flight
            bn, bk, prefetch = (2 if n <= 1024 else 4), 512, True
            warps = 1 if k_iter_cols <= 512 else 4
        bk = max(bk, group)
        path: Literal["gemv", "tiled"] = "gemv"
        # NOTE(h7): counted per row, so that 1 to GEMV_MAX_ROWS rows split K alike and a row's
        # result does not depend on how many rows share its launch
        tiles = -(-n // bn)
    else:
        bn, bk = (16, 16) if interp else (64, 64)
        bk = min(bk, group) if group else bk
        path = "tiled"
        tiles = -(-m // 16) * -(-n // bn)
    # NOTE(h7): split K until the grid holds ~4 waves of programs, but keep >= 4 loop steps each:
    # one wave of long programs leaves the memory system idle at the tail.
    if split is None:
        split = 1
        while tiles * split < 4 * sms and k_iter_cols // (bk * split * 2) >= 4:
            split *= 2
    # NOTE(h7): the first weight tile before the PDL wait took 0.6-2.6 us off each dense and int8
    # GEMV of the 8B shapes on the H100; the int4 fp32 loop's larger shapes lost up to 15 us to it
    # (its registers doubled), so int4 sets it only where it was measured (the half2 loop, above)
    return Config(
        path, bn, bk, split, num_warps=warps, prefetch=prefetch, ahead=ahead, runs=runs, pairs_registers=pairs_registers
    )
