"""Paged decode attention (GQA, split-KV) against ``kernels.reference.paged_decode_attention``."""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels.paged_attention import paged_decode_attention
from tests.kernels.conftest import ON_GPU


def _case(device, dtype, nkv, group, hd, bs, seq_lens, num_blocks):
    b = len(seq_lens)
    max_blocks = max(-(-n // bs) for n in seq_lens) + 1  # one spare column: never read
    q = torch.randn(b, nkv * group, hd, dtype=dtype, device=device)
    kc = torch.randn(num_blocks, bs, nkv, hd, dtype=dtype, device=device)
    vc = torch.randn_like(kc)
    # each sequence gets distinct, scattered blocks (not 0, 1, 2, ...)
    perm = torch.randperm(num_blocks)[: b * max_blocks].reshape(b, max_blocks)
    tables = perm.to(torch.int32).to(device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, kc, vc, tables, lens


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paged_decode_attention_matches_reference_on_irregular_lengths(device, group, dtype):
    """Lengths of 1, a block, a block + 1 and odd long ones, over many partitions, match the reference."""
    if ON_GPU:
        nkv, hd, bs, lens, splits = 8 // max(1, group // 4), 128, 16, [1, 16, 17, 1000, 4099], 16
    else:
        nkv, hd, bs, lens, splits = 2, 16, 4, [1, 4, 5, 37], 3
    q, kc, vc, tables, sl = _case(device, dtype, nkv, group, hd, bs, lens, num_blocks=2048 if ON_GPU else 64)
    out = paged_decode_attention(q, kc, vc, tables, sl, hd**-0.5, splits=splits)
    ref = reference.paged_decode_attention(*(t.cpu() for t in (q, kc, vc, tables, sl)), hd**-0.5)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}
    torch.testing.assert_close(out.cpu(), ref, **tol)


def test_paged_decode_attention_split_count_does_not_change_result(device):
    """One partition and many (some of them empty) give the same output up to fp32 rounding."""
    q, kc, vc, tables, sl = _case(device, torch.float32, 2, 4, 16, 4, [3, 29, 40], num_blocks=64)
    one = paged_decode_attention(q, kc, vc, tables, sl, 0.25, splits=1)
    many = paged_decode_attention(q, kc, vc, tables, sl, 0.25, splits=8)
    torch.testing.assert_close(one, many, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [1, 17, 100])
def test_paged_decode_attention_default_splits_match_reference_for_one_short_sequence(device, length):
    """Batch 1 over a short context in a wide table (the decode graphs' layout): the default split
    spreads the few keys over many programs, most of them empty, and matches the reference."""
    q, kc, vc, tables, sl = _case(device, torch.float32, 2, 4, 16, 4, [length], num_blocks=128)
    tables = torch.cat([tables, tables.new_zeros(1, 64)], dim=1)  # capacity far beyond the context
    out = paged_decode_attention(q, kc, vc, tables, sl, 0.25)
    ref = reference.paged_decode_attention(*(t.cpu() for t in (q, kc, vc, tables, sl)), 0.25)
    torch.testing.assert_close(out.cpu(), ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("splits", [1, 4])
def test_paged_decode_attention_gives_zeros_for_empty_context(device, splits):
    """A padded batch row (length 0) yields zeros, never NaN, merged or written by its one partition."""
    q, kc, vc, tables, sl = _case(device, torch.float32, 2, 2, 16, 4, [5, 0], num_blocks=16)
    out = paged_decode_attention(q, kc, vc, tables, sl, 0.25, splits=splits)
    assert torch.equal(out[1].cpu(), torch.zeros_like(out[1].cpu()))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paged_decode_attention_one_partition_equals_the_merge_of_one(device, dtype):
    """One partition writes its output with no merge: bit-equal to the merge of that one partition."""
    q, kc, vc, tables, sl = _case(device, dtype, 2, 4, 16, 4, [1, 9, 37], num_blocks=64)
    direct = paged_decode_attention(q, kc, vc, tables, sl, 0.25, splits=1, block_n=64)
    # the merged path over the same tiles: two partitions of whole 64-key tiles, the second empty in every row
    merged = paged_decode_attention(q, kc, vc, tables, sl, 0.25, splits=2, block_n=64)
    assert torch.equal(direct, merged)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paged_decode_attention_matches_reference_over_many_partitions_with_a_padding_row(device, dtype):
    """One loop tile per partition (tens of partitions to merge) matches the reference; length 0 gives zeros."""
    if ON_GPU:
        nkv, group, hd, bs, lens, splits = 8, 4, 128, 16, [0, 1, 1000, 4099], 64
    else:
        nkv, group, hd, bs, lens, splits = 2, 4, 16, 4, [0, 1, 17, 97, 250], 16
    q, kc, vc, tables, sl = _case(device, dtype, nkv, group, hd, bs, lens, num_blocks=2048 if ON_GPU else 512)
    out = paged_decode_attention(q, kc, vc, tables, sl, hd**-0.5, splits=splits)
    ref = reference.paged_decode_attention(*(t.cpu() for t in (q, kc, vc, tables, sl)), hd**-0.5)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}
    torch.testing.assert_close(out.cpu(), ref, **tol)
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))


def test_paged_decode_attention_writes_into_the_leading_rows_of_a_larger_output(device):
    """``out`` may be a view (a mixed step's decode rows): those rows get the result, the rest keep their values."""
    q, kc, vc, tables, sl = _case(device, torch.float32, 2, 4, 16, 4, [3, 29, 40], num_blocks=64)
    whole = torch.full((5, *q.shape[1:]), 7.0, device=device)
    got = paged_decode_attention(q, kc, vc, tables, sl, 0.25, out=whole[:3])
    assert got.data_ptr() == whole.data_ptr()
    assert torch.equal(whole[:3], paged_decode_attention(q, kc, vc, tables, sl, 0.25))
    assert torch.equal(whole[3:], torch.full_like(whole[3:], 7.0))


def test_paged_decode_attention_rejects_an_out_of_another_shape(device):
    q, kc, vc, tables, sl = _case(device, torch.float32, 2, 4, 16, 4, [3], num_blocks=16)
    with pytest.raises(ValueError, match="out must be"):
        paged_decode_attention(q, kc, vc, tables, sl, 0.25, out=torch.empty(2, *q.shape[1:], device=device))


def test_paged_decode_attention_rejects_heads_not_multiple_of_kv_heads(device):
    q, kc, vc, tables, sl = _case(device, torch.float32, 2, 2, 16, 4, [5], num_blocks=8)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_decode_attention(q[:, :3], kc, vc, tables, sl, 0.25)
