"""How long the engine thread waits for the device each step: the host's headroom under a decode load (GPU).

The GPU bench's busy share needs the profiler, whose own cost on the host is not known; this runs
the same load (SmolLM2 in bf16, 256 requests of the offline workload, prefills done) without it
and times, per 40-step window, the step's wall time, the engine thread's CPU time and the time
it spends waiting for a step's picks (``PendingSample.resolve``). A positive wait is time the
device still had work queued when the host was ready: the host kept ahead of it. Wall minus wait
is the host's own work a step.

It also gives a busy share without the profiler: a CUDA event is recorded just before and just
after each graph replay, so each pair's elapsed time is the replay's time on the device (an event
takes its timestamp when the stream reaches it), and their sum over the span from the first to the
last is the share of time the device ran the steps' graphs. The input copies and the picks'
kernels outside the pairs count as idle, so it reads a little low.

    python -m bench.host_headroom [--stream] --json /tmp/headroom.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.engine_gpu_smollm import _add_workload, engine_config, prefills_done
from selfhost import sampling
from selfhost.engine import LLMEngine


def measure(stream: bool, windows: int = 4, steps: int = 40) -> dict[str, Any]:
    """Load the engine, prefill the workload, then time ``windows`` windows of ``steps`` decode steps."""
    engine = LLMEngine.from_model("smollm2", engine_config("cuda", smoke=False))
    waited = [0.0]
    resolve = sampling.PendingSample.resolve

    def timed_resolve(self: sampling.PendingSample) -> sampling.SamplerOutput:
        if self._done is not None:
            t = time.perf_counter()
            self._done.synchronize()
            waited[0] += time.perf_counter() - t
        return resolve(self)

    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    replay = torch.cuda.CUDAGraph.replay

    def timed_replay(graph: torch.cuda.CUDAGraph) -> None:
        before = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        after = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        before.record()
        replay(graph)
        after.record()
        marks.append((before, after))

    sampling.PendingSample.resolve = timed_resolve  # type: ignore[method-assign]
    torch.cuda.CUDAGraph.replay = timed_replay  # type: ignore[method-assign,assignment]
    try:
        _add_workload(engine, "headroom", 256, 100, 1024, seed=3, stream=stream)
        while not prefills_done(engine):
            engine.step()
        torch.cuda.synchronize()
        out = []
        for _ in range(windows):
            waited[0] = 0.0
            marks.clear()
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                engine.step()
            wall, cpu = time.perf_counter() - t, time.thread_time() - c
            torch.cuda.synchronize()
            busy = sum(a.elapsed_time(b) for a, b in marks)
            span = marks[0][0].elapsed_time(marks[-1][1])
            out.append(
                {
                    "wall_ms": wall * 1e3 / steps,
                    "cpu_ms": cpu * 1e3 / steps,
                    "wait_ms": waited[0] * 1e3 / steps,
                    "replays": len(marks),
                    "replay_busy_share": busy / span,
                    "running": len(engine.scheduler.running),
                }
            )
    finally:
        sampling.PendingSample.resolve = resolve  # type: ignore[method-assign]
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
    return {"streamed": stream, "steps": steps, "windows": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stream", action="store_true", help="an output every step for every request")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = measure(args.stream)
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
