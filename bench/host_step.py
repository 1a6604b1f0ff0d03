"""The engine's host work per decode step, with the device's part taken out: what the engine thread costs at N running requests.

On the GPU, a step of SmolLM2 at 256 running requests is device-bound in good windows (~2.7 ms of
kernels), so timing it there cannot show how long the host's part takes. This runs the real
``LLMEngine`` step (scheduler, KV manager, the decode graphs' input staging, sampling's setup, the
update, the outputs with their detokenization) on the CPU, with three parts of the device's work
replaced: the model returns no logits (``forward`` a stub), the decode graphs' replay does nothing
(the host staging before it is real: ``DecodeInputs`` over CPU tensors) and the picks are
random ids drawn on the host. Everything else is the engine's own code, so the figure is the host
cost per step that async scheduling must hide behind the device's step. It is a measurement tool:
the engine's tests run the real model.

``--through-async`` runs the same requests through the server's front (``AsyncEngine``: the engine
on its thread, every request's outputs consumed by an asyncio task) and times the engine thread's
whole loop, the hand-over of each step's outputs to the event loop included. ``--cohort`` runs
requests that started together (their blocks fill in the same step), and ``--mixed`` adds a long
prompt whose chunks go through the step graphs' real staging, their replay stubbed as well.

    python -m bench.host_step --requests 256 --windows 5 [--stream] --json /tmp/host_step.json
    python -m bench.host_step --requests 256 --windows 5 --through-async [--stream]
    python -m bench.host_step --requests 128 --windows 6 --steps 48 --cohort   # blocks filling together
    python -m bench.host_step --requests 128 --windows 3 --steps 48 --mixed    # with a long prompt's chunks
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bench.engine_gpu_smollm import (
    CHUNKED_LOAD,
    RUNNING_PROMPT,
    _add_workload,
    chunked_config,
    engine_config,
    offline_workload,
    prefills_done,
)
from selfhost import engine as engine_module
from selfhost import sampling
from selfhost.async_engine import AsyncEngine
from selfhost.engine import LLMEngine
from selfhost.graphs import DecodeInputs
from selfhost.sampling import SamplingParams
from selfhost.step_graphs import StepGraphs

if TYPE_CHECKING:
    from collections.abc import Sequence

GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256)


class _HostGraphs:
    """The decode graphs with the device's part taken out: their real staging (``DecodeInputs`` over CPU tensors), no replay."""

    max_batch = GRAPH_SIZES[-1]

    def __init__(self, max_blocks: int) -> None:
        self.inputs = DecodeInputs(self.max_batch, max_blocks, torch.device("cpu"), pinned=False)
        self.num_replays = 0

    def run(
        self,
        ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        tables: Sequence[Sequence[int]],
        sources: Sequence[int],
    ) -> torch.Tensor:
        """Stage the step as ``DecodeGraphs.run`` does; the logits are the stub model's (one column)."""
        n = len(ids)
        self.inputs.stage(ids, positions, slots, tables, sources, next(s for s in GRAPH_SIZES if s >= n))
        self.num_replays += 1
        return torch.zeros((n, 1))


class _RandomPicks(sampling.PendingSample):
    """Picks drawn on the host: the device's argmax taken out, the rest of the class (resolve) kept.

    Drawn in one call: a Python draw per request took 138 us a step at 256 requests on the CPU VM
    (``torch.randint``: 3 us), host work that the engine does not have.
    """

    gen = torch.Generator().manual_seed(0)

    def __init__(self, logits: torch.Tensor, requests: Any) -> None:
        self.requests = requests
        self.picked = torch.randint(100, 49000, (len(requests),), generator=self.gen)
        self.seeded, self._wanted, self._seeded_logits, self._logp = [], [], None, None
        self._host, self._done = self.picked.clone(), None


