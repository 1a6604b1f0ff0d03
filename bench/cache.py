"""What the response cache costs and saves (issue 5): hit vs miss vs the bare gateway, and a replayed workload.

Starts the fake vendor API and one Crossway gateway with the cache on (in-process store, or Redis
with ``--redis URL``) as their own processes on loopback, then:

1. **Latency phases** (one worker unless ``--concurrency``): the same small chat request sent to
   ``direct`` (the fake itself), ``bypass`` (the gateway, ``x-crossway-cache: bypass``: its bare
   overhead), ``miss`` (the gateway, a new prompt each time: lookup, upstream call and store) and
   ``hit`` (the gateway, one prompt, always served from the cache); JSON and streamed. Reports
   p50/p99, the gateway's CPU time per request, and the issue's goal: a hit adds at most 1 ms p50 over
   the bare overhead (``hit_p50 - (bypass_p50 - direct_p50)``).
2. **Replayed workload**: a bounded trace of streamed requests from a few apps, each with its own
   long system prompt (a shared prefix) and user questions drawn from a Zipf law (repeats), sent to a
   deployment whose upstream takes ``--upstream-ms`` to answer; once with the cache bypassed and once
   with it on. Reports TTFT p50/p99, the hit rate, and the list-price cost of both runs (a hit costs
   nothing upstream), cross-checked with ``/admin/cache/stats``.

The load generator of the latency phases is ``bench.gateway_overhead``'s raw keep-alive client; the
replay uses httpx. Every loop is bounded in count and time; the processes started here are stopped
by PID at the end. Usage::

    python -m bench.cache            # full run (about a minute)
    python -m bench.cache --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.gateway_overhead import (
    REPO,
    UPSTREAM_KEY,
    Connection,
    Processes,
    clean_env,
    machine_info,
    pct,
    proc_cpu_s,
    serve_crossway,
    start_upstream,
)

DEFAULT_JSON = REPO / "bench" / "results" / "cache.json"
ADMIN_KEY = "bench-admin"
PRICE = {"input": 2.5, "output": 10.0, "cached_input": 1.25}
"""Dollars per million tokens, GPT-4o's list price, for the cost of the replayed workload."""


def start_gateway(procs: Processes, upstream_port: int, upstream_ms: int, redis: str | None) -> tuple[int, int, str]:
    """A gateway with the cache on: ``bench`` answers at once, ``slow`` after ``upstream_ms``. (pid, port, key)."""
    workdir = procs.workdir
    policy = workdir / "policy.yaml"
    price = "{input: %(input)s, output: %(output)s, cached_input: %(cached_input)s}" % PRICE  # noqa: UP031
    policy.write_text(
        "providers:\n  fake:\n    kind: openai\n"
        f"    base_url: http://127.0.0.1:{upstream_port}/v1\n    api_key_env: BENCH_UPSTREAM_KEY\n"
        f"models:\n  bench: {{targets: [{{provider: fake, model: gpt-4o-mini, price: {price}}}]}}\n"
        f"  slow: {{targets: [{{provider: fake, model: slow-{upstream_ms}, price: {price}}}]}}\n"
        "cache: {mode: 'on', ttl_s: 3600, cacheable: all}\n"
    )
    env = clean_env() | {
        "DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'crossway.db'}",
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "CROSSWAY_LOG_LEVEL": "warning",
        "CROSSWAY_ADMIN_KEY": ADMIN_KEY,
    }
    if redis:
        env["REDIS_URL"] = redis
    proc, port, key = serve_crossway(procs, policy, env)
    return proc.pid, port, key


