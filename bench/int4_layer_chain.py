"""The 8B shape's int4 GEMVs of 32 layers as the persistent-kernel probes run them: weights, the library's launches, the check.

Owns the chain the probes (``bench.probe_int4_layers``, ``bench.probe_int4_rows``) compute and the
library's launches of the same chain they are timed against. ``LayerChain``: each GEMV's input is
the one before's output cut to its K (plain outputs). ``FusedChain``: the ops of a decode step
between them too (the residual RMSNorms before qkv and gate_up, SiLU-and-mul before down); attention
and rotary are left out (o takes qkv's first 4,096 outputs). Does not own the kernels.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch

from bench.engine_gpu import SHAPES, graph_time_ms
from bench.gpu_decoder import QLinear
from kernels import reference
from kernels.int4_matmul import int4_matmul
from kernels.rmsnorm import rms_norm_residual

if TYPE_CHECKING:
    from bench.probe_int4_mma import Weight

KINDS = ("qkv", "o", "gate_up", "down")
EPS = 1e-5


class LayerChain:
    """The probes' 32 layers of the 8B shape's four int4 GEMVs: weights, first input, the library's launches, the check.

    Each GEMV's input is the one before's output cut to its K (o takes qkv's first 4,096, down
    gate_up's first 14,336); ``library`` runs them as 128 ``int4_matmul`` launches into ``outs``.
    """

    def __init__(self, layers: int) -> None:
        torch.manual_seed(0)
        self.layers = layers
        self.dims = {name: (n, k) for name, n, k in SHAPES["llama3-8b"].linear_dims()}
        self.ws: dict[str, list[Weight]] = {}
        for name in KINDS:
            n, k = self.dims[name]
            self.ws[name] = []
            for _ in range(layers):  # std 1 / sqrt(K): the chain's values keep their size
                w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
                packed, scales, zeros = QLinear(w, "int4", 128).tensors
                self.ws[name].append((packed, scales, zeros))
        self.x0 = torch.randn(1, self.dims["qkv"][1], device="cuda", dtype=torch.bfloat16)
        self.mb = sum(t.numel() * t.element_size() for name in KINDS for w in self.ws[name] for t in w) / 1e6
        self.outs: list[torch.Tensor] = []

    def cut(self, name: str) -> int:
        """The K of GEMV ``name``: how much of the output before it is its input."""
        return self.dims[name][1]

    def library(self) -> None:
        self.outs.clear()
        x = self.x0
        for i in range(self.layers):
            for j, name in enumerate(KINDS):
                self.outs.append(int4_matmul(x, *self.ws[name][i], 128))
                x = self.outs[-1][:, : self.cut(KINDS[(j + 1) % 4])]

    def close(self, res: dict[str, Any], path: str) -> None:
        """Time ``library`` again after the variants, print it a layer, and write ``res`` to ``path``."""
        res["library_us_after"] = [graph_time_ms(self.library) * 1e3 for _ in range(2)]
        print(f"library again: {res['library_us_after']} ({res['library_us_after'][-1] / self.layers:.1f} a layer)")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {path}")

    def library_outputs(self) -> dict[str, torch.Tensor]:
        """``outs`` as ``(layers, N)`` a GEMV, the persistent kernels' output shape."""
        return {name: torch.cat([self.outs[4 * i + j] for i in range(self.layers)]) for j, name in enumerate(KINDS)}

    def errors(self, y: dict[str, torch.Tensor], check: list[int]) -> float:
        """The worst relative error against ``kernels.reference`` of layers ``check``' GEMVs, each on the input it got."""
        worst = 0.0
        for i in check:
            for j, name in enumerate(KINDS):
                prev = KINDS[j - 1]
                xin = self.x0 if (i == 0 and j == 0) else y[prev][i - (j == 0) : i - (j == 0) + 1, : self.cut(name)]
                ref = reference.int4_matmul(xin.float(), *self.ws[name][i], 128)
                got = y[name][i : i + 1].float()
                worst = max(worst, float((got - ref).norm() / ref.norm()))
        return worst


class FusedChain(LayerChain):
    """``LayerChain`` with a decode step's norms and SiLU-and-mul between the GEMVs.

    Layer ``l``: ``h, r = rms_norm_residual(down_{l-1} (zeros at layer 0), r (x at layer 0), wn[2l])``,
    qkv of ``h``; o of qkv's first K; ``h, r = rms_norm_residual(o, r, wn[2l + 1])``, gate_up of
    ``h``; down of ``silu_and_mul(gate_up)``. The residuals ``r`` go to ``res`` (2 layers, H).
    """

    def __init__(self, layers: int) -> None:
        super().__init__(layers)
        # gate_up's rows, scales and zeros by tiles of 16: 8 gate rows, then the same 8 up rows
        inter = self.dims["gate_up"][0] // 2
        idx = torch.arange(inter, device="cuda").view(-1, 8)  # (tiles, 8)
        self.glu_rows = torch.cat([idx, idx + inter], dim=1).reshape(-1)
        self.ws_glu: list[Weight] = [
            (p[self.glu_rows].contiguous(), s[self.glu_rows].contiguous(), z[self.glu_rows].contiguous())
            for p, s, z in self.ws["gate_up"]
        ]
        hidden = self.dims["o"][0]
        gen = torch.Generator(device="cuda").manual_seed(1)
        self.wn = (1 + 0.1 * torch.randn(2 * layers, hidden, device="cuda", generator=gen)).to(torch.bfloat16)
        self.zeros = torch.zeros(1, hidden, device="cuda", dtype=torch.bfloat16)
        self.res = torch.empty(2 * layers, hidden, device="cuda", dtype=torch.bfloat16)

    def library(self) -> None:
        self.outs.clear()
        y, r = self.zeros, self.x0
        for i in range(self.layers):
            h, r = rms_norm_residual(y, r, self.wn[2 * i], EPS)
            q = int4_matmul(h, *self.ws["qkv"][i], 128)
            o = int4_matmul(q[:, : self.cut("o")], *self.ws["o"][i], 128)
            h, r = rms_norm_residual(o, r, self.wn[2 * i + 1], EPS)
            g = int4_matmul(h, *self.ws["gate_up"][i], 128, glu=True)
            y = int4_matmul(g, *self.ws["down"][i], 128)
            self.outs += [q, o, g, y]

    def fused_errors(self, y: dict[str, torch.Tensor], res: torch.Tensor, check: list[int]) -> float:
        """The worst relative error of layers ``check``' GEMVs and residuals, each GEMV on the input it got.

        ``y`` as the kernels write them (gate_up's after SiLU-and-mul), ``res`` their residuals.
        """
        worst = 0.0

        def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
            return float((got.float() - ref.float()).norm() / ref.float().norm())

        for i in check:
            prev_y = self.zeros if i == 0 else y["down"][i - 1 : i]
            prev_r = self.x0 if i == 0 else res[2 * i - 1 : 2 * i]
            h, r = reference.rms_norm_residual(prev_y, prev_r, self.wn[2 * i], EPS)
            worst = max(worst, rel(res[2 * i : 2 * i + 1], r))
            inputs = {"qkv": h, "o": y["qkv"][i : i + 1, : self.cut("o")]}
            h, r = reference.rms_norm_residual(y["o"][i : i + 1], res[2 * i : 2 * i + 1], self.wn[2 * i + 1], EPS)
            worst = max(worst, rel(res[2 * i + 1 : 2 * i + 2], r))
            inputs |= {"gate_up": h, "down": y["gate_up"][i : i + 1]}
            for name in KINDS:
                ref = reference.int4_matmul(inputs[name].float(), *self.ws[name][i], 128)
                if name == "gate_up":
                    ref = reference.silu_and_mul(ref.to(torch.bfloat16))
                worst = max(worst, rel(y[name][i : i + 1], ref))
        return worst
