"""Paged prefill attention (chunks over cached prefix blocks, GQA) against ``kernels.reference``."""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels.paged_prefill import paged_prefill_attention
from selfhost.models import ops
from tests.kernels.conftest import ON_GPU

# (cached prefix, new tokens) per sequence, for 4-token blocks in the interpreter (16 on the GPU):
# no prefix with an odd chunk, a prefix ending mid-block, one ending on a block boundary, a
# one-token chunk behind a prefix, a long prefix over several key tiles, a chunk over several
# query tiles.
CPU_SEQS = [(0, 7), (5, 3), (8, 5), (13, 1), (37, 6), (3, 19)]
GPU_SEQS = [(0, 77), (21, 30), (64, 17), (300, 1), (1000, 129), (5, 260)]


def _case(device, dtype, nkv, group, hd, bs, seqs, gap=2, num_blocks=None):
    """Caches with scattered block tables, and queries whose sequences sit ``gap`` rows apart."""
    b = len(seqs)
    max_blocks = max(-(-(p + n) // bs) for p, n in seqs) + 1  # one spare column: never read
    num_blocks = num_blocks or b * max_blocks + 5
    kc = torch.randn(num_blocks, bs, nkv, hd, dtype=dtype, device=device)
    vc = torch.randn_like(kc)
    tables = torch.randperm(num_blocks)[: b * max_blocks].reshape(b, max_blocks).to(torch.int32).to(device)
    starts, row = [], 0
    for _, n in seqs:
        starts.append(row)
        row += n + gap  # rows between sequences belong to nobody (decode rows in the engine)
    q = torch.randn(row, nkv * group, hd, dtype=dtype, device=device)

    def ints(xs):
        return torch.tensor(xs, dtype=torch.int32, device=device)

    return q, kc, vc, tables, ints(starts), ints([n for _, n in seqs]), ints([p + n for p, n in seqs])


def _reference(q, kc, vc, tables, starts, qlens, slens, scale):
    return reference.paged_prefill_attention(*(t.cpu() for t in (q, kc, vc, tables, starts, qlens, slens)), scale)


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_prefill_matches_reference_on_irregular_chunks(device, group, dtype):
    """Odd chunks, prefixes ending mid-block and on block edges, scattered tables: all match the reference."""
    nkv, hd, bs, seqs = (8 // max(1, group // 4), 128, 16, GPU_SEQS) if ON_GPU else (2, 64, 4, CPU_SEQS)
    case = _case(device, dtype, nkv, group, hd, bs, seqs)
    q, kc, vc, tables, starts, qlens, slens = case
    out = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, int(qlens.max()), hd**-0.5)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(out.cpu(), _reference(*case, hd**-0.5), **tol)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_paged_prefill_matches_reference_for_head_dims(device, hd):
    """fp32 rows of 256 to 1,024 bytes: on the GPU the launcher's tile for wide rows fits shared memory."""
    case = _case(device, torch.float32, 1, 4, hd, 4, [(6, 9), (0, 2)])
    q, kc, vc, tables, starts, qlens, slens = case
    out = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 9, 0.125)
    torch.testing.assert_close(out.cpu(), _reference(*case, 0.125), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 16), (32, 32), (64, 16)])
def test_paged_prefill_tile_sizes_do_not_change_result(device, block_m, block_n):
    """Query and key tiles cut the diagonal at different places; the outputs agree to fp32 rounding."""
    case = _case(device, torch.float32, 2, 3, 16, 4, [(11, 23), (0, 17), (32, 4)])
    q, kc, vc, tables, starts, qlens, slens = case
    out = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 23, 0.25, block_m=block_m, block_n=block_n)
    torch.testing.assert_close(out.cpu(), _reference(*case, 0.25), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 32])
