"""A request's state inside the engine core.

Owns the token ids (prompt then output), ``num_computed_tokens`` (how many of them have KV in the
cache, or are scheduled to: it catches up to ``num_tokens`` through prefix hits, prefill chunks and
decodes alike), the tokens sampled but not yet seen on the host, the
status, the block hashes and the per-request random generator. Does not own its KV blocks
(``kv_cache``) or its text (``output``).
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from selfhost.block_hash import extend_block_hashes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.block_hash import BlockHash
    from selfhost.sampling import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


class RequestStatus(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        """Whether the request is done (for any reason)."""
        # NOTE(crossway): keyed by the value, a str whose hash is cached: hashing an enum member
        # runs Python code, and the engine asks this of every running request every step.
        return self._value_ in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        """The OpenAI ``finish_reason`` of a finished status, else None."""
        return _FINISH_REASONS.get(self._value_)


_FINISH_REASONS: dict[str, FinishReason] = {
    RequestStatus.FINISHED_STOPPED.value: "stop",
    RequestStatus.FINISHED_LENGTH.value: "length",
    RequestStatus.FINISHED_ABORTED.value: "abort",
}


class Request:
    """One generation request; mutated only by the engine thread."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        packed_prompt: bytes = b"",
    ) -> None:
        """``packed_prompt``: the prompt through ``block_hash.pack_token_ids``, where validation packed it already."""
        self.request_id = request_id
        self.params = params
        self.cache_salt = cache_salt
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.num_prompt_tokens = len(prompt_token_ids)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_pending_tokens = 0
        """Tokens sampled on the device but not yet known on the host (async scheduling runs one step
        ahead): a step that ends at ``num_tokens + num_pending_tokens`` samples one more."""
        self.num_cached_tokens = -1
        """Prompt tokens found in the prefix cache at first scheduling (-1: not scheduled yet)."""
        self.num_kv_tokens = 0
        """Leading tokens whose keys and values the prefix hit at its last admission found in the
        cache. One more than the tokens the hit spared when it covered every block of the prompt: the
        last token then runs again for its logits, and its KV, in a shared block, is not written again."""
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.block_hashes: list[BlockHash] = []
        self._packed_prompt = packed_prompt
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.first_token_time: float | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """Generated tokens so far (a copy)."""
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens so far."""
        return len(self.all_token_ids) - self.num_prompt_tokens

    def token_id_array(self, start: int, end: int) -> np.ndarray:
        """``all_token_ids[start:end]`` (all known) as int64, read from the packed prompt where it covers them."""
        if end * 4 <= len(self._packed_prompt):
            return np.frombuffer(self._packed_prompt, dtype="<i4", count=end - start, offset=start * 4).astype(np.int64)
        return np.array(self.all_token_ids[start:end], dtype=np.int64)

    def append_output_token(self, token_id: int) -> None:
        """Record a sampled token; ``num_tokens`` grows by one, so the next step computes it."""
        self.all_token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def update_block_hashes(self, block_size: int, num_blocks: int | None = None) -> list[BlockHash]:
        """Hash blocks that became full (the first ``num_blocks`` at most); return this request's block hashes."""
        return extend_block_hashes(
            self.block_hashes, self.all_token_ids, block_size, self.cache_salt, num_blocks, self._packed_prompt
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, computed={self.num_computed_tokens}/{self.num_tokens})"
        )
