"""Turns a scheduled batch into tensors, runs the model over them and returns logits.

Owns the KV cache tensors (one ``(num_blocks, block_size, nkv, hd)`` key and value tensor per
layer), the flattening of many requests' new tokens into one batch with positions and slot
mapping, and picking the rows that are sampled. Does not own which blocks a request has (it reads
``KVCacheManager`` block tables) nor sampling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from selfhost.models.ops import build_attention_metadata

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.config import ModelConfig
    from selfhost.graphs import DecodeGraphs
    from selfhost.kv_cache import KVCacheManager
    from selfhost.models.llama import LlamaForCausalLM
    from selfhost.scheduler import ScheduledBatch


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes across all layers (keys and values)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem


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
        max_model_len: int = 0,
    ) -> None:
        """Allocate the KV cache tensors, and capture decode graphs when asked.

        ``use_kernels`` runs the Triton pass; ``graph_batch_sizes`` (CUDA only) captures decode
        steps of those sizes, whose block tables hold ``max_model_len`` tokens.
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
        self.graphs: DecodeGraphs | None = None
        if graph_batch_sizes:
            from selfhost.graphs import DecodeGraphs

            max_blocks = -(-max_model_len // block_size)
            self.graphs = DecodeGraphs(model, self.kv_caches, graph_batch_sizes, max_blocks, self.device)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, kv: KVCacheManager) -> torch.Tensor:
        """Run the batch's new tokens; return ``(S, vocab)`` fp32 logits of its S sampling requests, in order."""
        graphs = self.graphs
        if graphs is not None and len(batch.requests) <= graphs.max_batch and all(n == 1 for n in batch.num_new_tokens):
            return self._execute_graph(graphs, batch, kv)
        input_ids: list[int] = []
        positions: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logits_rows: list[int] = []
        for request, num_new in zip(batch.requests, batch.num_new_tokens, strict=True):
            start, end = request.num_computed_tokens, request.num_computed_tokens + num_new
            input_ids.extend(request.all_token_ids[start:end])
            positions.extend(range(start, end))
            query_start.append(query_start[-1] + num_new)
            seq_lens.append(end)
            tables.append(kv.block_ids(request.request_id))
            if end == request.num_tokens:
                logits_rows.append(query_start[-1] - 1)
        meta = build_attention_metadata(query_start, seq_lens, tables, self.block_size, self.device)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model(ids, pos, self.kv_caches, meta, kernels=self.use_kernels)  # (N, C)
        rows = torch.tensor(logits_rows, dtype=torch.long, device=self.device)
        return self.model.compute_logits(hidden[rows])  # (S, V)

    def _execute_graph(self, graphs: DecodeGraphs, batch: ScheduledBatch, kv: KVCacheManager) -> torch.Tensor:
        """A one-token-per-request step through the captured graph of the next batch size up."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        rows: list[int] = []
        for i, request in enumerate(batch.requests):
            pos = request.num_computed_tokens
            table = kv.block_ids(request.request_id)
            ids.append(request.all_token_ids[pos])
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            tables.append(table)
            if pos + 1 == request.num_tokens:
                rows.append(i)
        logits = graphs.run(ids, positions, slots, tables)  # (n, V), valid until the next replay
        if len(rows) == len(ids):
            return logits
        return logits[torch.tensor(rows, dtype=torch.long, device=self.device)]