@pytest.mark.parametrize(("nkv", "group"), [(2, 4), (3, 3)])
def test_paged_prefill_key_splits_match_reference(device, splits, nkv, group):
    """Splitting each tile's keys (some splits empty, some rows seeing no key in a split) matches the reference.

    A short chunk behind a long prefix (a prefix hit's tail), a cold prompt whose first tiles see
    fewer keys than there are splits, and a one-token chunk. Query tiles longer than a key tile
    give splits in which a tile's first rows see no key at all. Nine heads (SmolLM2's) leave the
    merge's last group of heads part empty.
    """
    seqs = [(1000, 16), (0, 77), (300, 1)] if ON_GPU else [(45, 6), (0, 21), (9, 1)]
    hd, bs = (64, 16) if ON_GPU else (16, 4)
    case = _case(device, torch.float32, nkv, group, hd, bs, seqs)
    q, kc, vc, tables, starts, qlens, slens = case
    out = paged_prefill_attention(
        q, kc, vc, tables, starts, qlens, slens, int(qlens.max()), hd**-0.5, block_m=128, block_n=16, splits=splits
    )
    torch.testing.assert_close(out.cpu(), _reference(*case, hd**-0.5), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("splits", [1, 3])
def test_paged_prefill_splits_a_tokens_heads_across_two_query_tiles(device, splits):
    """16-row tiles over a GQA ratio of 3: token 5's heads sit at rows 15-17, in two tiles; both halves are right.

    Every third tile boundary falls inside a token, with and without key splits, and the chunk
    behind a prefix puts the boundary token's keys in the unmasked range of one tile and on the
    diagonal of the next.
    """
    case = _case(device, torch.float32, 2, 3, 16, 4, [(9, 11), (0, 6)])
    q, kc, vc, tables, starts, qlens, slens = case
    out = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 11, 0.25, block_m=16, splits=splits)
    torch.testing.assert_close(out.cpu(), _reference(*case, 0.25), atol=1e-5, rtol=1e-5)


