"""What the ledger, budgets and rate limits add to a request, side by side in one run (issue 6).

Starts the fake vendor APIs (``tests.fakes.upstream``) and several ``crossway serve`` processes in
front of them, identical but for the ledger, then sends each the same workloads with the load
generator of ``bench.gateway_overhead``:

* ``off``: ``CROSSWAY_LEDGER=off``: no usage records, no budgets, no rate limits;
* ``nolimits``: the ledger on, the tenant without limits (a usage record per request, no counter);
* ``memory``: limits on the tenant and on its key (requests and tokens per minute, soft and hard
  monthly budgets, all far from binding) with in-process counters (the embedded default);
* ``redis``: the same limits with the counters in Redis (``REDIS_URL``, database ``--redis-db``);
* ``redis-before``, only with ``--before TREE``: the same as ``redis``, served from another source
  tree (the code before a change), so that before and after are measured in the same run.

Each phase runs on every target in turn, in a rotated order each round (``--rounds``); a target's
figure is the median over rounds of its p50 and p99, and its CPU per request is all its CPU time
over all its requests. Differences are against ``off``. The Redis server's CPU per request is read
too when its process is visible (other users of that Redis add to it).

Usage::

    python -m bench.ledger_overhead --quick
    python -m bench.ledger_overhead --before /tmp/ledger_before --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.gateway_overhead import (
    ALIAS,
    REPO,
    UPSTREAM_KEY,
    UPSTREAM_MODEL,
    Phase,
    Processes,
    Target,
    clean_env,
    free_port,
    machine_info,
    preflight,
    run_measurement,
    run_phase,
    start_upstream,
    wait_http,
)

DEFAULT_JSON = REPO / "bench" / "results" / "ledger_overhead.json"
ADMIN_KEY = "bench-admin"
FAR = {"rpm": 10**9, "tpm": 10**12, "budget_soft_usd": 1e6, "budget_hard_usd": 1e7}
"""Limits set on the tenant and on its key: every check runs, none binds."""


def write_policy(workdir: Path, upstream_port: int) -> Path:
    policy = workdir / "policy.yaml"
    policy.write_text(
        "providers:\n  fake:\n    kind: openai\n"
        f"    base_url: http://127.0.0.1:{upstream_port}/v1\n    api_key_env: BENCH_UPSTREAM_KEY\n"
        f"models:\n  {ALIAS}:\n    targets: [{{provider: fake, model: {UPSTREAM_MODEL}, "
        "price: {input: 0.15, output: 0.6}}]\n"
    )
    return policy


def start_gateway(
    procs: Processes,
    name: str,
    tree: Path,
    policy: Path,
    *,
    ledger: bool,
    limits: bool,
    redis_url: str | None,
    log_level: str,
) -> Target:
    """A ``crossway serve`` from ``tree`` with its own SQLite file and tenant; limits set through the admin API."""
    tenant = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    env = clean_env() | {
        "DATABASE_URL": f"sqlite+aiosqlite:///{procs.workdir / f'{name}.db'}",
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "CROSSWAY_LOG_LEVEL": log_level,
        "CROSSWAY_ADMIN_KEY": ADMIN_KEY,
        "CROSSWAY_LEDGER": "on" if ledger else "off",
    }
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    cli = [sys.executable, "-m", "gateway.cli"]
    made = subprocess.run(
        [*cli, "keys", "create", "--tenant", tenant], cwd=tree, env=env, capture_output=True, timeout=120, check=False
    )
    key = made.stdout.decode().strip()
    if made.returncode != 0 or not key:
        raise RuntimeError(f"{name}: crossway keys create failed: {made.stderr.decode()[-2000:]}")
    port = free_port()
    argv = [*cli, "serve", "--host", "127.0.0.1", "--port", str(port), "--policy", str(policy)]
    proc = procs.start(name, argv, env, cwd=tree)
    try:
        wait_http(proc, port, "/healthz", {}, 60)
    except RuntimeError as exc:
        raise RuntimeError(f"{name} did not start: {exc}\n{procs.log_tail(name)}") from exc
    url = f"http://127.0.0.1:{port}"
    if limits:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        keys = httpx.get(f"{url}/admin/keys", params={"tenant": tenant}, headers=admin, timeout=10).json()["data"]
        for key_id in (0, keys[0]["id"]):
            r = httpx.put(
                f"{url}/admin/finance/limits",
                json={"tenant": tenant, "key_id": key_id, **FAR},
                headers=admin,
                timeout=10,
            )
            if r.status_code != 200:
                raise RuntimeError(f"{name}: setting limits failed: {r.status_code} {r.text}")
    return Target(name, f"{url}/v1", key, ALIAS, proc.pid)


def redis_pid(url: str) -> int | None:
    """The Redis server's PID when it runs on this machine and says so."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=2)
        pid = int(client.info("server")["process_id"])
        client.close()
    except (redis.RedisError, KeyError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}/stat").exists() else None


def clean_redis(url: str) -> int:
    """Delete the counters this run left in its Redis database (it is ours: ``--redis-db``)."""
    client = redis.Redis.from_url(url)
    keys = [*client.scan_iter("crossway:rl:*"), *client.scan_iter("crossway:budget:*")]
    if keys:
        client.delete(*keys)
    client.close()
    return len(keys)


