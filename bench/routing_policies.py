"""The routing policies ``bench.routing_sim`` compares: Crossway's real router, simple baselines, an oracle.

Owns how each policy orders the deployments for one request and what it learns from the outcomes.
Does not own the simulated world (latency, load, billing: ``bench.routing_sim``) or the routing
logic under test (``gateway.router``), which ``Crossway`` calls unchanged.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from gateway.inflight import INTERVAL_S
from gateway.router import Router, Workload, engine_price

if TYPE_CHECKING:
    from collections.abc import Mapping

    from bench.routing_scenario import Deployment
    from bench.routing_sim import Attempt, Simulation

NOMINAL_INPUT, NOMINAL_OUTPUT = 800, 256
Z95 = 1.6449
"""The standard normal score of the 95th percentile."""
"""A typical request, for the static baselines' price and latency rankings."""


class SimPolicy:
    """Orders deployments per request; hooks see each attempt's start, first byte, end and failure."""

    name = "policy"
    observes = False
    """Whether the simulation should report first bytes (only policies that learn need them)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def order(self, sim: Simulation, i: int) -> list[str]:
        """Deployment keys to try for request ``i``, best first."""
        raise NotImplementedError

    def admit(self, sim: Simulation, key: str, i: int) -> bool:
        """Whether an attempt of request ``i`` may go to ``key`` now (a breaker's say)."""
        return True

    def started(self, sim: Simulation, key: str, i: int) -> None:
        """An attempt of request ``i`` went to ``key``."""

    def first_byte(self, sim: Simulation, key: str, attempt: Attempt) -> None:
        """An attempt on ``key`` sent its first token (``attempt.ttft`` seconds after it started)."""

    def done(self, sim: Simulation, key: str, attempt: Attempt) -> None:
        """An attempt on ``key`` finished its answer."""

    def failed(self, sim: Simulation, key: str, i: int) -> None:
        """An attempt of request ``i`` on ``key`` failed."""

    def gave_up(self, sim: Simulation, i: int) -> None:
        """Request ``i`` failed for good: no deployment left to try."""

    def report(self) -> dict[str, object]:
        """Policy-specific figures for the results file."""
        return {}


class Static(SimPolicy):
    """One fixed order for every request (skipping a deployment at its cap, falling over on errors)."""

    def __init__(self, sim: Simulation, name: str, keys: list[str]) -> None:
        super().__init__(sim)
        self.name, self.keys = name, keys

    def order(self, sim: Simulation, i: int) -> list[str]:
        return self.keys


class RoundRobin(SimPolicy):
    """Each request starts at the next deployment in turn."""

    name = "round-robin"

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self.keys, self.turn = list(sim.deployments), 0

    def order(self, sim: Simulation, i: int) -> list[str]:
        self.turn = (self.turn + 1) % len(self.keys)
        return self.keys[self.turn :] + self.keys[: self.turn]


def _nominal(sim: Simulation, dep: Deployment) -> tuple[float, float]:
    """A typical request's price and end-to-end latency on ``dep``; the engine judged half full."""
    target = sim.targets[dep.key]
    if dep.engine is not None:
        half = dep.engine.slots // 2
        tpot = dep.engine.step_s + dep.engine.step_per_seq_s * half
        per_in, per_out = engine_price(sim.policy.providers[target.provider], tpot, half)
        ttft = NOMINAL_INPUT * dep.engine.prefill_s_per_token + tpot
    else:
        price = target.price
        per_in, per_out = (price.input / 1e6, price.output / 1e6) if price is not None else (0.0, 0.0)
        ttft, tpot = dep.ttft_s, dep.tpot_s
    return NOMINAL_INPUT * per_in + NOMINAL_OUTPUT * per_out, ttft + NOMINAL_OUTPUT * tpot


def cheapest(sim: Simulation) -> Static:
    """Always the cheapest by list price (the engine at its half-full price), the next when it is full."""
    return Static(sim, "always-cheapest", sorted(sim.deployments, key=lambda k: _nominal(sim, sim.deployments[k])[0]))


def fastest(sim: Simulation) -> Static:
    """Always the fastest by nominal latency, the next when it is full."""
    return Static(sim, "always-fastest", sorted(sim.deployments, key=lambda k: _nominal(sim, sim.deployments[k])[1]))


def kept_for_others(sim: Simulation, key: str, i: int) -> bool:
    """Whether the engine behind ``key`` is too full for request ``i``: its free KV share is below the reserve
    that request ``i``'s class leaves to the tighter classes.

    The router's rule (``SloClass.engine_reserve``), applied with the engine's true load.
    """
    if sim.deployments[key].engine is None:
        return False
    return sim.engine_load(key).kv_free < sim.slo(i).engine_reserve


class Oracle(SimPolicy):
    """Knows each request's true latency and failure everywhere now; takes the cheapest that meets the SLO.

    With ``max_error`` (``oracle-latency``) it knows the request's latencies but not whether the
    attempt fails, only each deployment's true error rate now, and passes over one whose rate is
    above ``max_error``; a failed attempt falls over to the next, as the router's do.

    It keeps the engine's last slots for the tighter classes as the router does (``kept_for_others``):
    filling them with batch work, a greedy chooser, however clairvoyant, sends later interactive
    requests to dearer APIs. ``greedy=True`` is the oracle without that rule (``oracle-greedy``).
    """

    name = "oracle"

    def __init__(self, sim: Simulation, *, greedy: bool = False, max_error: float | None = None) -> None:
        super().__init__(sim)
        self.greedy = greedy
        self.max_error = max_error
        if greedy:
            self.name = "oracle-greedy"
        if max_error is not None:
            self.name = "oracle-latency"

    def order(self, sim: Simulation, i: int) -> list[str]:
        options = []
        for key, dep in sim.deployments.items():
            cap = sim.targets[key].max_concurrency
            if cap is not None and sim.in_flight[key] >= cap:
                continue
            if self.max_error is None:
                attempt = sim.attempt(key, i)
                if not attempt.ok:
                    continue
            else:
                attempt = sim.attempt_if_ok(key, i)
                if dep.incident(sim.now)[0] > self.max_error:
                    attempt = replace(attempt, ok=False)
            meets = attempt.ok and sim.meets(i, attempt.ttft, attempt.tpot, attempt.seconds)
            meets = meets and (self.greedy or not kept_for_others(sim, key, i))
            options.append((not meets, self.cost(sim, key, i, attempt.tpot), key))
        return [key for *_, key in sorted(options)]

    @staticmethod
    def cost(sim: Simulation, key: str, i: int, tpot: float) -> float:
        """Request ``i``'s cost on ``key``: list price, or the engine's share of its GPU at ``tpot`` now."""
        config = sim.policy.providers[sim.targets[key].provider]
        if config.gpu_dollars_per_hour is None:
            return sim.api_cost(key, i)
        # Priced like the router prices it (at its provisioned batch): priced at its current batch, an
        # idle engine looks dearest and a greedy chooser, even a clairvoyant one, never fills it.
        cap = sim.targets[key].max_concurrency or 1
        per_in, per_out = engine_price(config, tpot, max(sim.in_flight[key], cap - 1))
        return float(sim.trace.input_tokens[i] * per_in + sim.trace.output_tokens[i] * per_out)


class OracleP95(SimPolicy):
    """Knows each deployment's true latency distribution and error rate now, not the request's own draw.

    It applies the router's rule with perfect statistics: the cheapest deployment whose true p95s meet
    the SLO and whose error rate is at most a half (and the engine's reserves for tighter classes, as
    ``Oracle``), else the one with the lowest p95 TTFT. The gap from
    ``crossway`` to it is what learning from samples costs; the gap from it to ``oracle`` is what
    judging by p95 instead of by each request's luck costs.
    """

    name = "oracle-p95"

    def order(self, sim: Simulation, i: int) -> list[str]:
        out = int(sim.trace.output_tokens[i])
        options = []
        for key, dep in sim.deployments.items():
            cap = sim.targets[key].max_concurrency
            if cap is not None and sim.in_flight[key] >= cap:
                continue
            error_rate, _ = dep.incident(sim.now)
            ttft, tpot = sim.latency(key, i, Z95, Z95)
            _, tpot_mid = sim.latency(key, i, 0.0, 0.0)
            meets = error_rate <= 0.5 and sim.meets(i, ttft, tpot, ttft + tpot * out)
            meets = meets and not kept_for_others(sim, key, i)
            options.append((not meets, Oracle.cost(sim, key, i, tpot_mid) if meets else ttft, key))
        return [key for *_, key in sorted(options)]


class Crossway(SimPolicy):
    """The gateway's own ``Router``, fed what a dispatcher would observe, on the simulation's clock.

    With ``replicas`` > 1, that many gateway processes behind a round-robin load balancer: request
    ``i`` goes to replica ``i % replicas``, and each replica's router learns only from its own
    requests (its statistics, in-flight counts and breakers), as ``gateway.stats`` keeps them. The
    engine's own load report reaches every replica. With ``shared``, the replicas also learn each
    other's in-flight counts every ``gateway.inflight.INTERVAL_S`` of simulated time, as
    ``gateway.inflight`` syncs them through Redis, and their concurrency caps count them.
    """

    observes = True

    def __init__(
        self, sim: Simulation, seed: int, typical_output: int, replicas: int = 1, *, shared: bool = False
    ) -> None:
        super().__init__(sim)
        self.name = ("crossway" if replicas == 1 else f"crossway-x{replicas}") + ("-shared" if shared else "")
        self.shared = shared
        self._synced = -math.inf
        self.routers = [Router(sim.policy.routing, rng=random.Random(seed + r)) for r in range(replicas)]
        for router in self.routers:
            router.breakers.clock = lambda: sim.now
        self.typical_output = typical_output
        self.reasons: Counter[str] = Counter()
        self._judged: dict[int, Mapping[str, int]] = {}
        """Per request in flight, the engine loads its decision was judged at (``Decision.loads``)."""
        self._loads: dict[int, int] = {}
        """Per request, the load its current attempt's samples are filed under, as gateway.dispatch does."""

    def _router(self, i: int) -> Router:
        return self.routers[i % len(self.routers)]

    def _sync(self, sim: Simulation) -> None:
        """Each replica's view of the others' requests in flight, refreshed once an interval."""
        if sim.now - self._synced < INTERVAL_S:
            return
        self._synced = sim.now
        for key in sim.deployments:
            total = sum(router.stats[key].in_flight for router in self.routers)
            for router in self.routers:
                router.stats[key].elsewhere = total - router.stats[key].in_flight

    def order(self, sim: Simulation, i: int) -> list[str]:
        if self.shared:
            self._sync(sim)
        plan = sim.plans[sim.trace.cls[i]]
        work = Workload(int(sim.trace.input_tokens[i]), self.typical_output)
        loads = {key: sim.engine_load(key) for key, dep in sim.deployments.items() if dep.engine is not None}
        decision = self._router(i).decide(plan, work, sim.policy.providers, loads=loads)
        self.reasons[decision.reason] += 1
        self._judged[i] = decision.loads
        return [t.key for t in decision.order]

    def admit(self, sim: Simulation, key: str, i: int) -> bool:
        return self._router(i).breakers[key].acquire(sim.now)

    def started(self, sim: Simulation, key: str, i: int) -> None:
        stats = self._router(i).stats[key]
        stats.in_flight += 1
        self._loads[i] = self._judged[i].get(key, stats.in_flight)

    # As gateway.dispatch does: the first byte is the verdict (success, TTFT sample, breaker closed);
    # the stream's end brings its TPOT.
    def first_byte(self, sim: Simulation, key: str, attempt: Attempt) -> None:
        router = self._router(attempt.request)
        router.stats.record(key, ttft=attempt.ttft, ok=True, load=self._loads[attempt.request])
        if router.breakers[key].success():
            router.stats[key].recovered()

    def done(self, sim: Simulation, key: str, attempt: Attempt) -> None:
        router = self._router(attempt.request)
        router.stats[key].in_flight -= 1
        router.stats.record(key, tpot=attempt.tpot, ok=None, load=self._loads.pop(attempt.request))
        del self._judged[attempt.request]

    def failed(self, sim: Simulation, key: str, i: int) -> None:
        router = self._router(i)
        router.stats[key].in_flight -= 1
        self._loads.pop(i, None)
        router.stats.record(key, ok=False)
        router.breakers[key].failure(sim.now)

    def gave_up(self, sim: Simulation, i: int) -> None:
        del self._judged[i]

    def report(self) -> dict[str, object]:
        return {"reasons": dict(sorted(self.reasons.items()))}


POLICIES = ("crossway", "round-robin", "always-cheapest", "always-fastest", "oracle-p95", "oracle-greedy", "oracle")
"""The table's policies; ``make_policy`` also takes ``crossway-xN[-shared]`` and ``oracle-latency``."""


def make_policy(name: str, sim: Simulation, seed: int, typical_output: int) -> SimPolicy:
    """Build one of ``POLICIES`` over ``sim``, or ``crossway-xN[-shared]``: Crossway on N gateway replicas."""
    if name == "crossway":
        return Crossway(sim, seed, typical_output)
    if name.startswith("crossway-x"):
        count, shared = name.removeprefix("crossway-x").removesuffix("-shared"), name.endswith("-shared")
        if count.isdigit():
            return Crossway(sim, seed, typical_output, replicas=int(count), shared=shared)
    if name == "round-robin":
        return RoundRobin(sim)
    if name == "always-cheapest":
        return cheapest(sim)
    if name == "always-fastest":
        return fastest(sim)
    if name == "oracle":
        return Oracle(sim)
    if name == "oracle-greedy":
        return Oracle(sim, greedy=True)
    if name == "oracle-p95":
        return OracleP95(sim)
    if name == "oracle-latency":
        # NOTE(hsim): 0.5, the strongest of 0, 0.25 and 0.5 on seed 7 (goodput/$ 0.02031, 0.02031, 0.02038)
        return Oracle(sim, max_error=0.5)
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
