"""GPU probe: the int4 MLP with and without the gate_up -> down handoff (``kernels.handoff``).

Three measurements, the two variants alternated in one process (``set_handoff``):

- outputs: ``int4_mlp`` against the two plain launches on layer 0's 8B weights, at 1 and 2 rows
  (bit-equal expected), and the counters left at zero;
- the MLP alone: 32 layers' gate_up + down chained (each layer's input the last one's output cut
  to the hidden size) in one CUDA graph, us a layer;
- the decode step: ``bench.gpu_decoder``'s batch-1 step (``decode_rate``), tok/s, and its first
  greedy ids with each variant.

    python -m bench.probe_handoff --json $OUT/probe_handoff.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.engine_gpu import SHAPES, decode_rate, graph_time_ms
from bench.gpu_decoder import Decoder
from kernels._common import set_pdl
from kernels.handoff import _BUFFERS, PROBE, Handoff, set_handoff
from kernels.int4_matmul import _launch, _launch_config, int4_matmul, int4_mlp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="llama3-8b")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "shape": args.shape,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m bench.probe_handoff " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v),
    }
    dec = Decoder(shape, "int4", args.group)
    layer = dec.layers[0]
    gu, dn = layer.gate_up.tensors, layer.down.tensors
    assert len(gu) == len(dn) == 3  # int4: packed, scales, zeros
    checks = []
    for rows in (1, 2):
        x = (torch.randn(rows, shape.hidden, device="cuda") * 0.5).to(torch.bfloat16)
        set_handoff(True)
        a = int4_mlp(x, gu, dn, args.group)
        torch.cuda.synchronize()
        b = int4_matmul(int4_matmul(x, gu[0], gu[1], gu[2], args.group, glu=True), dn[0], dn[1], dn[2], args.group)
        counters = _BUFFERS[x.device]
        checks.append(
            {"rows": rows, "bit_equal": bool(torch.equal(a, b)), "counters_zero": bool((counters == 0).all())}
        )
        print(f"outputs, {rows} rows: {checks[-1]}", flush=True)
    res["checks"] = checks

    def chain() -> None:
        h = x1
        for lay in dec.layers:
            h = int4_mlp(h, lay.gate_up.tensors, lay.down.tensors, args.group)  # type: ignore[arg-type]

    x1 = (torch.randn(1, shape.hidden, device="cuda") * 0.5).to(torch.bfloat16)

    def chain_parts(signal: bool, wait: bool, down_pdl: bool) -> None:
        # the pieces apart: gate_up signalling into counters no one reads, or down launched without PDL
        h = x1
        for lay in dec.layers:
            gu_w, dn_w = lay.gate_up.tensors, lay.down.tensors
            cfg_gu = _launch_config(h, gu_w, args.group, None)  # type: ignore[arg-type]
            cfg_dn = _launch_config(h, dn_w, args.group, None)  # type: ignore[arg-type]
            hof = Handoff.between(h.device, gu_w[0].shape[0] // 2, cfg_dn.block_k)
            g = _launch(h, gu_w, args.group, cfg_gu, True, None, signal=hof if signal else None)  # type: ignore[arg-type]
            set_pdl(down_pdl)
            h = _launch(g, dn_w, args.group, cfg_dn, False, None, wait=hof if wait else None)  # type: ignore[arg-type]
            set_pdl(True)

    from kernels import int4_matmul as im

    def timeline(on: bool) -> dict[str, object]:
        set_handoff(on)
        bufs = [torch.zeros(4 * 4096, dtype=torch.int64, device="cuda") for _ in range(2)]

        def run() -> None:
            h = x1
            for i, lay in enumerate(dec.layers):
                cfg_gu = _launch_config(h, lay.gate_up.tensors, args.group, None)  # type: ignore[arg-type]
                cfg_dn = _launch_config(h, lay.down.tensors, args.group, None)  # type: ignore[arg-type]
                hof = Handoff.between(h.device, lay.gate_up.tensors[0].shape[0] // 2, cfg_dn.block_k) if on else None
                im.STAMPS["buf"] = bufs[0] if i == 16 else None
                g = _launch(h, lay.gate_up.tensors, args.group, cfg_gu, True, None, signal=hof)  # type: ignore[arg-type]
                im.STAMPS["buf"] = bufs[1] if i == 16 else None
                h = _launch(g, lay.down.tensors, args.group, cfg_dn, False, None, wait=hof)  # type: ignore[arg-type]
            im.STAMPS["buf"] = None

        graph_time_ms(run)
        gu = bufs[0].view(-1, 4)[:3584].double()
        dn = bufs[1].view(-1, 4)[:512].double()
        t0 = gu[:, 0].min()
        q = lambda v: [round(float(torch.quantile((v - t0) / 1e3, p)), 2) for p in (0.0, 0.1, 0.5, 0.9, 1.0)]  # noqa: E731
        out = {
            "gate_up start": q(gu[:, 0]), "gate_up end": q(gu[:, 2]),
            "down start": q(dn[:, 0]), "down ready": q(dn[:, 1]), "down end": q(dn[:, 2]),
            "down split 0 end": q(dn[:256, 2]), "down split 1 ready": q(dn[256:, 1]),
        }  # fmt: skip
        print(f"timeline handoff={on} (us from gate_up's first start; min, p10, p50, p90, max): {out}", flush=True)
        return out

    res["timeline"] = {"handoff": timeline(True), "plain": timeline(False), "handoff again": timeline(True)}
    set_handoff(True)
    parts: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, sig, wt, dpdl, sem in (
            ("plain", False, False, True, 0),
            ("signal release, down plain", True, False, True, 0),
            ("signal relaxed, down plain", True, False, True, 1),
            ("handoff", True, True, True, 0),
            ("plain, down without PDL", False, False, False, 0),
            ("handoff, down without PDL", True, True, False, 0),
        ):
            PROBE["sem"] = sem
            parts.setdefault(name, []).append(
                graph_time_ms(lambda s=sig, w=wt, d=dpdl: chain_parts(s, w, d)) * 1e3 / len(dec.layers)
            )
            _BUFFERS[x1.device].zero_()
        PROBE["sem"] = 0
        print(f"MLP parts us a layer: {parts}", flush=True)
    res["mlp_parts_us_a_layer"] = parts
    mlp: dict[str, list[float]] = {}
    step: dict[str, dict[str, list[float]]] = {}
    ids: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, on, sem in (("handoff", True, 0), ("plain", False, 0)):
            set_handoff(on)
            PROBE["sem"] = sem
            mlp.setdefault(name, []).append(graph_time_ms(chain) * 1e3 / len(dec.layers))
            for batch in (int(b) for b in args.batches.split(",")):
                torch.manual_seed(0)  # the same start ids for both variants
                rate, first, _ = decode_rate(dec, shape, batch, args.context, args.steps)
                step.setdefault(f"batch {batch}", {}).setdefault(name, []).append(rate)
                ids[f"{name} batch {batch}"] = first
        print(f"MLP us a layer: {mlp}", flush=True)
        print(f"step tok/s: {step}", flush=True)
    set_handoff(True)
    PROBE["sem"] = 0
    res.update(mlp_us_a_layer=mlp, step_tok_s=step, first_ids=ids)
    print(f"first ids: {ids}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