def aggregate(runs: list[dict[str, Any]], pids: dict[str, int]) -> dict[str, Any]:
    """One target's rounds of one phase: medians of the percentiles, CPU summed over all requests."""
    requests = sum(r["requests"] for r in runs)
    out: dict[str, Any] = {
        "rounds": len(runs),
        "requests": requests,
        "failed": sum(r["failed"] for r in runs),
        "p50_ms": statistics.median(r["latency_ms"]["p50"] for r in runs),
        "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in runs),
        "rps": statistics.median(r["rps"] for r in runs),
        "p50_ms_rounds": [r["latency_ms"]["p50"] for r in runs],
    }
    if "ttft_ms" in runs[0]:
        out["ttft_p50_ms"] = statistics.median(r["ttft_ms"]["p50"] for r in runs)
    for name in ("server", "redis"):
        key = runs[0]["target"] if name == "server" else "redis-server"
        if key in pids and all(r["cpu"].get(key) for r in runs):
            out[f"{name}_cpu_ms_per_request"] = sum(r["cpu"][key]["s"] for r in runs) * 1000 / max(requests, 1)
    return out


async def measure(args: argparse.Namespace, targets: list[Target], pids: dict[str, int]) -> dict[str, Any]:
    for t in targets:
        await preflight(t, args.max_tokens)
    phases = [Phase(f"{w}-c{c}", w, c, args.requests, args.duration) for w in args.workloads for c in args.concurrency]
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rnd in range(args.rounds):
        order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
        for phase in phases:
            for t in order:
                r = await run_phase(t, phase, pids, args.warmup, args.max_tokens, args.grace)
                raw.setdefault(phase.name, {}).setdefault(t.name, []).append(r)
                print(
                    f"  round {rnd + 1} {phase.name:<10} {t.name:<13} n={r['requests']:<5} fail={r['failed']:<3} "
                    f"p50={r['latency_ms']['p50']:.3f} cpu/req={r['server_cpu_ms_per_request'] or 0:.3f}",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for phase_name, by_target in raw.items():
        rows = {name: aggregate(runs, pids) for name, runs in by_target.items()}
        base = rows.get("off")
        for row in rows.values():
            if base is not None:
                row["p50_vs_off_ms"] = row["p50_ms"] - base["p50_ms"]
                if "server_cpu_ms_per_request" in row and "server_cpu_ms_per_request" in base:
                    row["cpu_vs_off_ms"] = row["server_cpu_ms_per_request"] - base["server_cpu_ms_per_request"]
        summary[phase_name] = rows
    return {"summary": summary, "runs": raw}


def print_summary(summary: dict[str, Any]) -> None:
    print("\nmedian over rounds; CPU = gateway process CPU ms per request; vs off = difference to CROSSWAY_LEDGER=off")
    print(f"{'phase':<10} {'target':<13} {'n':>6} {'p50':>7} {'p99':>7} {'p50 vs off':>10} {'CPU/req':>8} {'CPU vs off':>10} {'redis CPU':>9}")  # fmt: skip
    for phase, rows in summary.items():
        for name, r in rows.items():
            print(
                f"{phase:<10} {name:<13} {r['requests']:>6} {r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f} "
                f"{_signed(r.get('p50_vs_off_ms')):>10} {_num(r.get('server_cpu_ms_per_request')):>8} "
                f"{_signed(r.get('cpu_vs_off_ms')):>10} {_num(r.get('redis_cpu_ms_per_request')):>9}"
            )


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


async def main_async(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    upstream, up_port = start_upstream(procs)
    policy = write_policy(procs.workdir, up_port)
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    pids = {"loadgen": os.getpid(), "upstream": upstream.pid}
    if (rp := redis_pid(redis_url)) is not None:
        pids["redis-server"] = rp
    targets = [Target("direct", f"http://127.0.0.1:{up_port}/v1", UPSTREAM_KEY, UPSTREAM_MODEL, upstream.pid)]
    specs: list[tuple[str, Path, bool, bool, str | None]] = [
        ("off", REPO, False, False, None),
        ("nolimits", REPO, True, False, None),
        ("memory", REPO, True, True, None),
        ("redis", REPO, True, True, redis_url),
    ]
    if args.before is not None:
        specs.append(("redis-before", args.before, True, True, redis_url))
    for name, tree, ledger, limits, r_url in specs:
        t = start_gateway(
            procs, name, tree, policy, ledger=ledger, limits=limits, redis_url=r_url, log_level=args.gateway_log_level
        )
        print(f"{name:<13} pid {t.pid}  {t.base_url}  ({tree})")
        targets.append(t)
    for t in targets:
        assert t.pid is not None
        pids.setdefault(t.name, t.pid)
    result = await measure(args, targets, pids)
    return {
        "benchmark": "ledger_overhead",
        "command": " ".join(["python", "-m", "bench.ledger_overhead", *sys.argv[1:]]),
        "machine": machine_info(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"},
        "limits": FAR,
        **result,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: one round, small counts")
    p.add_argument("--before", type=Path, metavar="TREE", help="also serve `redis-before` from this source tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    p.add_argument("--workloads", type=lambda s: s.split(","), default=["json", "stream"])
    p.add_argument("--requests", type=int, default=None, help="per phase and target (cap)")
    p.add_argument("--duration", type=float, default=None, help="seconds per phase and target (cap)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--grace", type=float, default=15.0)
    p.add_argument("--redis-db", type=int, default=7, help="the Redis database this run owns (cleaned at the end)")
    p.add_argument("--gateway-log-level", default="info")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.requests is None:
        args.requests = 150 if args.quick else 1500
    if args.duration is None:
        args.duration = 2.0 if args.quick else 5.0
    if args.quick:
        args.rounds = 1
    workdir = Path(tempfile.mkdtemp(prefix="crossway-ledger-bench-"))

    def cleanup() -> None:
        removed = clean_redis(f"redis://127.0.0.1:6379/{args.redis_db}")
        print(f"removed {removed} counter keys from Redis db {args.redis_db}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)

    report = run_measurement("ledger_overhead", workdir, lambda procs: main_async(args, procs), cleanup)
    if isinstance(report, int):
        return report
    print_summary(report["summary"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
