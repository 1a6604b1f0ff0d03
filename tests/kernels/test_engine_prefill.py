"""The engine's multi-token rows on the paged prefill kernel against the plain torch engine.

Same tiny random-weight shape as ``test_engine_kernels`` (GQA ratio 3, head dim 16, 4-token
blocks). Chunked prefill (an 8-token step budget) and a second pass over the same prompts (every
prompt then hits the prefix cache) put prefill chunks behind cached blocks and beside decode rows
in one batch; greedy ids in fp32 must equal the torch engine's token for token.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from kernels import paged_prefill
from selfhost.config import EngineConfig
from selfhost.engine import LLMEngine
from selfhost.models import fused, ops
from tests.kernels.test_engine_kernels import GREEDY, TINY, prompts, tiny_model

if TYPE_CHECKING:
    import torch


def _engine(device: torch.device | str, **overrides: object) -> LLMEngine:
    # eager: the spies below read device tensors, which a CUDA graph capture forbids (graphs: test_step_graphs)
    cfg = EngineConfig(
        block_size=4, num_kv_blocks=128, max_model_len=128, max_num_seqs=8, device=str(device), enforce_eager=True
    )
    return LLMEngine(tiny_model(device), TINY, None, replace(cfg, **overrides))  # type: ignore[arg-type]


def _two_passes(engine: LLMEngine) -> tuple[list[list[int]], list[list[int]]]:
    """Generate twice: the second pass runs every prompt behind its cached prefix."""
    first = engine.generate(prompts(), GREEDY)
    hits_before = engine.kv.prefix_hit_tokens
    second = engine.generate(prompts(), GREEDY)
    assert engine.kv.prefix_hit_tokens > hits_before  # the second pass did hit the cache
    return first, second


class _Spy:
    """Counts the kernel path's prefill launches (and those behind a cached prefix) and its SDPA fallbacks."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.launches = 0
        self.behind_prefix = 0
        self.mixed = 0
        self.sdpa = 0
        real_kernel, real_sdpa = paged_prefill.paged_prefill_attention, ops.prefill_attention

        def kernel(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            starts, qlens, slens = args[3], args[4], args[5]
            self.launches += 1
            self.behind_prefix += int(bool((slens > qlens).any()))
            self.mixed += int(int(qlens.sum()) < q.shape[0])  # rows no prefill owns: decode rows
            assert starts.shape == qlens.shape
            return real_kernel(q, *args, **kwargs)

        def sdpa(*args: Any, **kwargs: Any) -> None:
            self.sdpa += 1
            real_sdpa(*args, **kwargs)

        monkeypatch.setattr(fused, "paged_prefill_attention", kernel)
        monkeypatch.setattr(ops, "prefill_attention", sdpa)


@pytest.mark.parametrize("budget", [8, 13])
def test_kernel_prefill_greedy_equals_torch_engine_under_chunking_and_prefix_hits(
    device: torch.device, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """Chunks of 8 and 13 tokens (13 ends mid-block), cold and behind cached blocks, give the torch ids."""
    expected = _two_passes(_engine("cpu", use_kernels=False, max_num_batched_tokens=budget))
    spy = _Spy(monkeypatch)
    got = _two_passes(_engine(device, use_kernels=True, max_num_batched_tokens=budget))
    assert got == expected
    assert got[0] == got[1]  # prefix hits do not change the ids
    assert spy.sdpa == 0  # every multi-token row ran on the kernel
    assert spy.launches > 0
    assert spy.behind_prefix > 0
    assert spy.mixed > 0  # chunks shared steps with decode rows


def test_kernel_prefill_falls_back_to_sdpa_when_the_kernel_cannot_launch(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel does not fit (forced here), multi-token rows take SDPA and the ids stay the same."""
    expected = _engine("cpu", use_kernels=False, max_num_batched_tokens=8).generate(prompts(), GREEDY)
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(fused, "prefill_kernel_fits", lambda q, k_cache: False)
    got = _engine(device, use_kernels=True, max_num_batched_tokens=8).generate(prompts(), GREEDY)
    assert got == expected
    assert spy.launches == 0
    assert spy.sdpa > 0


def test_chunks_behind_a_prefix_split_their_keys_and_give_the_torch_ids(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short chunks and prefix-hit tails split each query tile's keys over several programs; ids stay the torch ones."""
    expected = _two_passes(_engine("cpu", use_kernels=False, max_num_batched_tokens=8))
    spy = _Spy(monkeypatch)
    splits: list[int] = []
    real_default = paged_prefill.default_splits

    def default_splits(*args: Any) -> int:
        splits.append(real_default(*args))
        return splits[-1]

    monkeypatch.setattr(paged_prefill, "default_splits", default_splits)
    got = _two_passes(_engine(device, use_kernels=True, max_num_batched_tokens=8))
    assert got == expected
    assert spy.behind_prefix > 0
    assert len(splits) == spy.launches
    assert max(splits) > 1  # 8-token chunks: a handful of query tiles, their keys split
