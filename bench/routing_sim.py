"""Trace-driven routing simulation: Crossway's router against simple policies and oracles (issue 4).

A seeded, discrete-event simulation of one model alias served by four deployments
(``bench.routing_scenario``): a self-hosted engine priced from its GPU's dollars per hour whose step
time grows with its batch and which queues beyond its slots, a cheap API with a heavy TTFT tail and a
rate limit, a mid-priced API with an error outage, and a premium fast API that turns slow for two
hours. A day of requests with a diurnal rate, in three SLO classes, is routed by each policy of
``bench.routing_policies`` on the same trace and the same random draws (common random numbers, so
differences come from the decisions alone).

This module owns the mechanics: the event loop, each attempt's true latency and failure, load,
fallbacks (at most ``MAX_ATTEMPTS`` attempts; a failed attempt's time counts in the request's TTFT)
and billing. Latency on the engine is fixed when the attempt starts, from the engine's load at that
moment (an approximation: later arrivals do not slow a running request). External APIs bill
successful attempts at list price (batch discount for the ``batch`` class); the engine bills its GPU
for the time it has at least one request in flight, which is what ``engine_price`` apportions per
token. A request meets its SLO when its own TTFT and TPOT are within the class's limits (batch: it
finished before the deadline); attainment is the share of all requests that did.

Usage::

    python -m bench.routing_sim                        # a simulated day (about a minute here)
    python -m bench.routing_sim --hours 2 --json /tmp/routing.json
    python -m bench.routing_sim --policies crossway,crossway-x2,crossway-x4,oracle --json /tmp/replicas.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import json
import math
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.routing_policies import POLICIES, make_policy
from bench.routing_scenario import CLASSES, POLICY_YAML, SCENARIO, Deployment, Trace, make_trace
from gateway.policy import parse_policy
from gateway.stats import EngineLoad

if TYPE_CHECKING:
    from collections.abc import Mapping

    from bench.routing_policies import SimPolicy
    from gateway.policy import Policy, SloClass

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "bench" / "results" / "routing_sim.json"
MAX_ATTEMPTS = 3
TYPICAL_OUTPUT = 256
"""What the router is told to expect as output (a client's typical answer, not the true length)."""


@dataclass(slots=True)
class Attempt:
    """The true result of sending request ``i`` to a deployment now."""

    ok: bool
    ttft: float
    tpot: float
    seconds: float
    """Until it ends: the whole answer, or the error."""
    request: int = -1
    """The request's index in the trace."""


@dataclass(slots=True)
class Tally:
    """One policy's results."""

    served: dict[str, int] = field(default_factory=dict)
    met: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    attempts: int = 0
    api_cost: float = 0.0
    engine_cost: float = 0.0
    by_deployment: dict[str, int] = field(default_factory=dict)


class Simulation:
    """The shared world of one run: deployments' load, the clock, and the billing."""

    def __init__(self, trace: Trace, policy: Policy, deployments: tuple[Deployment, ...] = SCENARIO) -> None:
        self.trace = trace
        self.policy = policy
        self.deployments = {d.key: d for d in deployments}
        self.index = {d.key: i for i, d in enumerate(deployments)}
        self.targets = {t.key: t for t in policy.models["chat"]}
        self.plans = {c: policy.resolve("chat", slo=c) for c, _ in CLASSES}
        self.in_flight = dict.fromkeys(self.deployments, 0)
        self.now = 0.0
        self._busy_since: float | None = None
        self.tally = Tally()

    def slo(self, i: int) -> SloClass:
        """The SLO class of request ``i``."""
        return self.plans[self.trace.cls[i]].slo

    def attempt(self, key: str, i: int) -> Attempt:
        """What request ``i`` would get from ``key`` if sent now (pure: the oracle peeks with it)."""
        dep = self.deployments[key]
        error_rate, _ = dep.incident(self.now)
        if self.trace.u[i, self.index[key]] < error_rate:
            return Attempt(False, 0.0, 0.0, dep.fail_s, request=i)
        return self.attempt_if_ok(key, i)

    def attempt_if_ok(self, key: str, i: int) -> Attempt:
        """The latencies request ``i`` would see on ``key`` now if its attempt did not fail (pure)."""
        d = self.index[key]
        z_ttft, z_tpot = self.trace.z[i, d]
        ttft, tpot = self.latency(key, i, float(z_ttft), float(z_tpot))
        return Attempt(True, ttft, tpot, ttft + tpot * int(self.trace.output_tokens[i]), request=i)

    def latency(self, key: str, i: int, z_ttft: float, z_tpot: float) -> tuple[float, float]:
        """TTFT and TPOT of request ``i`` on ``key`` now, at the given quantiles (standard normal scores)."""
        dep = self.deployments[key]
        _, slow = dep.incident(self.now)
        if dep.engine is not None:
            e, n = dep.engine, self.in_flight[key] + 1
            running = min(n, e.slots)
            tpot = (e.step_s + e.step_per_seq_s * running) * math.exp(dep.tpot_sigma * z_tpot)
            prefill = int(self.trace.input_tokens[i]) * e.prefill_s_per_token * (1 + running / e.slots)
            # Beyond its slots a request waits for one: each queued ahead frees after about a typical
            # answer's decode time divided by the slots decoding in parallel.
            wait = max(0, n - e.slots) * tpot * TYPICAL_OUTPUT / e.slots
            ttft = (prefill + tpot + wait) * math.exp(dep.ttft_sigma * z_ttft)
        else:
            ttft = dep.ttft_s * math.exp(dep.ttft_sigma * z_ttft) * slow
            tpot = dep.tpot_s * math.exp(dep.tpot_sigma * z_tpot) * slow
        return ttft, tpot

    def engine_load(self, key: str) -> EngineLoad:
        """What the engine behind ``key`` reports of its load (its KV cache is 90% used at full slots)."""
        engine = self.deployments[key].engine
        assert engine is not None
        n = self.in_flight[key]
        running = min(n, engine.slots)
        return EngineLoad(waiting=n - running, running=running, kv_free=1.0 - 0.9 * running / engine.slots)

    def meets(self, i: int, ttft: float, tpot: float, total: float) -> bool:
        """Whether request ``i``, answered with these latencies, met its SLO class."""
        slo = self.slo(i)
        if slo.ttft_p95_ms is not None and ttft * 1000 > slo.ttft_p95_ms:
            return False
        if slo.tpot_p95_ms is not None and tpot * 1000 > slo.tpot_p95_ms:
            return False
        return slo.deadline_s is None or total <= slo.deadline_s

    def api_cost(self, key: str, i: int) -> float:
        """List-price cost of a successful answer to request ``i`` from an external API."""
        target = self.targets[key]
        if target.price is None:
            return 0.0
        cost = (
            self.trace.input_tokens[i] * target.price.input + self.trace.output_tokens[i] * target.price.output
        ) / 1e6
        if self.slo(i).deadline_s is not None:
            cost *= 1.0 - target.batch_discount
        return float(cost)

    def gpu_per_s(self, key: str) -> float:
        """The engine's GPU dollars per second (0 for an external API)."""
        config = self.policy.providers[self.targets[key].provider]
        return (config.gpu_dollars_per_hour or 0.0) / 3600.0

    def _load(self, key: str, delta: int) -> None:
        self.in_flight[key] += delta
        if self.deployments[key].engine is None:
            return
        if self.in_flight[key] > 0 and self._busy_since is None:
            self._busy_since = self.now
        elif self.in_flight[key] == 0 and self._busy_since is not None:
            self.tally.engine_cost += (self.now - self._busy_since) * self.gpu_per_s(key)
            self._busy_since = None

    def _push(self, when: float, event: tuple[Any, ...]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, event))

    def run(self, policy: SimPolicy) -> Tally:
        """Route every request of the trace with ``policy`` and account for each (call once)."""
        trace = self.trace
        self._events: list[tuple[float, int, tuple[Any, ...]]] = []
        self._seq = 0
        next_i = 0
        while next_i < trace.arrival.size or self._events:
            if next_i < trace.arrival.size and (not self._events or trace.arrival[next_i] <= self._events[0][0]):
                self.now, i = float(trace.arrival[next_i]), next_i
                next_i += 1
                self._start(policy, i, tuple(policy.order(self, i)), 0, self.now)
                continue
            self.now, _, event = heapq.heappop(self._events)
            kind, i, key = event[0], event[1], event[2]
            if kind == "first_byte":
                policy.first_byte(self, key, event[3])
            elif kind == "done":
                ttft, attempt = event[3], event[4]
                self._load(key, -1)
                policy.done(self, key, attempt)
                self._account(i, key, ttft, attempt)
            else:  # an attempt failed: free its slot, then try the rest of the order
                self._load(key, -1)
                policy.failed(self, key, i)
                self._start(policy, i, event[3], event[4], event[5])
        return self.tally

    def _account(self, i: int, key: str, ttft: float, attempt: Attempt) -> None:
        tally, cls = self.tally, self.trace.cls[i]
        tally.served[cls] = tally.served.get(cls, 0) + 1
        tally.by_deployment[key] = tally.by_deployment.get(key, 0) + 1
        tally.api_cost += self.api_cost(key, i)
        if self.meets(i, ttft, attempt.tpot, self.now - float(self.trace.arrival[i])):
            tally.met[cls] = tally.met.get(cls, 0) + 1

    def _start(self, policy: SimPolicy, i: int, order: tuple[str, ...], tried: int, start: float) -> None:
        """Send request ``i`` to the first deployment of ``order`` that takes it, or count it failed."""
        for pos, key in enumerate(order):
            if tried >= MAX_ATTEMPTS:
                break
            cap = self.targets[key].max_concurrency
            if (cap is not None and self.in_flight[key] >= cap) or not policy.admit(self, key, i):
                continue
            attempt = self.attempt(key, i)
            self._load(key, +1)
            policy.started(self, key, i)
            self.tally.attempts += 1
            if not attempt.ok:
                self._push(self.now + attempt.seconds, ("failed", i, key, order[pos + 1 :], tried + 1, start))
                return
            if policy.observes:
                self._push(self.now + attempt.ttft, ("first_byte", i, key, attempt))
            ttft = self.now - start + attempt.ttft  # time lost on failed attempts counts
            self._push(self.now + attempt.seconds, ("done", i, key, ttft, attempt))
            return
        self.tally.failed += 1
        policy.gave_up(self, i)


