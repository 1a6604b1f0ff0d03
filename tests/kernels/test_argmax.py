"""The argmax kernel against ``kernels.reference.argmax`` (torch's): ties, signed zeros, NaN, infinities."""

from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels.argmax import BLOCK, argmax
from tests.kernels.conftest import ON_GPU

# one tile, several with a ragged last one, and the vocabularies the engine serves on the GPU
VOCABS = [1, 7, 1000, BLOCK, BLOCK + 1, 3 * BLOCK - 5] + ([49152, 128256] if ON_GPU else [])


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3])
def test_argmax_matches_torch(device, vocab, dtype, rows):
    x = torch.randn(rows, vocab, device=device).to(dtype)
    picks = argmax(x)
    assert picks.dtype == torch.long
    assert torch.equal(picks.cpu(), reference.argmax(x.cpu()))


def test_argmax_picks_the_first_of_tied_maxima_across_tiles(device):
    x = torch.zeros(2, 2 * BLOCK + 9, device=device)
    x[0, [BLOCK + 3, 5, 2 * BLOCK + 8]] = 2.0  # the earliest tie sits in the first tile
    x[1, [2 * BLOCK + 8, BLOCK + 3]] = 2.0  # ties only in later tiles
    assert argmax(x).cpu().tolist() == [5, BLOCK + 3]


def test_argmax_orders_negatives_infinities_signed_zeros_and_nan_as_torch(device):
    n = BLOCK + 40
    cases = torch.full((5, n), -3.0, device=device)
    cases[0] = -torch.arange(1, n + 1, dtype=torch.float32, device=device)  # all negative: the first
    cases[1, 10], cases[1, BLOCK + 2] = -0.0, 0.0  # -0.0 == +0.0: the first of the two
    cases[1, 20] = -1.0
    cases[2] = float("-inf")  # every score -inf: index 0
    cases[3, BLOCK + 7], cases[3, 4] = float("nan"), float("inf")  # a NaN beats +inf
    cases[4, 30], cases[4, BLOCK + 30] = float("inf"), float("inf")
    picks = argmax(cases).cpu().tolist()
    assert picks == reference.argmax(cases.cpu()).tolist() == [0, 10, 0, BLOCK + 7, 30]


def test_argmax_writes_into_out_and_leaves_its_counters_at_zero(device):
    from kernels import _common

    x = torch.randn(4, 2 * BLOCK + 1, device=device)
    out = torch.full((4,), -1, dtype=torch.long, device=device)
    assert argmax(x, out=out) is out
    assert argmax(x, out=out) is out  # a second launch over the same counters
    assert torch.equal(out.cpu(), x.cpu().argmax(-1))
    assert int(_common._COUNTERS[x.device].abs().sum()) == 0


def test_argmax_rejects_bad_shapes_and_outputs(device):
    with pytest.raises(ValueError, match="must be \\(B, V\\)"):
        argmax(torch.randn(8, device=device))
    with pytest.raises(ValueError, match="out must be \\(2,\\) int64"):
        argmax(torch.randn(2, 8, device=device), out=torch.empty(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="out must be contiguous"):
        argmax(torch.randn(2, 8, device=device), out=torch.empty(4, dtype=torch.long, device=device)[::2])
    with pytest.raises(ValueError, match="x must be one of"):
        argmax(torch.ones(2, 8, dtype=torch.int64, device=device))
