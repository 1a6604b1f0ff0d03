# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""A Llama-shaped decoder over ``kernels/`` for GPU benchmarks: random weights, decode steps in a CUDA graph.

Owns building random bf16 / int8 / int4 weights for a shape, one decode step written only with
the kernels (fused residual RMSNorm, rotary + KV write, paged decode attention, SiLU-and-mul,
weight-only matmuls, gate_up writing SiLU-and-mul of its output (``glu``); bf16 linears as the
engine runs them, the dense GEMV at batch 1 and cuBLAS above, or cuBLAS always for
``cublas``), and capturing that step, greedy argmax and the advance of positions, slots and
lengths included, in one CUDA graph. Does not own prefill, scheduling or sampling beyond argmax:
that is the engine's (``selfhost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F  # noqa: N812 (the torch convention)

from kernels import reference
from kernels._common import tl, triton
from kernels._matmul_config import Config, config_for
from kernels._matmul_launch import finish_unfused
from kernels.argmax import argmax
from kernels.dense_gemv import MODEL_ROWS, dense_gemv
from kernels.int4_matmul import int4_matmul, pairs_for
from kernels.paged_attention import paged_decode_attention
from kernels.quant_matmul import int8_matmul
from kernels.rmsnorm import rms_norm_residual
from kernels.rope_kv import RopeKV

if TYPE_CHECKING:
    from kernels.int4_gemv import XPairs

Mode = Literal["bf16", "cublas", "int8", "int4"]
"""Weight format of the linears; ``cublas`` is bf16 through ``F.linear`` at every batch size."""

KERNEL_KIND: dict[str, Literal["dense", "int8", "int4"]] = {"bf16": "dense", "int8": "int8", "int4": "int4"}
"""The launch-config kind (``kernels._matmul_config``) of each mode our GEMVs run (cuBLAS has none)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """Decoder dimensions."""

    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    inter: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def linear_dims(self) -> list[tuple[str, int, int]]:
        """Each linear's name and ``(N, K)``, as ``Decoder.layer_groups`` names them."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [
            ("qkv", q + 2 * kv, self.hidden),
            ("o", self.hidden, q),
            ("gate_up", 2 * self.inter, self.hidden),
            ("down", self.hidden, self.inter),
            ("lm_head", self.vocab, self.hidden),
        ]


LLAMA3_8B = Shape()
SMOLLM2_135M = Shape(
    hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, inter=1536, vocab=49152, rope_theta=100000.0
)
"""SmolLM2-135M's dimensions (``bench.engine_gpu --shape smollm2-135m``: its kernels' launch configs)."""


@dataclass(slots=True)
class Layer:
    """One decoder block's weights."""

    attn_norm: torch.Tensor
    qkv: QLinear
    o: QLinear
    mlp_norm: torch.Tensor
    gate_up: QLinear
    down: QLinear


class QLinear:
    """One linear layer's weight in bf16, int8 or int4 form; ``__call__`` is ``x @ W.T``."""

    def __init__(self, w: torch.Tensor, mode: Mode, group: int) -> None:
        self.mode, self.group = mode, group
        self.n, self.k = w.shape
        self.tensors: tuple[torch.Tensor, ...]
        if mode in ("bf16", "cublas"):
            self.tensors = (w,)
        elif mode == "int8":
            self.tensors = reference.quantize_int8(w)
        else:
            self.tensors = reference.quantize_int4(w, group)

    @property
    def nbytes(self) -> int:
        """Bytes one pass reads."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def k_iter(self) -> int:
        """The K extent its kernel loops over: packed bytes per half for int4, else K."""
        return self.k // 2 if self.mode == "int4" else self.k

    @property
    def scale_group(self) -> int:
        """Columns per scale as the launch configs count them: the int4 group, else 0 (one scale a row)."""
        return self.group if self.mode == "int4" else 0

    def default_config(self, m: int) -> Config:
        """The config its launcher picks for ``m`` rows (a pinned one, else the default)."""
        return config_for(
            KERNEL_KIND[self.mode], m, self.n, self.k, self.k_iter, self.scale_group, self.tensors[0].device
        )

    def x_pairs(self, x: torch.Tensor) -> XPairs | None:
        """Room for ``x`` as this weight's int4 GEMV reads it (``kernels.int4_gemv.XPairs``), or None where it reads x."""
        return pairs_for(x.shape[0], self.tensors[0], self.group, x.dtype) if self.mode == "int4" else None

    def __call__(
        self, x: torch.Tensor, glu: bool = False, rope: RopeKV | None = None, pairs: XPairs | None = None
    ) -> torch.Tensor:
        """``(M, K) -> (M, N)``; with ``glu`` or ``rope``, that epilogue's output (``selfhost.models.linear``)."""
        if self.mode == "bf16" and x.shape[0] <= MODEL_ROWS:
            return dense_gemv(x, self.tensors[0], glu=glu, rope=rope)
        if self.mode in ("bf16", "cublas"):
            return finish_unfused(F.linear(x, self.tensors[0]), glu, rope)
        if self.mode == "int8":
            return int8_matmul(x, self.tensors[0], self.tensors[1], glu=glu, rope=rope)
        w, s, z = self.tensors
        return int4_matmul(x, w, s, z, self.group, glu=glu, rope=rope, pairs=pairs)


