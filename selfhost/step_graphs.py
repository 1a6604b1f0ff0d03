"""CUDA graphs of the steps the decode graphs do not take: prefills, chunks mixed with decodes.

A step of a small model launches a few hundred kernels whatever its token count; from Python each
costs tens of microseconds of host time, far more than the GPU spends on a short step. As vLLM v1
does, a step's N tokens are padded to the next captured token count T and the whole pass (final
norm, the sampled rows' LM head) replays from a graph per T (two for a large T, below), reading
static buffers.

Layout of a step (the caller's flattened batch, in this order):

- rows ``[0, D)``: the one-token (decode) sequences, one row each;
- then each multi-token sequence's rows (any one-token sequence after the first multi-token one
  counts as multi-token);
- rows ``[N, T)``: padding, with token 0 at position 0 and slot -1 (no KV write).

Attention takes both kernels over fixed-shape metadata (``models.fused``'s static mixed path):
decode attention over rows ``[0, Dcap)`` with ``Dcap = min(T, max_num_seqs)`` and length 0 on rows
that are not decode rows, then prefill attention over ``Pcap`` sequence slots (query length 0 on
unused ones), its grid sized for T query tokens. Every grid and constexpr depends on T, Dcap, Pcap
and the block-table width alone, and nothing in the captured function syncs with the device. A T
above the engine's cap on a chunk beside decodes (``chunk_tokens``) has a second graph, replayed
by the steps whose prompt tokens fit that cap (every step that decodes, by the scheduler's rule),
whose prefill launch splits the keys for a chunk of that cap.

Owns the static buffers, the host staging and fill, the captures and the replay; on a device
without CUDA graphs (the CPU, in tests under ``TRITON_INTERPRET=1``) the same step function is
called directly. Does not own choosing which steps run here or building the flattened batch
(``runner``), steps of a few tokens a request (``selfhost.graphs``), the kernels (``kernels/``) nor sampling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from kernels.paged_prefill import prefill_kernel_fits
from selfhost.graphs import TableRows, capture
from selfhost.models import fused
from selfhost.models.ops import AttentionMetadata, PrefillBatch

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch.cuda import _POOL_HANDLE

    from selfhost.models.llama import LlamaForCausalLM


def _align(n: int) -> int:
    """``n`` rounded up to 16 elements, so every section of the packed buffer starts 64-byte aligned."""
    return -(-n // 16) * 16


class StepGraphs:
    """Graphs of padded mixed and prefill steps, one per token count T, over one model and its KV cache tensors.

    Use ``fits`` (or a None from ``run``) to decide between a replay and the eager step. Replays must
    be serialised on one stream; each T's logits buffer is overwritten by that T's next replay.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        token_sizes: Sequence[int],
        max_num_seqs: int,
        max_blocks: int,
        device: torch.device,
        *,
        max_multi: int = 8,
        chunk_tokens: int = 0,
        last_tokens: torch.Tensor | None = None,
        pool: _POOL_HANDLE | None = None,
    ) -> None:
        """Allocate the static buffers and, on CUDA, capture one graph per token count (largest first).

        Args:
            model: the model, run on the kernel pass (``models.fused``).
            kv_caches: per layer ``(k_cache, v_cache)``, each ``(num_blocks, block_size, nkv, hd)``.
            token_sizes: the token counts T to capture (``EngineConfig.graph_token_sizes()``).
            max_num_seqs: most sequences in a step; bounds the decode rows and the sampled rows.
            max_blocks: the width of a block table (``ceil(max_model_len / block_size)``).
            device: where the model runs; only CUDA captures, elsewhere ``run`` calls the step directly.
            max_multi: Pcap, the multi-token sequences a step may hold (more: ``run`` returns None).
            chunk_tokens: the most prompt tokens a step that also decodes gives a chunk
                (``EngineConfig.mixed_prefill_tokens``; 0: no such cap). Each T above it gets a
                second graph for the steps whose prompt tokens fit it, its prefill keys split for
                a chunk of ``chunk_tokens`` (the grid still covers T tokens, so any step stays correct).
            last_tokens: the runner's device buffer of the previous step's sampled ids (async
                scheduling); a row named in ``run``'s ``pending_rows`` reads its token id there.
            pool: a CUDA graph memory pool to capture into (``DecodeGraphs.pool``, or another
                ``StepGraphs.pool``); None starts a new one. Exposed afterwards as ``self.pool``.

        Raises:
            ValueError: no token sizes, or the prefill kernel cannot take the model's head dim here.
        """
        if not token_sizes or min(token_sizes) <= 0:
            raise ValueError(f"token_sizes must be positive and not empty, got {tuple(token_sizes)}")
        if max_multi <= 0 or max_num_seqs <= 0:
            raise ValueError(f"max_multi and max_num_seqs must be positive, got {max_multi}, {max_num_seqs}")
        q_probe = torch.empty((1, model.cfg.num_heads, model.cfg.head_dim), device=device)
        if device.type == "cuda" and not prefill_kernel_fits(q_probe, kv_caches[0][0]):
            raise ValueError(f"the paged prefill kernel cannot take head dim {model.cfg.head_dim}: no step graphs")
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(set(token_sizes))
        self.max_tokens = self.sizes[-1]
        self.max_num_seqs = max_num_seqs
        self.max_multi = max_multi
        self.chunk_tokens = chunk_tokens
        self.max_blocks = max_blocks
        self.device = device
        self.on_cuda = device.type == "cuda"
        tmax, dmax, p = self.max_tokens, self._dcap(self.max_tokens), max_multi
        # NOTE(crossway): every per-step int lives in one packed int32 buffer (the kernels, the
        # embedding and index_select all take int32), so a step uploads it in one copy, plus one
        # copy of the block-table rows it uses. Sections: ids, positions, slots (tmax each), decode
        # lengths, sampled rows (dmax each), the multi-token sequences' query starts, query lengths
        # and context lengths (Pcap each), each row's index into ``last_tokens`` (-1: its id is in ids).
        sizes = [tmax, tmax, tmax, dmax, dmax, p, p, p, tmax]
        starts = np.cumsum([0, *(_align(s) for s in sizes)]).tolist()
        self._sections = [(int(a), int(a) + s) for a, s in zip(starts, sizes, strict=False)]
        pinned = self.on_cuda
        # NOTE(crossway): two pinned staging buffers used in turn; before one is rewritten, the event
        # recorded after its last upload is waited on, so a step the host prepares while the GPU is
        # still behind (async scheduling) never rewrites inputs whose copy has not run yet.
        self._host = [torch.zeros(starts[-1], dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        # tables: rows [0, Pcap) the multi-token sequences', rows [Pcap, Pcap + Dcap) the decode rows'
        self._host_tables = [
            torch.zeros((p + dmax, max_blocks), dtype=torch.int32, pin_memory=pinned) for _ in range(2)
        ]
        self._table_rows = [TableRows(t.numpy()) for t in self._host_tables]
        self._uploaded = [torch.cuda.Event() for _ in range(2)] if self.on_cuda else []  # type: ignore[no-untyped-call]
        self._turn = 0
        self._packed = torch.zeros(starts[-1], dtype=torch.int32, device=device)
        self._tables = torch.zeros((p + dmax, max_blocks), dtype=torch.int32, device=device)
        ids, pos, slots, dlens, rows, qstarts, qlens, slens, src = (self._packed[a:b] for a, b in self._sections)
        self._ids, self._pos, self._slots, self._dlens, self._rows = ids, pos, slots, dlens, rows
        self._qstarts, self._qlens, self._slens, self._src = qstarts, qlens, slens, src
        self._last_tokens = last_tokens
        # NOTE(h7): a T-token graph over T > chunk_tokens is captured twice: for steps whose prompt
        # tokens are at most chunk_tokens (every step that decodes), and for the others (up to T)
        mixed = [(t, True) for t in self.sizes if 0 < chunk_tokens < t]
        self._steps = {key: self._make_step(*key) for key in [(t, False) for t in self.sizes] + mixed}
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._logits: dict[tuple[int, bool], torch.Tensor] = {}
        self.pool = pool
        self.num_replays = 0
        """Steps run through ``run`` (replays on CUDA, direct calls elsewhere)."""
        if self.on_cuda:
            self._capture()

    def _dcap(self, t: int) -> int:
        """Decode rows (and sampled rows) of the T-token graph: no more than its rows nor than a step's sequences."""
        return min(t, self.max_num_seqs)

    def bucket(self, num_tokens: int) -> int | None:
        """The captured token count a step of ``num_tokens`` pads to; None when it exceeds the largest."""
        return next((t for t in self.sizes if t >= num_tokens), None)

    def fits(self, num_tokens: int, num_decode: int, num_multi: int) -> bool:
        """Whether a step of ``num_tokens`` rows, ``num_decode`` leading one-token sequences and ``num_multi`` others can replay."""
        t = self.bucket(num_tokens)
        return t is not None and 0 <= num_multi <= self.max_multi and 0 <= num_decode <= self._dcap(t)

    def _make_step(self, t: int, mixed: bool) -> Callable[[], torch.Tensor]:
        """The step function of the T-token graph: the forward over rows ``[0, T)`` and logits of ``Dcap`` rows.

        ``mixed``: the graph for steps whose prompt tokens fit ``chunk_tokens`` (those that also
        decode), whose prefill launch splits its keys for a chunk of that many.
        """
        dcap, p = self._dcap(t), self.max_multi
        meta = AttentionMetadata(
            slot_mapping=self._slots[:t],
            decode_rows=torch.arange(dcap, device=self.device),  # documents the layout; the static path slices
            decode_blocks=self._tables[p : p + dcap].view(-1),  # (Dcap * max_blocks,)
            decode_mask=torch.empty(0, device=self.device),
            prefills=[],
            all_decode=False,
            decode_lens=self._dlens[:dcap],
            prefill_batch=PrefillBatch(
                query_starts=self._qstarts,
                query_lens=self._qlens,
                seq_lens=self._slens,
                block_tables=self._tables[:p],  # (Pcap, max_blocks)
                max_query_len=t,  # the grid covers any chunk of the step: fixed per T
                # NOTE(h7): a mixed step's chunk fills a few of the grid's tiles; its keys are split
                # for those. Sized for T, a 128-token chunk behind 7,680 tokens (the chunked bench's
                # last chunks, in a 256-token graph) took SmolLM2 13 splits and 23.9 us a layer,
                # against 19.2 at 22, and the 8B 3 splits and 82.7 us against 65.7 at 4 (H100,
                # 2026-12-06, ``bench.probe_prefill_splits --grid pad``)
                split_query_len=self.chunk_tokens if mixed else None,
            ),
        )
        model, kv_caches, pos, rows, last = self.model, self.kv_caches, self._pos, self._rows, self._last_tokens

        def step() -> torch.Tensor:
            ids = self._ids[:t]
            if last is not None:
                src = self._src[:t]
                ids = torch.where(src >= 0, last[src.clamp(min=0)], ids)  # (T,) int64
            hidden = fused.forward(model, ids, pos[:t], kv_caches, meta, decode_prefix=dcap)  # (T, C)
            return model.compute_logits(hidden.index_select(0, rows[:dcap]))  # (Dcap, V) fp32

        return step

    @torch.inference_mode()
    def _capture(self) -> None:
        device = self.device
        self._slots.fill_(-1)  # warm-up and capture runs write nothing into the cache
        self._src.fill_(-1)
        self._dlens.zero_()
        self._qlens.zero_()
        self._slens.zero_()
        pool = self.pool
        for key in sorted(self._steps, reverse=True):  # largest T first: the smaller graphs reuse its memory pool
            self._graphs[key], self._logits[key] = capture(self._steps[key], device, pool)
            pool = self._graphs[key].pool()
        self.pool = pool
        torch.cuda.synchronize(device)

    @torch.inference_mode()
    def run(
        self,
        ids: Sequence[int] | np.ndarray,
        positions: Sequence[int] | np.ndarray,
        slots: Sequence[int] | np.ndarray,
        query_starts: Sequence[int],
        seq_lens: Sequence[int],
        tables: Sequence[Sequence[int]],
        logits_rows: Sequence[int],
        pending_rows: Sequence[int] = (),
        pending_sources: Sequence[int] = (),
    ) -> torch.Tensor | None:
        """Run one step padded to the next captured token count; None when it fits no graph (run it eagerly).

        Args:
            ids: ``(N,)`` token ids of the flattened batch, one-token sequences first (module docstring).
            positions: ``(N,)`` each token's position in its sequence.
            slots: ``(N,)`` each token's flat KV slot (``block * block_size + offset``).
            query_starts: ``(num_seqs + 1,)`` first row of each sequence, then N.
            seq_lens: ``(num_seqs,)`` context length of each sequence, its new tokens included.
            tables: each sequence's block ids (at most ``max_blocks``).
            logits_rows: ``(S,)`` rows whose logits are returned (each sampled sequence's last row).
            pending_rows: rows whose token was sampled by a step whose ids have not reached the
                host (async scheduling); ``ids`` holds placeholders there. Needs ``last_tokens``.
            pending_sources: for each of ``pending_rows``, its index into ``last_tokens``.

        Returns:
            ``(S, vocab)`` fp32 logits, valid until the next step of the same token count; or None.

        Raises:
            ValueError: a block table wider than ``max_blocks``, or pending rows without ``last_tokens``.
        """
        n, num_seqs, num_rows = len(ids), len(seq_lens), len(logits_rows)
        d = next((i for i in range(num_seqs) if query_starts[i + 1] - query_starts[i] != 1), num_seqs)
        multi = num_seqs - d
        if n == 0 or not self.fits(n, d, multi):
            return None
        t = self.bucket(n)
        if t is None:  # fits() checked it; this narrows the type
            return None
        dcap, p = self._dcap(t), self.max_multi
        if num_rows > dcap:
            return None
        if len(pending_rows) and self._last_tokens is None:
            raise ValueError("pending rows need the last_tokens buffer")
        if max(map(len, tables), default=0) > self.max_blocks:
            raise ValueError(f"a block table is wider than max_blocks={self.max_blocks}")
        # the graph whose splits are sized for the step's prompt tokens: the cap's where they fit it
        key = (t, n - d <= self.chunk_tokens and (t, True) in self._steps)
        turn = self._turn
        self._turn ^= 1
        if self.on_cuda:
            self._uploaded[turn].synchronize()  # an unrecorded event returns at once
        h = self._host[turn].numpy()
        ids_h, pos_h, slots_h, dlens_h, rows_h, qstarts_h, qlens_h, slens_h, src_h = (h[a:b] for a, b in self._sections)
        ids_h[:n] = ids
        ids_h[n:t] = 0
        pos_h[:n] = positions
        pos_h[n:t] = 0
        slots_h[:n] = slots
        slots_h[n:t] = -1  # padding rows: no KV write
        src_h[:t] = -1
        if len(pending_rows):
            src_h[np.asarray(pending_rows, dtype=np.int64)] = pending_sources
        dlens_h[:d] = seq_lens[:d]
        dlens_h[d:dcap] = 0  # rows that are not decode rows: a zero decode output, overwritten or unread
        rows_h[:num_rows] = logits_rows
        rows_h[num_rows:dcap] = 0
        starts = np.asarray(query_starts[d:], dtype=np.int64)  # (multi + 1,)
        qstarts_h[:multi] = starts[:-1]
        qlens_h[:multi] = np.diff(starts)
        slens_h[:multi] = seq_lens[d:]
        qstarts_h[multi:] = 0
        qlens_h[multi:] = 0  # unused sequence slots: their programs exit at once
        slens_h[multi:] = 0
        rows = self._table_rows[turn]
        rows.put_all(tables[:d], p)
        for i in range(d, len(tables)):
            rows.put(i - d, tables[i])
        self._packed.copy_(self._host[turn], non_blocking=True)
        self._tables[: p + dcap].copy_(self._host_tables[turn][: p + dcap], non_blocking=True)
        if self.on_cuda:
            self._uploaded[turn].record()
        self.num_replays += 1
        if self.on_cuda:
            self._graphs[key].replay()
        else:
            self._logits[key] = self._steps[key]()
        return self._logits[key][:num_rows]
