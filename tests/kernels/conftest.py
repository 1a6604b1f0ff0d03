"""Kernel tests run on CUDA with real shapes, or on the CPU under Triton's interpreter with small ones.

NOTE(h7): ``TRITON_INTERPRET`` must be set before ``kernels`` is first imported (``triton.jit``
reads it at decoration time), so it is set here, at collection, when no GPU is present.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed: the kernels cannot run here")

from kernels._common import can_launch  # after TRITON_INTERPRET is set

ON_GPU = torch.cuda.is_available()


@pytest.fixture
def device() -> torch.device:
    """The device kernels run on here; skips when Triton cannot launch on it."""
    dev = torch.device("cuda" if ON_GPU else "cpu")
    if not can_launch(torch.empty(0, device=dev)):
        pytest.skip("kernels imported before TRITON_INTERPRET was set: run tests/kernels in their own session")
    return dev


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
