"""Padded static mixed/prefill steps (``selfhost.step_graphs``) against the eager kernel step.

A tiny random-weight Llama shape (GQA ratio 3, head dim 16, 4-token blocks) over a KV cache of
random values, which stands in for cached context. On the CPU the step function runs directly
(under ``TRITON_INTERPRET=1`` on the interpreted kernels, else on their reference fallbacks); on a
GPU the same tests capture and replay the graphs. In fp32 the sampled rows' logits and the KV
cache after the step must equal the eager step's to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
import torch

from selfhost.config import EngineConfig
from selfhost.models.ops import build_attention_metadata
from selfhost.step_graphs import StepGraphs
from tests.kernels.test_engine_kernels import TINY, tiny_model

if TYPE_CHECKING:
    from selfhost.models.llama import LlamaForCausalLM

BLOCK = 4
NUM_BLOCKS = 64
MAX_BLOCKS = 12  # 48 tokens of context per sequence
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class Seq:
    """One sequence of a step: ``q_len`` new tokens ending its ``ctx``-token context."""

    ctx: int
    q_len: int
    sampled: bool = True


@dataclass
class Step:
    """A step flattened the way the runner hands it to ``StepGraphs.run``."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    query_starts: list[int]
    seq_lens: list[int]
    tables: list[list[int]]
    logits_rows: list[int]


def random_caches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    shape = (NUM_BLOCKS, BLOCK, TINY.num_kv_heads, TINY.head_dim)
    return [
        (torch.randn(shape, generator=gen).to(DEVICE), torch.randn(shape, generator=gen).to(DEVICE))
        for _ in range(TINY.num_layers)
    ]


