"""GPU probe: the int4 half2 GEMVs reading x as the norms' pairs (``kernels.int4_gemv.XPairs``) against x.

Per 8B shape, us a launch over the 32 layers' weights in one CUDA graph with PDL, alternated in one
process: the library reading x (``int4_matmul``), reading pairs at its default tile, and reading
pairs at the tiles ``--tiles`` names (``Tile``); qkv without its rotary epilogue. The pairs are
``kernels.reference.x_pairs`` of the same x. Outputs compared with the x path's. With
``--step-rounds``, the whole batch-1 step too (``step_rates``).

    python -m bench.probe_int4_xpack --json $OUT/probe_int4_xpack.json
    python -m bench.probe_int4_xpack --shapes '' --step-rounds 3 --json $OUT/probe_int4_xpack_step.json

NOTE(h7): the first runs (2026-11-28, H200) timed a copy of the kernel whose x came as pairs before
the library took them; it also tried the group sums made from the pairs inside the GEMV (no sums
array): gate_up 20.1 against 18.0 us with sums given, LM head 78.7 against 72 (JSON:
bench/results/probe_int4_xpack_*_h200.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import time

import torch

from bench.engine_gpu import SHAPES, decode_rate, graph_time_ms
from bench.gpu_decoder import PAIRED, Decoder, DecodeState
from kernels import reference
from kernels._matmul_config import Config
from kernels.int4_gemv import XPairs
from kernels.int4_matmul import int4_matmul

GROUP = 128
"""The int4 group of the 8B weights timed."""

Weight = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Tile:
    """A launch of the pairs path: ``16x1024w4s2pau2r72`` is 16 rows x 1,024 bytes, 4 warps, split 2,
    prefetch, ahead, 2 runs, at most 72 registers (``Config.pairs_registers``); ``""`` the default."""

    spec: str

    def config(self) -> Config | None:
        if not self.spec:
            return None
        m = re.fullmatch(r"(\d+)x(\d+)w(\d+)(?:s(\d+))?(p?)(a?)(?:u(\d+))?(?:r(\d+))?", self.spec)
        if not m:
            raise ValueError(f"not a tile: {self.spec!r} (e.g. 16x1024w4s2pau2r72)")
        bn, bk, w, split, pf, ah, runs, regs = m.groups()
        return Config(
            "gemv", int(bn), int(bk), int(split or 1), num_warps=int(w), prefetch=bool(pf), ahead=bool(ah),
            runs=int(runs or 1), pairs_registers=int(regs or 0),
        )  # fmt: skip


def tile_specs(spec: str) -> dict[str, list[str]]:
    """``--tiles``: ``"gate_up=8x1024w2r72,8x1024w2p;down=16x512w4s2pau2"`` -> each GEMV's ``Tile`` specs, in order."""
    out: dict[str, list[str]] = {}
    for part in filter(None, spec.split(";")):
        name, _, tiles = part.partition("=")
        out[name.strip()] = tiles.split(",")
    return out


def _launch(x: torch.Tensor, pairs: XPairs, w: Weight, glu: bool, tile: Tile | None) -> torch.Tensor:
    """The library reading x (``tile`` None), or reading ``pairs`` at ``tile``."""
    if tile is None:
        return int4_matmul(x, *w, GROUP, glu=glu)
    return int4_matmul(x, *w, GROUP, config=tile.config(), glu=glu, pairs=pairs)


def us_a_launch(x: torch.Tensor, pairs: XPairs, ws: list[Weight], glu: bool, tile: Tile | None) -> float:
    """us a launch over ``ws`` in one CUDA graph."""

    def run() -> None:
        for w in ws:
            _launch(x, pairs, w, glu, tile)

    return graph_time_ms(run, 3) * 1e3 / len(ws)