def measure(
    requests: int,
    windows: int,
    steps: int,
    kv_gib: int = 12,
    *,
    through_async: bool = False,
    stream: bool = False,
    cohort: bool = False,
    mixed: bool = False,
) -> dict[str, Any]:
    """Prefill ``requests`` of the GPU bench's offline workload, then time ``windows`` windows of ``steps`` decode steps.

    ``kv_gib`` sizes the KV pool (fp32 on the CPU): 12 holds 256 requests without preemption.
    ``through_async`` runs the requests through ``AsyncEngine`` (the server's front: its engine
    thread, and an event loop whose tasks consume every request's outputs) and times the engine
    thread's whole loop, the hand-over of outputs included. ``stream`` gives each request an
    output every step (a streaming client's), else one when it finishes. ``cohort`` runs the
    chunked-prefill bench's running set instead (prompts of ``RUNNING_PROMPT`` tokens admitted in
    one step), whose requests fill a KV block in the same step. ``mixed`` runs that set while a
    long prompt (the chunked bench's) arrives at the start of each window, at the engine's default
    budget and ``mixed_prefill_tokens``: its chunks go through the step graphs' staging, the
    graphs' replay stubbed too.
    """
    if (cohort or mixed) and through_async:
        raise ValueError("--cohort and --mixed run on the engine alone, not through the async front")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the GPU host's copies are asynchronous: no intra-op threads in the figure
    try:
        engine, graphs = _host_engine(kv_gib, mixed)
        if through_async:
            out = asyncio.run(_windows_through_async(engine, requests, windows, steps, stream))
        else:
            out = _windows(engine, requests, windows, steps, stream, cohort or mixed, CHUNKED_LOAD[1] if mixed else 0)
    finally:
        torch.set_num_threads(threads)
        engine_module.PendingSample = sampling.PendingSample  # type: ignore[attr-defined]
    return {
        "requests": requests,
        "steps": steps,
        "through_async": through_async,
        "streamed": stream,
        "cohort": cohort,
        "mixed": mixed,
        "windows": out,
        "replays": graphs.num_replays,
        "step_replays": engine.runner.step_graphs.num_replays if engine.runner.step_graphs is not None else 0,
        "median_cpu_ms_per_step": statistics.median(w["cpu_ms_per_step"] for w in out),
    }