def test_paged_prefill_default_splits_spread_a_short_chunk_and_leave_a_long_one_whole(device):
    """One tile per KV head gets split; a prompt with a tile for every multiprocessor does not.

    Rounded down: the programs never exceed one a multiprocessor (a split more would start a wave
    that a few of them hold).
    """
    from kernels._common import MAX_SPLITS, num_sms
    from kernels.paged_prefill import default_splits

    sms = num_sms(torch.device(device))
    assert default_splits(2, 1, torch.device(device)) == min(MAX_SPLITS, sms // 2)
    assert default_splits(2, sms, torch.device(device)) == 1
    assert default_splits(1, 1, torch.device(device)) == min(MAX_SPLITS, sms)
    assert default_splits(3, 3, torch.device(device)) == min(MAX_SPLITS, max(1, sms // 9))  # SmolLM2's chunk: 14
    assert default_splits(8, 4, torch.device(device)) == max(1, sms // 32)  # the 8B's chunk: 4 on 132 SMs


def test_paged_prefill_splits_are_sized_for_split_query_len_not_the_padded_grid(device):
    """A graph-sized grid (a query tile a multiprocessor) over a 6-token chunk splits its keys as the chunk's own grid would.

    Without ``split_query_len`` the padded grid's tiles leave no room for a split; with it, the
    launch takes the chunk's default split count and equals a launch given that count.
    """
    from kernels._common import num_sms
    from kernels.paged_prefill import _default_blocks, default_splits

    case = _case(device, torch.float32, 2, 4, 16, 4, [(300, 6)] if ON_GPU else [(45, 6)])
    q, kc, vc, tables, starts, qlens, slens = case
    block_m = _default_blocks(16 * 4, q.device)[0]
    tiles = num_sms(q.device)  # over 2 KV heads: two programs a multiprocessor, no room for a split
    grid = tiles * block_m // 4  # tokens of 4 heads each
    want = default_splits(2, -(-6 * 4 // block_m), q.device)
    assert want > 1 and default_splits(2, tiles, q.device) == 1

    def launch(**kw):
        return paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, grid, 0.25, **kw)

    hinted = launch(split_query_len=6)
    assert torch.equal(hinted, launch(splits=want))
    assert torch.equal(launch(), launch(splits=1))
    assert not torch.equal(hinted, launch(splits=1))  # it did split: merged partials round differently
    torch.testing.assert_close(hinted.cpu(), _reference(*case, 0.25), atol=1e-5, rtol=1e-5)


def test_paged_prefill_default_splits_stay_within_the_partials_budget(device, monkeypatch):
    """With no room for partials the default is one split: the same bits as ``splits=1``.

    The context spans several key tiles (64 keys on the GPU, 16 in the interpreter): over one, a
    split output would equal the unsplit one, and the last assertion could not tell them apart.
    """
    from kernels import paged_prefill

    case = _case(device, torch.float32, 2, 4, 16, 4, [(300, 6)] if ON_GPU else [(45, 6)])
    q, kc, vc, tables, starts, qlens, slens = case
    one = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 6, 0.25, splits=1)
    split = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 6, 0.25)
    monkeypatch.setattr(paged_prefill, "MAX_PARTIAL_BYTES", 1)
    capped = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 6, 0.25)
    assert torch.equal(capped, one)
    assert not torch.equal(split, one)  # the default did split here: merged partials round differently


@pytest.mark.parametrize("splits", [1, 4])
def test_paged_prefill_leaves_rows_of_other_sequences_untouched(device, splits):
    """Rows no listed sequence owns (decode rows of a mixed batch) keep what ``out`` held, with or without the merge."""
    q, kc, vc, tables, starts, qlens, slens = _case(device, torch.float32, 2, 2, 16, 4, [(3, 5), (9, 2)], gap=3)
    out = torch.full_like(q, 7.0)
    paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 5, 0.25, out=out, splits=splits)
    owned = torch.zeros(q.shape[0], dtype=torch.bool)
    for s, n in zip(starts.tolist(), qlens.tolist(), strict=True):
        owned[s : s + n] = True
    assert owned.sum() == 7
    assert torch.equal(out[~owned.to(out.device)].cpu(), torch.full_like(out[~owned.to(out.device)].cpu(), 7.0))
    assert not torch.isclose(out[owned.to(out.device)], torch.tensor(7.0, device=out.device)).any()


def test_paged_prefill_reads_strided_queries_from_a_fused_qkv(device):
    """``q`` as a column slice of a fused QKV projection (the engine's layout) needs no copy."""
    nh, nkv, hd = 6, 2, 16
    _, kc, vc, tables, starts, qlens, slens = _case(device, torch.float32, nkv, 3, hd, 4, [(4, 6)], gap=0)
    qkv = torch.randn(6, (nh + 2 * nkv) * hd, device=device)
    q = qkv[:, : nh * hd].view(6, nh, hd)  # strided view: row stride (nh + 2 nkv) * hd
    out = paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 6, 0.25)
    ref = _reference(q.contiguous(), kc, vc, tables, starts, qlens, slens, 0.25)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_paged_prefill_equals_sdpa_over_engine_metadata(device):
    """The kernel over ``build_attention_metadata``'s prefill batch equals the SDPA path on a mixed batch."""
    bs, nkv, nh, hd = 4, 2, 8, 16
    # sequences: a fresh prompt, a decode row, a chunk behind a 10-token prefix, a decode row
    query_start, seq_lens = [0, 5, 6, 13, 14], [5, 9, 17, 22]
    tables = [[3, 11], [7, 1, 20], [9, 2, 30, 4, 15], [5, 8, 12, 13, 6, 21]]
    meta = ops.build_attention_metadata(query_start, seq_lens, tables, bs, torch.device(device))
    assert meta.prefill_batch is not None
    assert meta.prefill_batch.query_starts.tolist() == [0, 6]
    assert meta.prefill_batch.max_query_len == 7
    kc = torch.randn(32, bs, nkv, hd, device=device)
    vc = torch.randn_like(kc)
    q = torch.randn(14, nh, hd, device=device)
    want = torch.zeros_like(q)
    ops.prefill_attention(q, kc.view(-1, nkv, hd), vc.view(-1, nkv, hd), meta.prefills, want, 0.25)
    pb = meta.prefill_batch
    got = paged_prefill_attention(
        q, kc, vc, pb.block_tables, pb.query_starts, pb.query_lens, pb.seq_lens, pb.max_query_len, 0.25
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_paged_prefill_rejects_heads_not_multiple_of_kv_heads(device):
    q, kc, vc, tables, starts, qlens, slens = _case(device, torch.float32, 2, 2, 16, 4, [(0, 3)])
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_prefill_attention(q[:, :3], kc, vc, tables, starts, qlens, slens, 3, 0.25)


def test_paged_prefill_rejects_head_dim_not_power_of_two(device):
    q, kc, vc, tables, starts, qlens, slens = _case(device, torch.float32, 2, 2, 24, 4, [(0, 3)])
    with pytest.raises(ValueError, match="power of two"):
        paged_prefill_attention(q, kc, vc, tables, starts, qlens, slens, 3, 0.25)
