# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""How the weight-only matmuls are launched: the split-K reduction, the epilogues, the grid.

Owns the Triton helpers the matmul kernels share (a tile's weight rows; storing a tile, with
split-K finished in the same launch and an epilogue applied: SiLU-and-mul for a ``[gate; up]``
weight, rotary and the KV-cache write for a qkv one), the argument checks the launchers share and
``launch``. Does not own the launch configs (``kernels._matmul_config``), the kernels' inner
loops, the weight formats (``kernels.quant_matmul``, ``kernels.int4_matmul``,
``kernels.dense_gemv``, ``kernels.reference``) nor the rotary semantics (``kernels.rope_kv``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels._common import arrival_counters, check, check_dtype, dot_in_fp32, pdl_args, tl, triton
from kernels.activation import silu_and_mul
from kernels.rope_kv import RopeKV

if TYPE_CHECKING:
    from kernels._matmul_config import Config

if triton is not None:
    from kernels.rope_kv import _rope_write_tile

    # NOTE(h7): every matmul kernel takes the rotary epilogue's arguments after its output stride,
    # ``pos_ptr, slot_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN``, and ``ROPE`` (half the
    # head dim; 0: no rotary); it loads its rows' positions and slots before its PDL wait
    # (``_rope_rows``) and hands them with the rest to ``_store_tile`` (``launch`` fills them)

    @triton.jit
    def _program_tile(
        M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GEMV: tl.constexpr, GLU: tl.constexpr, ROPE: tl.constexpr
    ):
        """This program's rows of x and weight rows, each with its mask: ``(rm, mmask, rn, nmask)``.

        GEMV: one row of x a program, adjacent programs on the same weight tile (shared through L2).
        The weight rows are ``_tile_rows``'.
        """
        tl.static_assert(GEMV or not (GLU or ROPE), "the tiled path runs its epilogues after its plain tiles (launch)")
        rm = tl.program_id(0) + tl.zeros((1,), tl.int32) if GEMV else tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn, nmask = _tile_rows(N, BLOCK_N, GLU, ROPE)
        return rm, rm < M, rn, nmask

    @triton.jit
    def _tile_rows(N, BLOCK_N: tl.constexpr, GLU: tl.constexpr, ROPE: tl.constexpr):
        """The weight rows of ``program_id(1)``'s tile and their mask.

        With GLU the weight is ``[gate; up]`` (N = 2I rows) and the tile takes gate row j and up row
        j + I in turn, BLOCK_N / 2 of each, so that ``_store_tile`` finds both halves of its outputs.
        With ROPE (half a head, the weight ``[q; k; v]`` heads) it takes each head's row d and row
        d + ROPE in turn, the two columns that rotary mixes.
        """
        r = tl.arange(0, BLOCK_N)
        if GLU or ROPE:
            j = tl.program_id(1) * (BLOCK_N // 2) + r // 2  # the pair of each row
            # GLU: gate row j, up row j + I; ROPE: column d of a head, then d + ROPE
            rn = j + (r % 2) * (N // 2) if GLU else (j // ROPE) * (2 * ROPE) + j % ROPE + (r % 2) * ROPE
            nmask = j < N // 2
        else:
            rn = tl.program_id(1) * BLOCK_N + r
            nmask = rn < N
        return rn, nmask

    @triton.jit
    def _write_tile(
        acc, rm, mmask, out_ptr, so_m, N, BLOCK_N: tl.constexpr, GLU: tl.constexpr,
        pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE: tl.constexpr,
    ):  # fmt: skip
        """Store a finished ``(rows, BLOCK_N)`` fp32 tile of ``program_id(1)`` with its epilogue.

        GLU: ``silu(gate) * up`` of its pairs, gate and up rounded to the output's dtype first and
        the product once, as the unfused ``[gate | up]`` output followed by
        ``kernels.activation.silu_and_mul`` does, bit for bit. ROPE: its pairs rounded to the
        output's dtype, then ``kernels.rope_kv._rope_write_tile`` (queries to ``out``, keys and values
        to the caches).
        """
        dt = out_ptr.dtype.element_ty
        if GLU or ROPE:
            pairs: tl.constexpr = BLOCK_N // 2
            a, b = tl.split(tl.reshape(acc.to(dt).to(tl.float32), (acc.shape[0], pairs, 2)))  # (rows, BLOCK_N / 2)
            j = tl.program_id(1) * pairs + tl.arange(0, pairs)  # the tile's pairs (_tile_rows)
            if ROPE:
                _rope_write_tile(
                    a, b, j, rm, mmask, out_ptr, so_m, pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE
                )  # fmt: skip
            else:  # a is gate, b is up
                y = a / (1.0 + tl.exp(-a)) * b
                tl.store(
                    out_ptr + rm[:, None] * so_m + j[None, :], y.to(dt), mask=mmask[:, None] & (j < N // 2)[None, :]
                )
        else:
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(
                out_ptr + rm[:, None] * so_m + cols[None, :], acc.to(dt), mask=mmask[:, None] & (cols < N)[None, :]
            )

    @triton.jit
    def _store_tile(
        acc, rm, rn, mmask, nmask, out_ptr, so_m, part_ptr, sp_s, cnt_ptr, N, NSPLIT, GLU: tl.constexpr,
        pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE: tl.constexpr,
    ):  # fmt: skip
        """Write a finished ``(rows, BLOCK_N)`` fp32 tile, reducing split-K in the same launch.

        Without split-K the tile goes straight to ``out`` (``_write_tile``). With it, each program
        stores an fp32 partial at its weight rows' columns; the last of the tile's NSPLIT programs to
        arrive (an atomic counter per tile) sums the partials in split order, so the result does not
        depend on arrival order, writes ``out`` and resets the counter for the next launch (CUDA
        graph replays reuse it).
        """
        BLOCK_N: tl.constexpr = acc.shape[1]
        if NSPLIT == 1:
            _write_tile(
                acc, rm, mmask, out_ptr, so_m, N, BLOCK_N, GLU,
                pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE,
            )  # fmt: skip
        else:
            omask = mmask[:, None] & nmask[None, :]
            p_off = rm[:, None] * N + rn[None, :]
            tl.store(part_ptr + tl.program_id(2) * sp_s + p_off, acc, mask=omask)
            # NOTE(h7): every thread's partial store must precede the release of the counter increment
            tl.debug_barrier()
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if arrived == NSPLIT - 1:
                tot = tl.zeros_like(acc)
                for s in range(NSPLIT):
                    # .cg: other multiprocessors wrote these; skip this one's L1
                    tot += tl.load(part_ptr + s * sp_s + p_off, mask=omask, other=0.0, cache_modifier=".cg")
                _write_tile(
                    tot, rm, mmask, out_ptr, so_m, N, BLOCK_N, GLU,
                    pos, slot, cos_ptr, sin_ptr, kc_ptr, vc_ptr, s_cos, QN, KVN, ROPE,
                )  # fmt: skip
                # NOTE(h7): relaxed, since the next launch to read this counter starts only once this
                # one has finished; the default (acq_rel) fenced the end of every tile's last program
                # on its output stores. On the H100 (8B shape, int4 at batch 1, alternated,
                # 2026-11-27): 450.0 / 451.2 -> 460.6 / 460.5 tok/s; qkv 9.0 -> 8.4 us, o 6.7-6.9 ->
                # 6.5-6.6, down 16.3-16.6 -> 15.8-16.0
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


def check_epilogue(n: int, glu: bool, rope: RopeKV | None) -> None:
    """Raise unless a matmul with ``n`` weight rows can take its epilogue: ``glu`` (``[gate; up]``) or ``rope``.

    ``rope``'s own arguments are checked where it runs: by ``launch`` on the fused path, else by
    ``rope_write_kv``.
    """
    if glu and n % 2:
        raise ValueError(f"glu needs an even number of weight rows ([gate; up]), got {n}")
    if glu and rope is not None:
        raise ValueError("a matmul takes glu or rope, not both")


def check_x(x: torch.Tensor, k: int) -> None:
    """``x`` is ``(M, k)`` in fp32, fp16 or bf16."""
    check(x.dim() == 2 and x.shape[1] == k, f"x must be (M, {k}), got {tuple(x.shape)}")
    check_dtype("x", x, torch.float32, torch.float16, torch.bfloat16)


def check_group(group_size: int) -> None:
    """A group size the kernels can take: a power of two, at least 16."""
    check(
        group_size >= 16 and group_size & (group_size - 1) == 0,
        f"group_size must be a power of two >= 16, got {group_size}",
    )


def check_step(group_size: int, cfg: Config) -> None:
    """A GEMV step covers whole groups; a tiled step lies inside one."""
    if cfg.path == "gemv":
        check(
            cfg.block_k % group_size == 0, f"GEMV block_k {cfg.block_k} must be a multiple of group_size {group_size}"
        )
    else:
        check(group_size % cfg.block_k == 0, f"tiled block_k {cfg.block_k} must divide group_size {group_size}")


def finish_unfused(y: torch.Tensor, glu: bool, rope: RopeKV | None) -> torch.Tensor:
    """A plain ``(M, N)`` product's epilogue as its own launches: ``silu_and_mul``, or ``rope.apply``."""
    if glu:
        return silu_and_mul(y)
    return rope.apply(y) if rope is not None else y


def launch(
    kernel: object,
    x: torch.Tensor,
    n: int,
    k_cols: int,
    cfg: Config,
    tensors: tuple[torch.Tensor, ...],
    strides: tuple[int, ...],
    glu: bool,
    rope: RopeKV | None = None,
    **constexprs: int,
) -> torch.Tensor:
    """Run ``kernel`` over the grid ``cfg`` asks for; split-K partials are reduced inside the launch.

    ``k_cols`` is the K extent the kernel iterates (packed bytes per half for int4). With ``glu``
    the ``n`` weight rows are ``[gate; up]`` and the output ``(M, n / 2)`` is ``silu(gate) * up``.
    With ``rope`` they are ``[q; k; v]`` heads: the output is the rotated queries ``(M, q_size)``,
    and the keys and values are in the caches (``RopeKV``). ``check_epilogue`` has passed.

    Raises:
        ValueError: an odd ``block_n`` for a paired epilogue, or ``rope`` arguments the fused path
            cannot take.
    """
    if (glu or rope is not None) and cfg.path == "tiled":
        # NOTE(h7): the tiled path's tiles of gate and up rows in turn were slower than its plain
        # tiles and the activation's own launch after them on the H100 (the 8B shape's int4 at
        # batch 16: 3,092 against 3,410 tok/s; batch 4: 956 against 982), where the GEMV path gained
        plain = launch(kernel, x, n, k_cols, cfg, tensors, strides, False, None, **constexprs)
        return finish_unfused(plain, glu, rope)
    paired = glu or rope is not None
    if paired and cfg.block_n % 2:
        raise ValueError(f"glu and rope need an even block_n, got {cfg.block_n}")
    m = x.shape[0]
    if rope is not None:
        rope.check(m, n)
    per_split = -(-k_cols // cfg.split_k)
    k_split = -(-per_split // cfg.block_k) * cfg.block_k  # a multiple of the loop step
    split = -(-k_cols // k_split)
    gemv = cfg.path == "gemv"
    cols = n // 2 if glu else (n - 2 * rope.kv_size if rope is not None else n)  # of the output
    # a paired tile's block_n weight rows are block_n / 2 pairs
    tiles = -(-n // 2 // (cfg.block_n // 2)) if paired else -(-n // cfg.block_n)
    grid = (m if gemv else -(-m // cfg.block_m), tiles, split)
    out = torch.empty((m, cols), dtype=x.dtype, device=x.device)
    part, counters = out, out  # placeholders without split-K: never read
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, grid[0] * grid[1])
    kernel[grid](  # type: ignore[index]
        x,
        *tensors,
        out,
        part,
        counters,
        m,
        n,
        k_cols,
        k_split,
        split,
        *strides,
        out.stride(0),
        *_rope_args(rope, out),
        **constexprs,
        GEMV=gemv,
        GLU=glu,
        ROPE=rope.head_dim // 2 if rope is not None else 0,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        DOT_F32=dot_in_fp32() or x.dtype == torch.float32,
        PREFETCH=cfg.prefetch and gemv,
        num_warps=cfg.num_warps,
        **pdl_args(x),
    )
    return out


def _rope_args(rope: RopeKV | None, out: torch.Tensor) -> tuple[object, ...]:
    """The kernels' rotary arguments (the NOTE above ``_program_tile``); without rope, placeholders never read."""
    if rope is None:
        return (out, out, out, out, out, out, 0, 0, 0)
    kv = rope.kv_size
    q_size = out.shape[1]
    return (
        rope.positions,
        rope.slot_mapping,
        rope.cos,
        rope.sin,
        rope.k_cache,
        rope.v_cache,
        rope.cos.stride(0),
        q_size,
        kv,
    )
