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

Each window also says how even its steps were (``step_spread``): the median, 90th percentile and
longest step, the steps over twice the median and how much of their wall time the engine thread
spent on the CPU (near 1: it was working, slowly; well under 1: it was off the CPU or waiting),
and the collector's passes in the window by generation (``gc.callbacks``), to tell a slow host
from a pause.

    python -m bench.host_headroom [--stream] --json /tmp/headroom.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.engine_gpu_smollm import _add_workload, engine_config, prefills_done
from selfhost import sampling
from selfhost.engine import LLMEngine


def step_spread(walls: list[float], cpus: list[float], collections: list[tuple[int, float]]) -> dict[str, Any]:
    """How even a window's steps were: ``walls`` and ``cpus`` are each step's seconds, ``collections`` the (generation, seconds) of each collector pass."""
    median = statistics.median(walls)
    slow = [i for i, w in enumerate(walls) if w > 2 * median]
    slow_wall = sum(walls[i] for i in slow)
    gens: dict[str, dict[str, float]] = {}
    for gen, secs in collections:
        g = gens.setdefault(str(gen), {"count": 0, "total_ms": 0.0, "max_ms": 0.0})
        g["count"] += 1
        g["total_ms"] += secs * 1e3
        g["max_ms"] = max(g["max_ms"], secs * 1e3)
    return {
        "p50_ms": median * 1e3,
        "p90_ms": statistics.quantiles(walls, n=10)[-1] * 1e3 if len(walls) > 1 else median * 1e3,
        "max_ms": max(walls) * 1e3,
        "slow_steps": len(slow),
        "slow_steps_ms": slow_wall * 1e3,
        "slow_steps_cpu_share": sum(cpus[i] for i in slow) / slow_wall if slow else None,
        "gc": gens,
    }


def measure(stream: bool, windows: int = 4, steps: int = 40, *, gc_freeze: bool = False) -> dict[str, Any]:
    """Load the engine, prefill the workload, then time ``windows`` windows of ``steps`` decode steps.

    ``gc_freeze`` moves every object alive after the prefills out of the collector's reach
    (``gc.freeze``), as a server would after loading, so that a full pass does not walk them.
    """
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

    collections: list[tuple[int, float]] = []
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - gc_start[0]))

    sampling.PendingSample.resolve = timed_resolve  # type: ignore[method-assign]
    torch.cuda.CUDAGraph.replay = timed_replay  # type: ignore[method-assign,assignment]
    gc.callbacks.append(on_gc)
    try:
        _add_workload(engine, "headroom", 256, 100, 1024, seed=3, stream=stream)
        while not prefills_done(engine):
            engine.step()
        torch.cuda.synchronize()
        if gc_freeze:
            gc.collect()
            gc.freeze()
        out = []
        for _ in range(windows):
            waited[0] = 0.0
            marks.clear()
            collections.clear()
            walls: list[float] = []
            cpus: list[float] = []
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                t0, c0 = time.perf_counter(), time.thread_time()
                engine.step()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.thread_time() - c0)
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
                    "step_spread": step_spread(walls, cpus, collections),
                }
            )
    finally:
        gc.callbacks.remove(on_gc)
        sampling.PendingSample.resolve = resolve  # type: ignore[method-assign]
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
        if gc_freeze:
            gc.unfreeze()
    return {"streamed": stream, "gc_freeze": gc_freeze, "steps": steps, "windows": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stream", action="store_true", help="an output every step for every request")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the prefills")
    ap.add_argument("--windows", type=int, default=4, help="40-step windows")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = measure(args.stream, args.windows, gc_freeze=args.gc_freeze)
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
