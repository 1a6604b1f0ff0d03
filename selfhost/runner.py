"""Turns a scheduled batch into tensors, runs the model over them and returns logits.

Owns the KV cache tensors (one ``(num_blocks, block_size, nkv, hd)`` key and value tensor per
layer), the flattening of many requests' new tokens into one batch with positions and slot
mapping, the device buffer of the last sampled ids (a step planned before they reach the host
reads a request's newest token there), picking the rows that are sampled, and choosing between a
decode graph, a step graph and the eager pass. Does not own which blocks a request has (it reads
``KVCacheManager`` block tables), the graphs themselves (``graphs``, ``step_graphs``) nor sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from selfhost.models.ops import build_attention_metadata, upload

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.config import ModelConfig
    from selfhost.graphs import DecodeGraphs
    from selfhost.kv_cache import KVCacheManager
    from selfhost.models.llama import LlamaForCausalLM
    from selfhost.request import Request
    from selfhost.scheduler import ScheduledBatch
    from selfhost.step_graphs import StepGraphs


DECODE_ROWS_MAX = 8
"""Most rows (new tokens) of a step that runs through the decode graphs when a request in it runs
more than one token: a prefix hit's short tail or a short prompt, on a quiet engine.

NOTE(h7): the step graphs pad such a step to 16 rows and run the prefill attention and their empty
decode rows besides. On the H100 (SmolLM2, bf16, a 4k prompt's prefix cached; alternated runs on
four machines, bench/results/engine_gpu_smollm_short_tails_h100.json) the decode graphs took the
device's part of the cached TTFT from 1.09-1.24 to 0.72-1.02 ms for a 4-token tail and from
0.99-1.23 to 0.90-1.13 for 8, while a 16-token tail came out even or up to 0.1 ms slower. Each row
reads the context up to its own token, so t rows read it t times (from L2 after the first); bigger
steps keep the step graphs.
"""


def _cached_slots(table: Sequence[int], start: int, end: int, block_size: int, kv_tokens: int) -> list[int]:
    """Flat KV slots of positions ``[start, end)``, with -1 (no write) below ``kv_tokens``.

    A full prefix hit's last token runs again for its logits while its key and value already sit in
    a block other requests share: writing them again would change that block under its readers.
    """
    skip = min(kv_tokens, end) - start
    return [-1] * skip + [table[p // block_size] * block_size + p % block_size for p in range(start + skip, end)]


def _interleave(rows: list[int], runs: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """``rows`` with each run's array inserted before the row at its index (runs in order), as one int64 array."""
    pieces: list[list[int] | np.ndarray] = []
    prev = 0
    for at, arr in runs:
        pieces += [rows[prev:at], arr]
        prev = at
    pieces.append(rows[prev:])
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces])


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes across all layers (keys and values)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem


@dataclass(slots=True)
class _Flat:
    """A step's new tokens as one flat batch (``ModelRunner._flatten``).

    ``ids``, ``positions`` and ``slots`` are lists while every request runs one token, and int64
    arrays once a request runs several (a prefill chunk).
    """

    ids: list[int] | np.ndarray = field(default_factory=list)
    positions: list[int] | np.ndarray = field(default_factory=list)
    slots: list[int] | np.ndarray = field(default_factory=list)
    """Flat KV slot of each token; -1 where its KV is cached already (``Request.num_kv_tokens``)."""
    query_start: list[int] = field(default_factory=lambda: [0])
    seq_lens: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    logits_rows: list[int] = field(default_factory=list)
    pending_rows: list[int] = field(default_factory=list)
    """Rows whose token id is in ``ModelRunner.last_tokens`` ..."""
    pending_sources: list[int] = field(default_factory=list)
    """... at these indices."""