def http_request(port: int, path: str, body: dict[str, Any], key: str, headers: dict[str, str] | None = None) -> bytes:
    """One encoded HTTP/1.1 request."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        f"Authorization: Bearer {key}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def latency_phase(
    name: str, port: int, make: Any, stream: bool, count: int, seconds: float, workers: int, pid: int | None
) -> dict[str, Any]:
    """Send ``count`` requests (``make(i)`` builds the i-th) over ``workers`` keep-alive connections."""
    conns = [Connection("127.0.0.1", port) for _ in range(workers)]
    latency: list[float] = []
    ttft: list[float] = []
    failed = 0
    counter = iter(range(10**9))
    deadline = time.perf_counter() + seconds

    async def worker(conn: Connection) -> None:
        nonlocal failed
        while time.perf_counter() < deadline and (i := next(counter)) < count:
            status, total, first = await conn.request(make(i), stream)
            if status != 200:
                failed += 1
                continue
            latency.append(total)
            if first is not None:
                ttft.append(first)

    cpu_before = proc_cpu_s(pid) if pid else None
    started = time.perf_counter()
    try:
        async with asyncio.timeout(seconds + 10):
            await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    wall = time.perf_counter() - started
    cpu_after = proc_cpu_s(pid) if pid else None
    done = max(len(latency), 1)
    result: dict[str, Any] = {
        "phase": name,
        "stream": stream,
        "requests": len(latency),
        "failed": failed,
        "rps": len(latency) / wall if wall else None,
        "p50_ms": pct(latency, 50),
        "p99_ms": pct(latency, 99),
        "server_cpu_ms_per_request": (cpu_after - cpu_before) * 1000 / done
        if cpu_before is not None and cpu_after is not None
        else None,
    }
    if stream:
        result["ttft_p50_ms"], result["ttft_p99_ms"] = pct(ttft, 50), pct(ttft, 99)
    return result


async def latency_phases(
    args: argparse.Namespace, up_port: int, gw_port: int, key: str, pid: int
) -> list[dict[str, Any]]:
    """direct / bypass / miss / hit, JSON then streamed."""
    out: list[dict[str, Any]] = []
    run = f"{time.time_ns()}"
    for stream in (False, True):
        base: dict[str, Any] = {"max_tokens": 64, "temperature": 0, "stream": stream}
        prompt = f"Say hello to the cache benchmark please {run} {stream}"

        def fixed(
            port: int,
            model: str,
            auth: str,
            headers: dict[str, str] | None,
            text: str = prompt,
            base: dict[str, Any] = base,
        ) -> Any:
            msg = {**base, "model": model, "messages": [{"role": "user", "content": text}]}
            payload = http_request(port, "/v1/chat/completions", msg, auth, headers)
            return lambda _i: payload

        def fresh(i: int, text: str = prompt, base: dict[str, Any] = base) -> bytes:
            msg = {**base, "model": "bench", "messages": [{"role": "user", "content": f"{text} miss {i}"}]}
            return http_request(gw_port, "/v1/chat/completions", msg, key)

        kind = "stream" if stream else "json"
        phases = [
            ("direct", up_port, fixed(up_port, "gpt-4o-mini", UPSTREAM_KEY, None), None),
            ("bypass", gw_port, fixed(gw_port, "bench", key, {"x-crossway-cache": "bypass"}), pid),
            ("miss", gw_port, fresh, pid),
            ("hit", gw_port, fixed(gw_port, "bench", key, None), pid),
        ]
        for name, port, make, server_pid in phases:
            # warm-up: connections, code paths, and (for ``hit``) the entry itself
            await latency_phase(name, port, make, stream, args.warmup, 10, args.concurrency, None)
            phase = await latency_phase(
                f"{kind}-{name}", port, make, stream, args.requests, args.seconds, args.concurrency, server_pid
            )
            out.append(phase)
            print(json.dumps(phase))
    return out


def zipf_trace(n: int, questions: int, apps: int, s: float, seed: int) -> list[tuple[int, int]]:
    """``n`` (app, question) pairs: apps uniform, questions Zipf(``s``) over ``questions`` ranks."""
    rng = random.Random(seed)
    weights = [1 / (rank**s) for rank in range(1, questions + 1)]
    return [(rng.randrange(apps), rng.choices(range(questions), weights)[0]) for _ in range(n)]


async def replay(args: argparse.Namespace, gw_port: int, key: str, cached: bool, tag: str) -> dict[str, Any]:
    """Send the trace (streamed, ``--replay-concurrency`` at a time); TTFT and list-price cost."""
    trace = zipf_trace(args.replay, args.questions, args.apps, args.zipf, seed=7)
    systems = [
        f"App {a} ({tag}). " + "You follow the handbook of this app, rule by rule. " * 40 for a in range(args.apps)
    ]
    headers = {"authorization": f"Bearer {key}"} | ({} if cached else {"x-crossway-cache": "bypass"})
    url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
    ttft: list[float] = []
    ttft_by: dict[str, list[float]] = {}
    cost = 0.0
    outcomes: dict[str, int] = {}
    queue = iter(trace)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal cost
        for app, question in queue:
            body = {
                "model": "slow",
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [
                    {"role": "system", "content": systems[app]},
                    {"role": "user", "content": f"Question {question}: what does rule {question} say?"},
                ],
            }
            started = time.perf_counter()
            first = None
            usage = None
            async with client.stream("POST", url, json=body, headers=headers) as r:
                outcome = r.headers.get("x-crossway-cache", "none")
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        first = time.perf_counter() - started
                    usage = chunk.get("usage") or usage
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if first is not None:
                ttft.append(first)
                ttft_by.setdefault(outcome, []).append(first)
            if usage and outcome != "hit":  # a hit costs nothing upstream
                cached_in = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                cost += (
                    (usage["prompt_tokens"] - cached_in) * PRICE["input"]
                    + cached_in * PRICE["cached_input"]
                    + usage["completion_tokens"] * PRICE["output"]
                ) / 1e6

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=args.replay_concurrency)) as client:
        async with asyncio.timeout(600):
            await asyncio.gather(*(worker(client) for _ in range(args.replay_concurrency)))
    return {
        "cache": "on" if cached else "bypassed",
        "requests": len(trace),
        "distinct_prompts": len(set(trace)),
        "outcomes": outcomes,
        "wall_s": time.perf_counter() - started,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "ttft_mean_ms": sum(ttft) / len(ttft) * 1000 if ttft else None,
        "ttft_p50_ms_by_outcome": {k: pct(v, 50) for k, v in sorted(ttft_by.items())},
        "cost_usd": cost,
    }


async def cache_stats(gw_port: int) -> dict[str, Any]:
    """The bench tenant's counters from ``/admin/cache/stats``."""
    async with httpx.AsyncClient() as client:
        r = await client.get(
            f"http://127.0.0.1:{gw_port}/admin/cache/stats", headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
    tenants: dict[str, dict[str, Any]] = r.json()["tenants"]
    return tenants["bench"]


async def main_async(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    _, up_port = start_upstream(procs)
    pid, gw_port, key = start_gateway(procs, up_port, args.upstream_ms, args.redis)
    latency = await latency_phases(args, up_port, gw_port, key, pid)
    tag = f"{time.time_ns()}"  # fresh prompts: nothing of an earlier run is in the cache
    baseline = await replay(args, gw_port, key, cached=False, tag=tag)
    print(json.dumps(baseline))
    before = await cache_stats(gw_port)
    with_cache = await replay(args, gw_port, key, cached=True, tag=tag)
    after = await cache_stats(gw_port)
    # what the gateway itself counted as saved during the cached replay: a cross-check of cost_usd
    with_cache["gateway_saved_usd"] = after["saved_usd"] - before["saved_usd"]
    with_cache["gateway_saved_upstream_s"] = after["saved_s"] - before["saved_s"]
    print(json.dumps(with_cache))
    async with httpx.AsyncClient() as client:  # leave nothing behind in a shared Redis
        await client.delete(
            f"http://127.0.0.1:{gw_port}/admin/cache/tenants/bench", headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
    by = {p["phase"]: p for p in latency}
    goals = {}
    for kind in ("json", "stream"):
        d, b, h = (by[f"{kind}-{n}"]["p50_ms"] for n in ("direct", "bypass", "hit"))
        bare = b - d
        goals[kind] = {
            "bare_overhead_p50_ms": bare,
            "hit_p50_ms": h,
            "hit_minus_bare_ms": h - bare,
            "goal_met": h - bare <= 1.0,
        }
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_info(),
        "config": {**vars(args), "json": str(args.json)},
        "latency": latency,
        "goal_hit_within_1ms_of_bare_overhead": goals,
        "replay": {"bypassed": baseline, "cached": with_cache},
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    p.add_argument("--requests", type=int, default=2000, help="requests per latency phase (bounded by --seconds)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--replay", type=int, default=600, help="requests in the replayed trace")
    p.add_argument("--replay-concurrency", type=int, default=8)
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--apps", type=int, default=4)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--upstream-ms", type=int, default=150, help="how long the replay's upstream takes to answer")
    p.add_argument("--redis", default=None, help="use Redis at this URL as the cache store")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.requests, args.seconds, args.warmup, args.replay = 200, 3.0, 20, 60
    with tempfile.TemporaryDirectory(prefix="crossway-cache-bench-") as tmp:
        procs = Processes(Path(tmp))
        try:
            report = asyncio.run(main_async(args, procs))
        finally:
            procs.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["goal_hit_within_1ms_of_bare_overhead"], indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