def flatten(seqs: list[Seq]) -> Step:
    """Rows in the order given; each sequence gets scattered block ids; token ids follow a fixed pattern."""
    perm = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(2)).tolist()
    step = Step([], [], [], [0], [], [], [])
    for i, seq in enumerate(seqs):
        table = perm[i * MAX_BLOCKS : i * MAX_BLOCKS + -(-seq.ctx // BLOCK)]
        new = range(seq.ctx - seq.q_len, seq.ctx)
        step.ids += [(7 * p + 11 * i + 3) % TINY.vocab_size for p in new]
        step.positions += list(new)
        step.slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in new]
        step.query_starts.append(step.query_starts[-1] + seq.q_len)
        step.seq_lens.append(seq.ctx)
        step.tables.append(table)
        if seq.sampled:
            step.logits_rows.append(step.query_starts[-1] - 1)
    return step


def make_graphs(
    model: LlamaForCausalLM,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    max_num_seqs: int = 8,
    max_multi: int = 4,
    chunk_tokens: int = 0,
) -> StepGraphs:
    return StepGraphs(
        model, caches, (16, 32), max_num_seqs, MAX_BLOCKS, DEVICE, max_multi=max_multi, chunk_tokens=chunk_tokens
    )


@torch.inference_mode()
def eager_step(model: LlamaForCausalLM, caches: list[tuple[torch.Tensor, torch.Tensor]], step: Step) -> torch.Tensor:
    """The runner's eager kernel step over the same flattened batch."""
    meta = build_attention_metadata(step.query_starts, step.seq_lens, step.tables, BLOCK, DEVICE)
    ids = torch.tensor(step.ids, dtype=torch.long, device=DEVICE)
    pos = torch.tensor(step.positions, dtype=torch.long, device=DEVICE)
    hidden = model(ids, pos, caches, meta, kernels=True)  # (N, C)
    rows = torch.tensor(step.logits_rows, dtype=torch.long, device=DEVICE)
    return model.compute_logits(hidden[rows])  # (S, V)


def check_static_equals_eager(seqs: list[Seq], expect_tokens: int, **kw: int) -> StepGraphs:
    model = tiny_model(DEVICE)
    step = flatten(seqs)
    eager_caches, static_caches = random_caches(), random_caches()
    want = eager_step(model, eager_caches, step)
    graphs = make_graphs(model, static_caches, **kw)
    assert graphs.bucket(len(step.ids)) == expect_tokens
    got = graphs.run(
        step.ids, step.positions, step.slots, step.query_starts, step.seq_lens, step.tables, step.logits_rows
    )
    assert got is not None
    assert got.shape == (len(step.logits_rows), TINY.vocab_size)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (ek, ev), (sk, sv) in zip(eager_caches, static_caches, strict=True):  # padding rows wrote no KV
        torch.testing.assert_close(sk, ek, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sv, ev, atol=1e-5, rtol=1e-5)
    return graphs


def test_step_graphs_prefill_alone_equals_eager_step() -> None:
    check_static_equals_eager([Seq(ctx=11, q_len=11)], expect_tokens=16)


def test_step_graphs_prefix_hit_tail_equals_eager_step() -> None:
    check_static_equals_eager([Seq(ctx=19, q_len=3)], expect_tokens=16)


def test_step_graphs_chunk_over_cached_context_mixed_with_decodes_equals_eager_step() -> None:
    # three decode rows first, a mid-prompt chunk (not sampled) over 16 cached tokens, and a
    # one-token prompt tail after it, which the static step runs as a multi-token sequence
    seqs = [Seq(5, 1), Seq(9, 1), Seq(13, 1), Seq(23, 7, sampled=False), Seq(10, 1)]
    check_static_equals_eager(seqs, expect_tokens=16)


def test_step_graphs_pads_to_a_larger_bucket_and_equals_eager_step() -> None:
    seqs = [Seq(30, 1), Seq(17, 1), Seq(14, 14), Seq(44, 6)]  # 22 tokens -> T = 32
    check_static_equals_eager(seqs, expect_tokens=32)


def test_step_graphs_split_a_decoding_steps_chunk_for_the_chunk_cap_and_equal_eager_step(monkeypatch) -> None:
    """With ``chunk_tokens`` 8, a step that decodes beside 8 prompt tokens replays the T = 16 graph whose prefill splits are sized for 8.

    The grid still covers T tokens (``max_query_len``), and the step equals the eager one, whose
    launch sizes both for its own chunk. T = 32 gets such a graph too; every T's other graph sizes
    its splits for T, for the steps whose prompt tokens exceed the cap (a prompt alone, or chunks
    beside decodes that the scheduler did not cap).
    """
    from selfhost.models import fused

    seen: list[tuple[int, int | None]] = []
    launch = fused.paged_prefill_attention

    def spy(*args, **kw):  # type: ignore[no-untyped-def]
        seen.append((args[7], kw.get("split_query_len")))
        return launch(*args, **kw)

    monkeypatch.setattr(fused, "paged_prefill_attention", spy)
    seqs = [Seq(30, 1), Seq(17, 1), Seq(40, 5, sampled=False), Seq(44, 3)]  # 10 tokens -> T = 16, 8 of prompts
    graphs = check_static_equals_eager(seqs, expect_tokens=16, chunk_tokens=8)
    assert sorted(graphs._steps) == [(16, False), (16, True), (32, False), (32, True)]

    def run(seqs: list[Seq]) -> torch.Tensor | None:
        step = flatten(seqs)
        return graphs.run(
            step.ids, step.positions, step.slots, step.query_starts, step.seq_lens, step.tables, step.logits_rows
        )

    mixed = run(seqs)
    alone = graphs.run([1] * 9, list(range(9)), list(range(9)), [0, 9], [9], [[0, 1, 2]], [8])  # a prompt, no decode
    assert mixed is not None and alone is not None
    assert mixed.data_ptr() == graphs._logits[(16, True)].data_ptr()  # each step's logits from its own graph
    assert alone.data_ptr() == graphs._logits[(16, False)].data_ptr()
    over = run([Seq(30, 1), Seq(17, 1), Seq(40, 8, sampled=False), Seq(44, 6)])  # 14 prompt tokens beside decodes
    assert over is not None and over.data_ptr() == graphs._logits[(16, False)].data_ptr()
    assert (16, 8) in seen and (16, None) in seen  # the launches those graphs hold (captured on CUDA)


def test_step_graphs_runs_a_decode_only_step_and_equals_eager_step() -> None:
    check_static_equals_eager([Seq(3, 1), Seq(40, 1), Seq(8, 1)], expect_tokens=16)


def test_step_graphs_reads_pending_tokens_from_last_tokens() -> None:
    """Rows whose token was sampled on the device (async scheduling) take it from ``last_tokens``."""
    model = tiny_model(DEVICE)
    step = flatten([Seq(6, 1), Seq(12, 5), Seq(9, 1)])
    want = eager_step(model, random_caches(), step)
    last_tokens = torch.tensor([50, step.ids[6], 51, step.ids[0]], device=DEVICE)  # int64, like the sampler's
    graphs = StepGraphs(model, random_caches(), (16, 32), 8, MAX_BLOCKS, DEVICE, last_tokens=last_tokens)
    placeholders = [0 if r in (0, 6) else t for r, t in enumerate(step.ids)]
    got = graphs.run(
        placeholders,
        step.positions,
        step.slots,
        step.query_starts,
        step.seq_lens,
        step.tables,
        step.logits_rows,
        pending_rows=[0, 6],
        pending_sources=[3, 1],
    )
    assert got is not None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_step_graphs_returns_none_when_multi_token_sequences_exceed_pcap() -> None:
    graphs = make_graphs(tiny_model(DEVICE), random_caches(), max_multi=2)
    step = flatten([Seq(5, 1), Seq(4, 4), Seq(6, 3), Seq(8, 2)])
    assert not graphs.fits(10, 1, 3)
    args = (step.ids, step.positions, step.slots, step.query_starts, step.seq_lens, step.tables, step.logits_rows)
    assert graphs.run(*args) is None
    assert graphs.num_replays == 0


def test_step_graphs_fits_only_steps_within_its_buckets_and_caps() -> None:
    graphs = make_graphs(tiny_model(DEVICE), random_caches(), max_num_seqs=4, max_multi=2)
    assert graphs.fits(32, 0, 2)
    assert not graphs.fits(33, 0, 1)  # more tokens than the largest bucket
    assert graphs.fits(16, 4, 1)
    assert not graphs.fits(16, 5, 1)  # more decode rows than Dcap = min(T, max_num_seqs)
    assert [graphs.bucket(n) for n in (1, 16, 17, 32, 33)] == [16, 16, 32, 32, None]


def test_graph_token_sizes_cap_at_the_step_budget_and_follow_the_decode_graphs() -> None:
    cfg = EngineConfig(device="cuda", max_num_batched_tokens=300, cuda_graph_token_sizes=(16, 64, 512))
    assert cfg.graph_token_sizes() == (16, 64, 300)
    assert EngineConfig(device="cuda", enforce_eager=True).graph_token_sizes() == ()
    assert EngineConfig(device="cpu").graph_token_sizes() == ()
    assert EngineConfig(device="cuda", cuda_graph_token_sizes=()).graph_token_sizes() == ()
    with pytest.raises(ValueError, match="cuda_graph_token_sizes"):
        EngineConfig(cuda_graph_token_sizes=(16, 0))