def _run_arrays(request: Request, table: Sequence[int], start: int, end: int, bs: int) -> tuple[np.ndarray, ...]:
    """Ids (0 for a pending last token), positions and slots (``_cached_slots``' rule) of ``request``'s ``[start, end)``."""
    known = min(end, request.num_tokens)
    ids = request.token_id_array(start, known)
    if known < end:
        ids = np.append(ids, 0)
    positions = np.arange(start, end, dtype=np.int64)  # (n,)
    slots = np.asarray(table, dtype=np.int64)[positions // bs] * bs + positions % bs
    slots[: max(0, min(request.num_kv_tokens, end) - start)] = -1
    return ids, positions, slots


class ModelRunner:
    """Owns the model and its paged KV cache tensors; ``execute`` runs one step."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: str,
        *,
        use_kernels: bool = False,
        graph_batch_sizes: Sequence[int] = (),
        graph_token_sizes: Sequence[int] = (),
        max_model_len: int = 0,
        max_num_seqs: int = 256,
        mixed_prefill_tokens: int = 0,
    ) -> None:
        """Allocate the KV cache tensors, and capture decode graphs when asked.

        ``use_kernels`` runs the Triton pass; ``graph_batch_sizes`` (CUDA only) captures decode
        steps of those sizes, whose block tables hold ``max_model_len`` tokens, and
        ``graph_token_sizes`` the other steps padded to those token counts; ``max_num_seqs`` bounds
        the requests of a step, and ``mixed_prefill_tokens`` (a step's chunk beside decodes, 0: no
        cap) the chunk the step graphs' prefill splits are sized for.
        """
        self.model = model
        self.use_kernels = use_kernels
        self.cfg = cfg
        self.block_size = block_size
        self.device = torch.device(device)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(cfg.num_layers)
        ]
        # NOTE(crossway): the last step's sampled ids stay on the device, and a step planned before
        # they reach the host (async scheduling) reads a request's newest token from here.
        self.last_tokens = torch.zeros(max_num_seqs, dtype=torch.long, device=self.device)
        self._last_rows: dict[str, int] = {}
        self.graphs: DecodeGraphs | None = None
        self.step_graphs: StepGraphs | None = None
        max_blocks = -(-max_model_len // block_size)
        pool = None
        if graph_token_sizes:
            from selfhost.step_graphs import StepGraphs

            try:
                self.step_graphs = StepGraphs(
                    model,
                    self.kv_caches,
                    graph_token_sizes,
                    max_num_seqs,
                    max_blocks,
                    self.device,
                    chunk_tokens=mixed_prefill_tokens,
                    last_tokens=self.last_tokens,
                )
                pool = self.step_graphs.pool
            except ValueError:
                self.step_graphs = None  # a head dim the prefill kernel cannot take: those steps run eagerly
        if graph_batch_sizes:
            from selfhost.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(
                model, self.kv_caches, graph_batch_sizes, max_blocks, self.device, self.last_tokens, pool=pool
            )

    def record_sampled(self, requests: Sequence[Request], picked: torch.Tensor) -> None:
        """Keep a step's ``(S,)`` sampled ids on the device, for the next step's rows whose token is pending."""
        self.last_tokens[: picked.shape[0]].copy_(picked)
        self._last_rows = {r.request_id: i for i, r in enumerate(requests)}

    def _source(self, request: Request, start: int, end: int) -> tuple[list[int], int]:
        """The token ids of positions ``[start, end)`` known on the host (0 for a pending one), and ``_pending_source``."""
        source = self._pending_source(request, end)
        if source < 0:
            return request.all_token_ids[start:end], -1
        return [*request.all_token_ids[start : end - 1], 0], source

    def _pending_source(self, request: Request, end: int) -> int:
        """The last step's row that sampled position ``end - 1``'s token when the host does not know it yet, else -1."""
        known = request.num_tokens
        if end <= known:
            return -1
        if end != known + 1:
            raise RuntimeError(f"{request!r} runs {end - known} tokens not yet sampled; at most one can be pending")
        return self._last_rows[request.request_id]

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, kv: KVCacheManager) -> torch.Tensor:
        """Run the batch's new tokens; return ``(S, vocab)`` fp32 logits of its S sampling requests, in order."""
        graphs = self.graphs
        n = batch.total_tokens
        if graphs is not None and n <= graphs.max_batch and (n == len(batch.requests) or n <= DECODE_ROWS_MAX):
            return self._execute_graph(graphs, batch, kv)
        steps = self.step_graphs
        order: Sequence[int] = range(len(batch.requests))
        if steps is not None:  # the step graphs take the one-token rows first
            ones = [i for i, num_new in enumerate(batch.num_new_tokens) if num_new == 1]
            order = ones + [i for i, num_new in enumerate(batch.num_new_tokens) if num_new != 1]
        flat = self._flatten(batch, kv, order)
        if steps is not None:
            logits = steps.run(
                flat.ids,
                flat.positions,
                flat.slots,
                flat.query_start,
                flat.seq_lens,
                flat.tables,
                flat.logits_rows,
                flat.pending_rows,
                flat.pending_sources,
            )
            if logits is not None:
                return logits
        meta = build_attention_metadata(
            flat.query_start, flat.seq_lens, flat.tables, self.block_size, self.device, flat.slots
        )
        token_ids = upload(flat.ids, torch.long, self.device)
        if flat.pending_rows:
            rows = upload(flat.pending_rows, torch.long, self.device)
            token_ids[rows] = self.last_tokens[upload(flat.pending_sources, torch.long, self.device)]
        pos = upload(flat.positions, torch.long, self.device)
        if len(flat.logits_rows) == n:  # a row a request, each sampling: rows 0 .. n - 1 in order
            return self.model.forward_logits(token_ids, pos, self.kv_caches, meta, kernels=self.use_kernels)
        hidden = self.model(token_ids, pos, self.kv_caches, meta, kernels=self.use_kernels)  # (N, C)
        return self.model.compute_logits(hidden[upload(flat.logits_rows, torch.long, self.device)])  # (S, V)

    def _flatten(self, batch: ScheduledBatch, kv: KVCacheManager, order: Sequence[int]) -> _Flat:
        """The batch's new tokens as one flat batch, requests in ``order``; logits rows in the batch's sampling order.

        NOTE(h7): a one-token row goes into lists; a run of several tokens is built in numpy. Per
        token in Python, a cold 4,096-token prompt's slots and the staging of three such lists into
        the step graph's buffers took ~0.9 ms of the H100 host's time before its graph could start.
        """
        flat = _Flat()
        bs = self.block_size
        last_row = [0] * len(batch.requests)
        runs: list[tuple[int, tuple[np.ndarray, ...]]] = []  # (one-token rows before it, its arrays)
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start, seq_lens, tables = flat.query_start, flat.seq_lens, flat.tables
        pending_rows, pending_sources = flat.pending_rows, flat.pending_sources
        last_rows, block_ids = self._last_rows, kv.block_ids
        row0 = 0
        for i in order:
            request, start, num_new = batch.requests[i], batch.starts[i], batch.num_new_tokens[i]
            end = start + num_new
            table = block_ids(request.request_id)
            known = len(request.all_token_ids)
            if num_new == 1 and request.num_kv_tokens <= start <= known:
                # NOTE(h7): a decode row, most of a mixed step's rows: ``_pending_source`` and the
                # slot rule spelled out as in ``_execute_graph``. With the step graphs' table rows
                # put in one call, ``execute`` of the chunked bench's mixed step (128 decodes and a
                # chunk) took 0.29 ms on the CPU VM against 0.42 (medians, alternated in one process)
                if start < known:
                    ids.append(request.all_token_ids[start])
                else:
                    ids.append(0)
                    pending_rows.append(row0)
                    pending_sources.append(last_rows[request.request_id])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                source = self._pending_source(request, end)
                if source >= 0:
                    pending_rows.append(row0 + num_new - 1)
                    pending_sources.append(source)
                if num_new == 1:
                    ids.append(request.all_token_ids[start] if start < known else 0)
                    positions.append(start)
                    slots.append(-1 if request.num_kv_tokens > start else table[start // bs] * bs + start % bs)
                else:
                    runs.append((len(ids), _run_arrays(request, table, start, end, bs)))
            row0 += num_new
            query_start.append(row0)
            seq_lens.append(end)
            tables.append(table)
            last_row[i] = row0 - 1
        flat.ids, flat.positions, flat.slots = ids, positions, slots
        if runs:
            flat.ids, flat.positions, flat.slots = (
                _interleave(rows, [(at, arrays[k]) for at, arrays in runs])
                for k, rows in enumerate((ids, positions, slots))
            )
        flat.logits_rows = [last_row[i] for i, samples in enumerate(batch.samples) if samples]
        return flat

    def _execute_graph(self, graphs: DecodeGraphs, batch: ScheduledBatch, kv: KVCacheManager) -> torch.Tensor:
        """A step of few new tokens a request through the captured decode graph of the next row count up.

        Each new token is a row of its own, attending over its context up to itself: every layer
        writes the step's keys and values before it attends, so a request's later rows see its
        earlier ones.
        """
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        sources: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        rows: list[int] = []
        last_rows, block_ids = self._last_rows, kv.block_ids
        for request, start, num_new, samples in zip(
            batch.requests, batch.starts, batch.num_new_tokens, batch.samples, strict=True
        ):
            table = block_ids(request.request_id)
            known = len(request.all_token_ids)
            if num_new == 1 and request.num_kv_tokens <= start <= known:
                # NOTE(h7): a decode row, the bulk of every step: ``_source`` and the slot rule spelled
                # out, since this loop runs for every running request while the device waits on it
                if start < known:
                    ids.append(request.all_token_ids[start])
                    sources.append(-1)
                else:
                    ids.append(0)
                    sources.append(last_rows[request.request_id])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
                tables.append(table)
            else:
                end = start + num_new
                tokens, source = self._source(request, start, end)
                ids.extend(tokens)
                positions.extend(range(start, end))
                if num_new > 1:
                    sources.extend([-1] * (num_new - 1))
                sources.append(source)  # only the last token can be pending
                if request.num_kv_tokens > start:
                    slots.extend(_cached_slots(table, start, end, bs, request.num_kv_tokens))
                else:
                    slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
                tables.extend([table] * num_new)
            if samples:
                rows.append(len(ids) - 1)
        logits = graphs.run(ids, positions, slots, tables, sources)  # (n, V), valid until the next replay
        if len(rows) == len(ids):
            return logits
        if len(rows) == 1:  # a lone request's tail: a view, where an index would upload it first
            return logits[rows[0] : rows[0] + 1]
        return logits[upload(rows, torch.long, self.device)]
