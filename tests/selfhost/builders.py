"""Builders for engine-core objects without a model."""

from __future__ import annotations

from selfhost.config import EngineConfig
from selfhost.kv_cache import KVCacheManager
from selfhost.request import Request
from selfhost.sampling import SamplingParams
from selfhost.scheduler import Scheduler

EOS = 2


def make_request(
    request_id: str, prompt: list[int] | int, *, max_tokens: int = 16, salt: str | None = None, ignore_eos: bool = True
) -> Request:
    tokens = list(range(100, 100 + prompt)) if isinstance(prompt, int) else prompt
    return Request(request_id, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos), cache_salt=salt)


def make_scheduler(
    *,
    num_blocks: int = 10,
    block_size: int = 4,
    budget: int = 16,
    max_num_seqs: int = 8,
    caching: bool = True,
    mixed_prefill: int = 0,
) -> Scheduler:
    cfg = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=caching,
        mixed_prefill_tokens=mixed_prefill,
    )
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(cfg, kv, max_model_len=num_blocks * block_size, eos_token_ids=[EOS])


def run_step(scheduler: Scheduler, token: int = 7) -> list[tuple[str, int]]:
    """Schedule one step and feed back ``token`` for every sampling request; return (id, num_new) pairs."""
    batch = scheduler.schedule()
    plan = [(r.request_id, n) for r, n in zip(batch.requests, batch.num_new_tokens, strict=True)]
    sampling = batch.sampling_requests
    scheduler.update(sampling, [token] * len(sampling))
    return plan
