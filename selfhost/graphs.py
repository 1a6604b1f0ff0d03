"""CUDA graphs of the decode step: one capture per row count, replayed with new inputs.

A row is one query token over its own context: a decode step's token, or one of a few new tokens
of a request (a prefix hit's tail, a short prompt; ``runner.DECODE_ROWS_MAX``).

A decode step of a small model is a few hundred short kernels; launching them from Python costs
more than running them. Each captured graph replays the whole kernel pass (``models.fused``), final
norm and LM head included, reading its inputs from static buffers: token ids, positions, KV slots,
context lengths and block tables. A batch is padded to the next captured size with rows that write
no KV (slot -1) and read none (length 0).

Owns the static buffers and their host staging (``DecodeInputs``), the captures and the
fill-and-replay, and the host staging of block tables that the step graphs share (``TableRows``).
Does not own deciding which steps run here (``runner``), the kernels (``kernels/``) nor sampling
(``sampling``).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch

from selfhost.models.ops import AttentionMetadata

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np
    from torch.cuda import _POOL_HANDLE

    from selfhost.models.llama import LlamaForCausalLM

_IDS, _POS, _SLOTS, _LENS, _SRC = range(5)


def capture(
    step: Callable[[], torch.Tensor], device: torch.device, pool: _POOL_HANDLE | None
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Run ``step`` once on a side stream (compiling its kernels), then capture it in ``pool``; return the graph and its output."""
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # NOTE(crossway): a dead engine's graphs (held in a reference cycle) freed by the garbage
    # collector in the middle of a capture release device memory there, which invalidates the
    # capture ("operation failed due to a previous error during capture"; seen on the H100 when a
    # test built engines back to back). torch no longer collects before a capture, so collect here
    # and keep the collector off until the capture ends.
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = step()
    finally:
        if collecting:
            gc.enable()
    return graph, out


class TableRows:
    """Block tables written row by row into a host array, writing only what a row does not hold yet.

    NOTE(h7): a request's block ids are one list that only grows while it runs
    (``KVCacheManager.block_ids``), so a row that last received the same list holds its first ids
    already, and only a grown tail is written. A step of 256 running requests rewrote every table,
    ~0.34 ms of numpy conversions on the engine thread (on the CPU VM; 0.02 ms with the skip), where
    a block is added to a table once in 16 steps. A table that moved to another row (a request
    ahead of it finished, so the later ones shift up a row; a request's several rows in one step)
    is copied from the row that holds it: a row copy in numpy, 0.8 us on the CPU VM where converting
    a 256-id list took 15 us. The array is the caller's; each staging array needs its own
    ``TableRows``.
    """

    def __init__(self, array: np.ndarray) -> None:
        """Args: ``array`` ``(rows, max_blocks)``; entries past a row's table are never read by the kernels."""
        self.array = array
        self._held: list[tuple[Sequence[int], int] | None] = [None] * array.shape[0]
        """Per row, the table it holds and how many of its ids; the reference keeps the list
        alive, so ``is`` and the ids in ``_row_of`` stay sound."""
        self._row_of: dict[int, int] = {}
        """``id(table)`` -> the row it was last put in (checked against ``_held`` before use)."""

    def put(self, row: int, table: Sequence[int]) -> None:
        """Make ``array[row, :len(table)]`` hold ``table`` (a list that is only ever appended to)."""
        n = len(table)
        held = self._held[row]
        if held is not None and held[0] is table:
            if held[1] != n:
                self.array[row, held[1] : n] = table[held[1] : n]
        else:
            src = self._row_of.get(id(table), -1)
            at_src = self._held[src] if src >= 0 else None
            if at_src is not None and at_src[0] is table:
                m = at_src[1]
                self.array[row, :m] = self.array[src, :m]
                if m != n:
                    self.array[row, m:n] = table[m:n]
            else:
                self.array[row, :n] = table
            if len(self._row_of) > 4 * len(self._held):  # forget tables no row holds any more
                self._row_of = {id(h[0]): r for r, h in enumerate(self._held) if h is not None}
        self._held[row] = (table, n)
        self._row_of[id(table)] = row

    def put_all(self, tables: Sequence[Sequence[int]], first_row: int = 0) -> None:
        """``put`` each of ``tables`` into rows ``first_row, first_row + 1, ...`` in turn."""
        held = self._held
        for row, table in enumerate(tables, first_row):
            # NOTE(h7): the skip spelled out, since a decode step's rows all take it but one in ~16
            h = held[row]
            if h is None or h[0] is not table or h[1] != len(table):
                self.put(row, table)