PAIRED = frozenset(("qkv", "gate_up", "lm_head"))
"""The GEMVs whose input a norm writes, which can write it as pairs too (o's comes from the decode
attention, down's from gate_up's tiles)."""


class Decoder:
    """Random-weight decoder; ``step`` runs one decode token for every row of the batch."""

    def __init__(self, shape: Shape, mode: Mode, group: int = 128, seed: int = 0, device: str = "cuda") -> None:
        self.s, self.mode = shape, mode
        g = torch.Generator(device=device).manual_seed(seed)
        dev = torch.device(device)

        def rand(*size: int, std: float = 0.02) -> torch.Tensor:
            return (torch.randn(*size, generator=g, device=dev, dtype=torch.float32) * std).to(torch.bfloat16)

        s = shape
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.embed = rand(s.vocab, s.hidden)
        self.layers: list[Layer] = []
        for _ in range(s.layers):
            self.layers.append(
                Layer(
                    attn_norm=1 + rand(s.hidden, std=0.1),
                    qkv=QLinear(rand(q + 2 * kv, s.hidden), mode, group),
                    o=QLinear(rand(s.hidden, q), mode, group),
                    mlp_norm=1 + rand(s.hidden, std=0.1),
                    gate_up=QLinear(rand(2 * s.inter, s.hidden), mode, group),
                    down=QLinear(rand(s.hidden, s.inter), mode, group),
                )
            )
        self.norm = 1 + rand(s.hidden, std=0.1)
        self.lm_head = QLinear(rand(s.vocab, s.hidden), mode, group)
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=dev).float() / s.head_dim))
        ang = torch.outer(torch.arange(131072, device=dev).float(), inv)  # (P, hd/2)
        self.cos, self.sin = ang.cos().contiguous(), ang.sin().contiguous()
        self.torch_argmax = False
        """Pick with ``torch.argmax`` instead of ``kernels.argmax`` (the baseline it replaced)."""
        self.skip: frozenset[str] = frozenset()
        """Work left out of the step (``"norm"``: the norms' launches, ``"rope"``: the qkv GEMV's rotary
        and KV write): timing bounds of a fusion only, the ids are then meaningless."""
        self.pairs: frozenset[str] = PAIRED
        """The int4 GEMVs (``layer_groups``' names) that read x as pairs (``kernels.int4_gemv.XPairs``)
        written by the norm before them. The engine does so for qkv and gate_up, and for the LM head
        in steps where every row samples (``LlamaForCausalLM.forward_logits``)."""

    def linear_bytes(self) -> int:
        """Bytes of all linear weights (the LM head included): what one decode step must read."""
        return sum(w.nbytes for _, copies, _ in self.layer_groups() for w in copies)

    def layer_groups(self) -> list[tuple[str, list[QLinear], bool]]:
        """Each linear shape's name, all its copies (one a layer; the LM head's one), and whether the step asks it for SiLU-and-mul."""
        names = ("qkv", "o", "gate_up", "down")
        groups = [(name, [getattr(layer, name) for layer in self.layers], name == "gate_up") for name in names]
        return [*groups, ("lm_head", [self.lm_head], False)]

    def step(self, st: DecodeState) -> None:
        """One decode token per row: reads ``st.ids`` etc., writes the greedy next ids and advances the state."""
        s = self.s
        b = st.ids.shape[0]
        q_size = s.heads * s.head_dim
        x = F.embedding(st.ids, self.embed)  # (b, C)
        res: torch.Tensor | None = None
        norm = "norm" not in self.skip
        for layer, (kc, vc) in zip(self.layers, st.kv, strict=True):
            xp = self._pairs("qkv", layer.qkv, x, norm)
            h, res = rms_norm_residual(x, res, layer.attn_norm, s.eps, pairs=xp) if norm else (x, x)
            if "rope" in self.skip:
                qv = layer.qkv(h, pairs=xp)[:, :q_size].view(b, s.heads, s.head_dim)
            else:
                rope = RopeKV(st.positions, self.cos, self.sin, kc, vc, st.slots)
                qv = layer.qkv(h, rope=rope, pairs=xp).view(b, s.heads, s.head_dim)  # new keys, values in the caches
            o = paged_decode_attention(qv, kc, vc, st.tables, st.lens, s.head_dim**-0.5)  # (b, nh, hd)
            x = layer.o(o.view(b, q_size))
            xp = self._pairs("gate_up", layer.gate_up, x, norm)
            h, res = rms_norm_residual(x, res, layer.mlp_norm, s.eps, pairs=xp) if norm else (x, x)
            x = layer.down(layer.gate_up(h, glu=True, pairs=xp))  # the matmuls apply SiLU-and-mul as they write
        xp = self._pairs("lm_head", self.lm_head, x, norm)
        h = rms_norm_residual(x, res, self.norm, s.eps, pairs=xp)[0] if norm else x
        logits = self.lm_head(h, pairs=xp)  # (b, V)
        if self.torch_argmax:
            st.ids.copy_(logits.argmax(-1))
        else:
            argmax(logits, out=st.ids)
        st.advance()

    def _pairs(self, name: str, linear: QLinear, x: torch.Tensor, producer: bool) -> XPairs | None:
        """``linear.x_pairs`` if ``name`` takes pairs and the norm before it (``producer``) runs."""
        return linear.x_pairs(x) if name in self.pairs and producer else None