def step_rates(dec: Decoder, rounds: int) -> dict[str, object]:
    """Batch-1 tok/s of the int4 decoder's step (``bench.engine_gpu.decode_rate``) with pairs and without, and bf16's.

    Then one eager step from one state, the LM head's logits compared: with pairs for each GEMV in
    turn and for all against none, and none against none (the step is deterministic).
    """
    shape = SHAPES["llama3-8b"]
    variants = {"int4 pairs": PAIRED, "int4 x": frozenset(), "bf16": PAIRED}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    bf16 = Decoder(shape, "bf16", GROUP)
    for _ in range(rounds):
        for name, paired in variants.items():
            d = bf16 if name == "bf16" else dec
            d.pairs = paired
            rates[name].append(decode_rate(d, shape, 1, 512, 256)[0])
        print({k: [round(r, 1) for r in v] for k, v in rates.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print({f"{k} / bf16": round(v / med["bf16"], 3) for k, v in med.items()}, flush=True)
    st = DecodeState(shape, 1, 512, 8)
    start_ids = st.ids.clone()

    def logits(paired: frozenset[str]) -> torch.Tensor:
        st.reset()
        st.ids.copy_(start_ids)
        dec.pairs = paired
        head, kept = dec.lm_head, list[torch.Tensor]()
        dec.lm_head = _Keep(head, kept)  # type: ignore[assignment]
        dec.step(st)
        dec.lm_head = head
        return kept[0].float()

    base = logits(frozenset())
    checks = {"none again": logits(frozenset()), "all": logits(PAIRED)}
    checks.update({name: logits(frozenset((name,))) for name in sorted(PAIRED)})
    diffs = {k: ((v - base).norm() / base.norm()).item() for k, v in checks.items()}
    same = {k: bool(torch.equal(v.argmax(-1), base.argmax(-1))) for k, v in checks.items()}
    print("logits against none:", {k: f"{d:.2e}" for k, d in diffs.items()}, "same greedy id:", same, flush=True)
    first = first_difference(dec, st, start_ids)
    print("first gate_up output that differs:", first, flush=True)
    return {
        "tok_s": rates,
        "ratios": {k: v / med["bf16"] for k, v in med.items()},
        "logits_rel_diff": diffs,
        "same_greedy_id": same,
        "first_difference": first,
    }


def first_difference(dec: Decoder, st: DecodeState, start_ids: torch.Tensor) -> dict[str, object]:
    """Where one step with gate_up reading pairs first departs from the step reading x, and by how much.

    Both steps from the same state, each layer's gate_up input and output kept: the first layer whose
    outputs differ while their inputs are equal, its differing columns with both values and the fp32
    reference's (``kernels.reference``) of that input, and per later layer how many inputs differ.
    """
    runs = []
    for paired in (frozenset(), frozenset(("gate_up",))):
        st.reset()
        st.ids.copy_(start_ids)
        dec.pairs = paired
        kept: list[list[torch.Tensor]] = [[] for _ in dec.layers]
        heads = [layer.gate_up for layer in dec.layers]
        for layer, keep in zip(dec.layers, kept, strict=True):
            layer.gate_up = _Keep(layer.gate_up, keep, inputs=True)  # type: ignore[assignment]
        dec.step(st)
        for layer, head in zip(dec.layers, heads, strict=True):
            layer.gate_up = head
        runs.append(kept)
    out: dict[str, object] = {
        "inputs_differing_by_layer": [int((a[0] != b[0]).sum()) for a, b in zip(*runs, strict=True)]
    }
    for i, (a, b) in enumerate(zip(*runs, strict=True)):
        if torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1]):
            cols = (a[1] != b[1]).nonzero()[:, 1].tolist()
            w = dec.layers[i].gate_up.tensors
            ref = reference.silu_and_mul(reference.int4_matmul(a[0].float(), w[0], w[1], w[2], GROUP))
            out["layer"] = i
            out["columns"] = {c: [a[1][0, c].item(), b[1][0, c].item(), ref[0, c].item()] for c in cols[:8]}
            out["differing"] = len(cols)
            break
    return out


class _Keep:
    """A decoder's linear that keeps what it returns (and with ``inputs``, first what it is given)."""

    def __init__(self, head: object, kept: list[torch.Tensor], inputs: bool = False) -> None:
        self.head, self.kept, self.inputs = head, kept, inputs

    def x_pairs(self, x: torch.Tensor) -> XPairs | None:
        return self.head.x_pairs(x)  # type: ignore[attr-defined,no-any-return]

    def __call__(self, x: torch.Tensor, **kw: object) -> torch.Tensor:
        out: torch.Tensor = self.head(x, **kw)  # type: ignore[operator]
        self.kept += [x.clone(), out] if self.inputs else [out]
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head")
    ap.add_argument(
        "--tiles", default="", help="more tiles a shape: 'gate_up=8x1024w2r72,8x1024w2p;down=16x512w4s2pau2' (Tile)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-rounds", type=int, default=0, help="also the 8B batch-1 step, pairs on and off, alternated")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dec = Decoder(SHAPES["llama3-8b"], "int4", GROUP)
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m bench.probe_int4_xpack " + " ".join(f"--{k} '{v}'" for k, v in vars(a).items() if v),
    }
    extra = tile_specs(a.tiles)
    groups = {name: (lins, glu) for name, lins, glu in dec.layer_groups()}
    errors: dict[str, dict[str, float]] = {}
    times: dict[str, dict[str, list[float]]] = {}
    for name in [s for s in a.shapes.split(",") if s]:
        lins, glu = groups[name]
        ws = [(t[0], t[1], t[2]) for t in (lin.tensors for lin in lins)]
        k = 2 * ws[0][0].shape[1]
        x = (torch.randn(1, k, device="cuda") * 0.5).to(torch.bfloat16)
        pairs = XPairs(*reference.x_pairs(x, GROUP), group_size=GROUP)
        want = int4_matmul(x, ws[0][0], ws[0][1], ws[0][2], GROUP, glu=glu).float()
        variants: dict[str, Tile | None] = {"x": None, "pairs": Tile("")}
        variants.update({f"pairs {t}": Tile(t) for t in extra.get(name, [])})
        errors[name] = {}
        for v, tile in variants.items():
            if tile is not None:
                got = _launch(x, pairs, ws[0], glu, tile).float()
                errors[name][v] = ((got - want).norm() / want.norm()).item()
        times[name] = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v, tile in variants.items():
                times[name][v].append(us_a_launch(x, pairs, ws, glu, tile))
        print(name, {v: f"{e:.1e}" for v, e in errors[name].items()}, flush=True)
        for v, ts in times[name].items():
            print(f"  {v:28s} {[round(t, 2) for t in ts]}", flush=True)
    if a.step_rounds:
        res["step"] = step_rates(dec, a.step_rounds)
    res.update(
        errors=errors,
        us_a_launch=times,
        medians={s: {v: statistics.median(ts) for v, ts in d.items()} for s, d in times.items()},
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