class DecodeInputs:
    """The decode graphs' inputs: host staging, in two sets used in turn, and the device buffers it is copied to.

    ``stage`` writes a step's rows (padded to the replayed size) and block tables into the next host
    set and starts their copies up; the graphs read ``device_inputs`` (ids, positions, slots,
    context lengths, sources: ``(5, max_batch)``) and ``device_tables`` (``(max_batch, max_blocks)``).
    Without ``pinned`` (and with a CPU ``device``), the same staging runs where there is no GPU
    (``bench.host_step`` times it so).
    """

    def __init__(self, max_batch: int, max_blocks: int, device: torch.device, *, pinned: bool = True) -> None:
        b = max_batch
        # NOTE(crossway): pinned host staging, so each step's inputs go up in two async copies. Two
        # sets, used in turn: with async scheduling the host fills step n+1's while step n runs, and
        # step n-1's copies (the other set's last use) are done by then, because the engine waited
        # for step n-1's sampled ids before planning step n+1.
        self._host = [torch.zeros((5, b), dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._host_tables = [torch.zeros((b, max_blocks), dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self._table_rows = [TableRows(t.numpy()) for t in self._host_tables]
        self._turn = 0
        self.device_inputs = torch.zeros((5, b), dtype=torch.long, device=device)
        self.device_tables = torch.zeros((b, max_blocks), dtype=torch.int32, device=device)

    def stage(
        self,
        ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        tables: Sequence[Sequence[int]],
        sources: Sequence[int],
        bs: int,
    ) -> None:
        """Stage ``n`` rows (``DecodeGraphs.run`` says what each list holds) padded to ``bs`` rows, and copy them up."""
        n = len(ids)
        host, host_tables, rows = self._host[self._turn], self._host_tables[self._turn], self._table_rows[self._turn]
        self._turn ^= 1
        h = host.numpy()
        h[_IDS, :n] = ids
        h[_POS, :n] = positions
        h[_SLOTS, :n] = slots
        h[_LENS, :n] = h[_POS, :n] + 1
        h[_SRC, :n] = sources
        h[:, n:bs] = 0
        h[_SLOTS, n:bs] = -1  # padding rows: no KV write, no context
        h[_SRC, n:bs] = -1
        rows.put_all(tables)
        self.device_inputs.copy_(host, non_blocking=True)
        self.device_tables[:n].copy_(host_tables[:n], non_blocking=True)


class DecodeGraphs:
    """Decode-step graphs for a set of batch sizes over one model and its KV cache tensors."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        batch_sizes: Sequence[int],
        max_blocks: int,
        device: torch.device,
        last_tokens: torch.Tensor,
        pool: _POOL_HANDLE | None = None,
    ) -> None:
        """Capture one graph per size (compiling the kernels first); ``max_blocks`` bounds a block table.

        ``last_tokens`` is the runner's buffer of the previous step's sampled ids: a row whose
        source index is not negative reads its token id there instead of from the host. ``pool``
        shares another set of graphs' memory pool (steps never run at once).
        """
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.sizes = sorted(set(batch_sizes))
        self.max_batch = self.sizes[-1]
        self.inputs = DecodeInputs(self.max_batch, max_blocks, device)
        self._last_tokens = last_tokens
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self.num_replays = 0
        """Steps replayed by ``run``."""
        self._capture(model, kv_caches, device, pool)

    @torch.inference_mode()
    def _capture(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        device: torch.device,
        pool: _POOL_HANDLE | None,
    ) -> None:
        inputs, tables = self.inputs.device_inputs, self.inputs.device_tables
        inputs[_SLOTS].fill_(-1)  # warm-up and capture runs write nothing into the cache
        inputs[_LENS].zero_()
        inputs[_SRC].fill_(-1)
        for bs in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            meta = AttentionMetadata(
                slot_mapping=inputs[_SLOTS, :bs],
                decode_rows=torch.arange(bs, device=device),
                decode_blocks=tables[:bs].view(-1),
                decode_mask=torch.empty(0, device=device),
                prefills=[],
                all_decode=True,
                decode_lens=inputs[_LENS, :bs],
            )

            def step(bs: int = bs, meta: AttentionMetadata = meta) -> torch.Tensor:
                src = inputs[_SRC, :bs]
                ids = torch.where(src >= 0, self._last_tokens[src.clamp(min=0)], inputs[_IDS, :bs])
                pos = inputs[_POS, :bs]
                return model.forward_logits(ids, pos, kv_caches, meta, kernels=True)  # (bs, V) fp32

            self._graphs[bs], self._logits[bs] = capture(step, device, pool)
            pool = self._graphs[bs].pool()
        torch.cuda.synchronize(device)

    def run(
        self,
        ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        tables: Sequence[Sequence[int]],
        sources: Sequence[int],
    ) -> torch.Tensor:
        """Replay the step for ``n`` rows, a query token each; return ``(n, vocab)`` fp32 logits (overwritten by the next run).

        A row is a decode step's token or one of a short run of a request's new tokens (rows in
        order, sharing its table): each row's context ends at its own token, whose key and value
        every layer writes before attending. ``positions`` are the rows' positions (the context
        length is ``position + 1``), ``slots`` their flat KV slots, ``tables`` each row's block ids,
        ``sources`` each row's index into the last sampled ids, or -1 where ``ids`` holds the token.
        """
        n = len(ids)
        bs = next(s for s in self.sizes if s >= n)
        self.inputs.stage(ids, positions, slots, tables, sources, bs)
        self._graphs[bs].replay()
        self.num_replays += 1
        return self._logits[bs][:n]