if triton is not None:

    @triton.jit
    def _advance_kernel(pos_ptr, lens_ptr, slots_ptr, table_ptr, st_b, B, BS: tl.constexpr, BLOCK: tl.constexpr):
        """Every row one position on: ``positions`` and ``lens`` + 1, ``slots`` the new position's cache slot."""
        r = tl.arange(0, BLOCK)
        m = r < B
        pos = tl.load(pos_ptr + r, mask=m, other=0) + 1
        tl.store(pos_ptr + r, pos, mask=m)
        tl.store(lens_ptr + r, tl.load(lens_ptr + r, mask=m, other=0) + 1, mask=m)
        blk = tl.load(table_ptr + r * st_b + pos // BS, mask=m, other=0).to(tl.int64)
        tl.store(slots_ptr + r, blk * BS + pos % BS, mask=m)


class DecodeState:
    """Static device buffers of one decode batch: ids, positions, slots, block tables, lengths, KV cache."""

    def __init__(self, shape: Shape, batch: int, context: int, max_new: int, block_size: int = 16) -> None:
        dev = torch.device("cuda")
        self.block_size = block_size
        max_blocks = -(-(context + max_new) // block_size)
        num_blocks = batch * max_blocks
        self.ids = torch.randint(0, shape.vocab, (batch,), device=dev)
        self.start = context
        # scattered, distinct blocks per row, as a paged cache hands them out
        self.tables = torch.randperm(num_blocks, device=dev).view(batch, max_blocks).to(torch.int32)
        self.positions = torch.empty(batch, device=dev, dtype=torch.long)
        self.lens = torch.empty(batch, device=dev, dtype=torch.int32)
        self.slots = torch.empty(batch, device=dev, dtype=torch.long)
        self.reset()
        kv_shape = (num_blocks, block_size, shape.kv_heads, shape.head_dim)
        # random, not zeros: the context the first `context` tokens would have written
        self.kv = [
            (
                torch.randn(kv_shape, device=dev, dtype=torch.bfloat16),
                torch.randn(kv_shape, device=dev, dtype=torch.bfloat16),
            )
            for _ in range(shape.layers)
        ]

    def advance(self) -> None:
        """Move every row to its next position (one kernel, so it can live inside a CUDA graph).

        NOTE(h7): one launch where torch's ops took seven (adds, the slot gather and its casts): on the
        H100 at batch 1 on the 8B shape, int4 541.2 -> 545.0 tok/s and bf16 199.1 -> 199.6, alternated
        twice in one process (2026-12-07, bench/results/step_shared_work_2026-12-07_h100.json).
        """
        b = self.positions.shape[0]
        _advance_kernel[(1,)](
            self.positions, self.lens, self.slots, self.tables, self.tables.stride(0), b,
            BS=self.block_size, BLOCK=max(16, triton.next_power_of_2(b)),
        )  # fmt: skip

    def reset(self) -> None:
        """Back to the first decode position: one before it, then ``advance`` (the one place slots are computed)."""
        self.positions.fill_(self.start - 1)
        self.lens.fill_(self.start)
        self.advance()


def capture(decoder: Decoder, st: DecodeState, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """Warm the step up (compiles kernels) and capture it in a CUDA graph."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            decoder.step(st)
    torch.cuda.current_stream().wait_stream(stream)
    st.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decoder.step(st)
    st.reset()
    return graph