def summarize(trace: Trace, tally: Tally, span_s: float) -> dict[str, Any]:
    """A policy's figures: attainment (overall and per class), goodput, cost and their ratios."""
    counts = {c: trace.cls.count(c) for c, _ in CLASSES}
    met = sum(tally.met.values())
    cost = tally.api_cost + tally.engine_cost
    goodput = met / span_s
    return {
        "requests": trace.arrival.size,
        "served": sum(tally.served.values()),
        "failed": tally.failed,
        "attempts": tally.attempts,
        "slo_met": met,
        "attainment": met / max(1, trace.arrival.size),
        "attainment_by_class": {c: tally.met.get(c, 0) / max(1, n) for c, n in counts.items()},
        "goodput_rps": goodput,
        "cost_usd": cost,
        "api_cost_usd": tally.api_cost,
        "engine_cost_usd": tally.engine_cost,
        "cost_per_1k_met_usd": 1000 * cost / met if met else None,
        "goodput_per_dollar": goodput / cost if cost > 0 else None,
        "by_deployment": dict(sorted(tally.by_deployment.items())),
    }


def simulate(
    seed: int = 7,
    hours: float = 24.0,
    peak_rps: float = 3.0,
    policies: tuple[str, ...] = POLICIES,
    reserves: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Run every policy over one trace; the results, keyed by policy name, with the run's settings.

    ``reserves`` overrides SLO classes' ``engine_reserve`` in the scenario's policy (for every policy
    run, the oracles' rule included).
    """
    policy = parse_policy(POLICY_YAML, {}, source="bench/routing_sim.py")
    if reserves:
        classes = {
            k: replace(c, engine_reserve=reserves.get(k, c.engine_reserve)) for k, c in policy.slo_classes.items()
        }
        policy = replace(policy, slo_classes=classes)
    trace = make_trace(seed, hours, peak_rps, len(SCENARIO))
    results: dict[str, Any] = {}
    for name in policies:
        sim = Simulation(trace, policy)
        sim_policy = make_policy(name, sim, seed, TYPICAL_OUTPUT)
        began = time.perf_counter()
        tally = sim.run(sim_policy)
        results[name] = summarize(trace, tally, hours * 3600.0) | sim_policy.report()
        results[name]["runtime_s"] = time.perf_counter() - began
    oracle = results.get("oracle", {}).get("goodput_per_dollar")
    for figures in results.values():
        mine = figures["goodput_per_dollar"]
        figures["vs_oracle"] = mine / oracle if oracle and mine else None
    return {
        "seed": seed,
        "hours": hours,
        "peak_rps": peak_rps,
        "requests": int(trace.arrival.size),
        "policies": results,
    }


def render(run: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| policy | SLO met | interactive | standard | batch | failed | goodput req/s | cost $ | $ per 1k met | goodput/$ | vs oracle |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in run["policies"].items():
        by = f["attainment_by_class"]
        per_1k = f"{f['cost_per_1k_met_usd']:.3f}" if f["cost_per_1k_met_usd"] is not None else "-"
        gpd = f"{f['goodput_per_dollar']:.5f}" if f["goodput_per_dollar"] is not None else "-"
        vs = f"{f['vs_oracle']:.1%}" if f["vs_oracle"] is not None else "-"
        lines.append(
            f"| {name} | {f['attainment']:.1%} | {by['interactive']:.1%} | {by['standard']:.1%} | {by['batch']:.1%} "
            f"| {f['failed']} | {f['goodput_rps']:.4f} | {f['cost_usd']:.2f} | {per_1k} | {gpd} | {vs} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the simulation, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (default: a day)")
    parser.add_argument("--peak-rps", type=float, default=3.0, help="arrival rate at the 14:00 peak")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma list; crossway-xN is Crossway on N gateway replicas, crossway-xN-shared with their in-flight counts shared as through Redis (default: the seven of the table)",
    )
    parser.add_argument(
        "--reserve",
        default="",
        help="SLO classes' engine_reserve overriding the scenario policy's, e.g. standard=0.1,batch=0.35",
    )
    args = parser.parse_args(argv)
    reserves = {k: float(v) for k, v in (item.split("=") for item in args.reserve.split(",") if item)}
    began = time.perf_counter()
    run = simulate(args.seed, args.hours, args.peak_rps, tuple(args.policies.split(",")), reserves)
    run["reserves"] = reserves
    run["wall_s"] = time.perf_counter() - began
    run["date"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    run["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    run["scenario"] = {"policy_yaml": POLICY_YAML, "deployments": [repr(d) for d in SCENARIO]}
    print(f"{run['requests']} requests over {args.hours:g} h (seed {args.seed}), {run['wall_s']:.1f} s")
    print(render(run))
    for name, figures in run["policies"].items():
        print(f"{name}: {figures['by_deployment']} {figures.get('reasons', '')}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