def _host_engine(kv_gib: int, mixed: bool = False) -> tuple[LLMEngine, _HostGraphs]:
    cfg = replace(engine_config("cpu", smoke=False), kv_cache_memory_bytes=kv_gib << 30, async_scheduling=True)
    if mixed:
        cfg = chunked_config(cfg)
    engine = LLMEngine.from_model("smollm2", cfg)
    runner = engine.runner
    runner.model.forward = lambda ids, *_, **__: torch.zeros(len(ids), 1)  # type: ignore[method-assign]
    runner.model.compute_logits = lambda hidden: hidden  # type: ignore[method-assign]
    graphs = _HostGraphs((cfg.max_model_len or 8192) // cfg.block_size)
    runner.graphs = graphs  # type: ignore[assignment]
    if mixed:
        budget = cfg.max_num_batched_tokens
        steps = StepGraphs(
            runner.model,
            runner.kv_caches,
            (budget // 2, budget),
            cfg.max_num_seqs,
            (cfg.max_model_len or 8192) // cfg.block_size,
            torch.device("cpu"),
            chunk_tokens=cfg.mixed_prefill_tokens,
            last_tokens=runner.last_tokens,
        )
        for key in steps._steps:  # the stub model's logits (one column), a row for each row the step may sample
            steps._steps[key] = functools.partial(torch.zeros, steps._dcap(key[0]), 1)
        runner.step_graphs = steps
    engine_module.PendingSample = _RandomPicks  # type: ignore[attr-defined]
    return engine, graphs


def _windows(
    engine: LLMEngine, requests: int, windows: int, steps: int, stream: bool, cohort: bool, long_prompt: int = 0
) -> list[dict[str, Any]]:
    if cohort:
        params = SamplingParams(max_tokens=engine.max_model_len - RUNNING_PROMPT, temperature=0.0, ignore_eos=True)
        for i in range(requests):
            engine.add_request(
                f"host-{i}", [200 + (i * 13 + j) % 30000 for j in range(RUNNING_PROMPT)], params, stream=stream
            )
    else:
        _add_workload(engine, "host", requests, 100, 1024, seed=3, stream=stream)
    while not prefills_done(engine):
        engine.step()
    out = []
    for w in range(windows):
        if long_prompt:  # new ids each window: no prefix hit on the one before
            prompt = [300 + (w * 7919 + j * 7) % 40000 for j in range(long_prompt)]
            engine.add_request(f"host-long-{w}", prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        walls = []
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            t = time.perf_counter()
            engine.step()
            walls.append(time.perf_counter() - t)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        walls.sort()
        out.append(
            {
                "ms_per_step": wall * 1e3 / steps,
                "cpu_ms_per_step": cpu * 1e3 / steps,
                "median_ms": walls[len(walls) // 2] * 1e3,
                "max_ms": walls[-1] * 1e3,
                "running": len(engine.scheduler.running),
            }
        )
    return out


async def _windows_through_async(
    engine: LLMEngine, requests: int, windows: int, steps: int, stream: bool
) -> list[dict[str, Any]]:
    """The same windows, timed on the engine thread from one step's start to the next (its whole loop)."""
    marks: list[tuple[float, float, int]] = []  # (wall, engine thread CPU, running) at each timed step's start
    decoding = threading.Event()
    done = threading.Event()
    step = engine.step

    def timed_step() -> list[Any]:
        if decoding.is_set() and not done.is_set():
            marks.append((time.perf_counter(), time.thread_time(), len(engine.scheduler.running)))
            if len(marks) > windows * steps:
                done.set()
        elif not decoding.is_set() and prefills_done(engine):
            decoding.set()
        return step()

    engine.step = timed_step  # type: ignore[method-assign]
    front = AsyncEngine(engine)
    front.start()

    async def consume(prompt: list[int], params: SamplingParams) -> None:
        with contextlib.suppress(RuntimeError):  # the engine closes under the streams when timing ends
            async for _ in front.generate(prompt, params, stream=stream):
                pass

    workload = offline_workload(engine.model_config.vocab_size, requests, 100, 1024, seed=3)
    tasks = [
        asyncio.create_task(consume(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)))
        for p, n in workload
    ]
    consumers: asyncio.Future[Any] = asyncio.gather(*tasks)
    timed: asyncio.Future[Any] = asyncio.ensure_future(asyncio.to_thread(done.wait))
    await asyncio.wait([timed, consumers], return_when=asyncio.FIRST_COMPLETED)
    done.set()  # the workload may have ended first: bounded either way
    await asyncio.to_thread(front.close)
    await asyncio.gather(consumers, timed)
    if len(marks) <= windows * steps:
        raise RuntimeError(f"the workload ended after {len(marks)} timed steps; ask for fewer than {windows * steps}")
    out = []
    for w in range(windows):
        first, last = marks[w * steps], marks[(w + 1) * steps]
        out.append(
            {
                "ms_per_step": (last[0] - first[0]) * 1e3 / steps,
                "cpu_ms_per_step": (last[1] - first[1]) * 1e3 / steps,
                "running": last[2],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--through-async", action="store_true", help="through AsyncEngine, outputs handed to asyncio")
    ap.add_argument("--stream", action="store_true", help="an output every step for every request (streaming clients)")
    ap.add_argument(
        "--cohort", action="store_true", help="the chunked bench's running set: blocks fill in the same step"
    )
    ap.add_argument("--mixed", action="store_true", help="the running set while a long prompt's chunks run")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = measure(
        args.requests,
        args.windows,
        args.steps,
        through_async=args.through_async,
        stream=args.stream,
        cohort=args.cohort,
        mixed=args.mixed,
    )
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
