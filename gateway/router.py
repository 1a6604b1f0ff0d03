"""The routing decision: for one request, rank the deployments of its plan by SLO and price.

``route`` is a pure function of the plan, what is observed of each deployment and two random
draws: it predicts each candidate's TTFT and TPOT (p95 of recent samples, or an optimistic prior
while a deployment has too few), drops those that would miss the request's SLO class or cannot take
it (breaker open, at its concurrency cap), and picks the cheapest of the rest. When none qualifies it
picks the one most likely to meet the SLO. A deployment whose breaker is half-open is judged without
its error rate: its one probe says whether it is back. A request leaves a filling engine's last KV
share (its class's ``engine_reserve``: by default a deadline-only class's) to the tighter classes,
whose alternatives cost more. A small share of requests explores another usable candidate so that
statistics stay fresh, dearer candidates less often in proportion to their price. Prompts sharing a
prefix go to the same self-hosted replica while it has headroom (rendezvous hashing over the
replicas that qualify).

``Router`` holds the live state (``gateway.stats``, ``gateway.breaker``) and calls ``route``.
Does not own calling anyone (``gateway.dispatch``) or the policy's schema (``gateway.policy``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.breaker import Breakers
from gateway.stats import Observed, Stats

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.breaker import State
    from gateway.policy import Plan, ProviderConfig, RoutingOptions, Target
    from gateway.stats import EngineLoad

MIN_SAMPLES = 5
"""Below this many samples a deployment is judged by the prior, not by its quantiles."""
PRIOR_TTFT_S = 0.5
PRIOR_TPOT_S = 0.02
"""Optimistic priors: a deployment nobody has measured gets tried, and its samples then speak."""
AFFINITY_HEADROOM = 0.8
"""A replica keeps its prefix's traffic until it is this full (in flight / concurrency cap)."""
KV_RESERVE = 0.05
"""An engine with less KV cache free than this would queue a new request rather than start it."""
EXPLORE_FLOOR = 0.05
"""The least share of its exploration a dearer candidate keeps, however much dearer it is."""


@dataclass(frozen=True, slots=True)
class Workload:
    """What the request asks for, in tokens: the basis of its predicted cost and decode time."""

    input_tokens: int
    output_tokens: int
    """Expected output: ``max_tokens`` when given, else a typical answer length."""
    prefix_key: str | None = None
    """Hash of the prompt's stable prefix, for affinity; ``None`` for no affinity."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment as the router judged it (what ``/admin/route/explain`` shows)."""

    target: Target
    ttft_s: float
    """Predicted p95 time to first token."""
    tpot_s: float
    """Predicted p95 time per output token."""
    cost_usd: float
    """Predicted cost of this request on this deployment."""
    p_meet: float
    """Estimated probability of meeting the SLO (and not failing)."""
    usable: bool
    """Not behind an open breaker and under its concurrency cap."""
    qualified: bool
    """Usable and predicted to meet the SLO."""
    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The targets to try, in order, and why the first was chosen."""

    order: tuple[Target, ...]
    reason: str
    """``cheapest-meeting-slo``, ``best-effort``, ``explore``, ``prefix-affinity`` or ``unusable``."""
    candidates: tuple[Candidate, ...]
    loads: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per self-hosted target that reported its load: the load it was judged at (its running and
    waiting requests, and this one). The dispatcher files the attempt's samples under it."""


def engine_price(config: ProviderConfig, tpot_s: float, running: int) -> tuple[float, float]:
    """Dollars per input and per output token of a self-hosted engine at its current load.

    A decode step serves every running sequence at once, so the GPU-seconds of one output token are
    the step time (TPOT) shared by the sequences in the batch, this request included.
    """
    dollars_per_s = (config.gpu_dollars_per_hour or 0.0) / 3600.0
    output = dollars_per_s * tpot_s / (running + 1)
    return output * config.prefill_cost_ratio, output


def _judge(
    target: Target,
    observed: Observed,
    breaker: State,
    plan: Plan,
    workload: Workload,
    providers: Mapping[str, ProviderConfig],
) -> Candidate:
    slo = plan.slo
    known = observed.samples >= MIN_SAMPLES
    ttft = observed.ttft_p95 if known and observed.ttft_p95 is not None else PRIOR_TTFT_S
    tpot = observed.tpot_p95 if known and observed.tpot_p95 is not None else PRIOR_TPOT_S
    if observed.engine is not None and observed.engine.waiting:
        # Queued requests start as running ones finish: each one ahead costs about one more prefill.
        ttft += observed.engine.waiting * (observed.ttft_p50 if known and observed.ttft_p50 else PRIOR_TTFT_S)
    config = providers[target.provider]
    if config.gpu_dollars_per_hour is not None:
        tpot_mid = observed.tpot_p50 if known and observed.tpot_p50 is not None else PRIOR_TPOT_S
        # NOTE(hsim): an engine with a concurrency cap is priced at the batch it is provisioned for, not at
        # the one it has: priced at its current batch, an idle engine looks the dearest deployment, gets
        # no traffic and so stays idle (bench/routing_sim.py: 1% of a day's requests while it was the
        # cheapest at load). Its latency, not its price, then says when it is full.
        batch = max(observed.in_flight, (target.max_concurrency or 1) - 1)
        per_in, per_out = engine_price(config, tpot_mid, batch)
    elif target.price is not None:
        # Cache hits are a bonus the router does not count on: prompts are priced as uncached input.
        per_in, per_out = target.price.input / 1e6, target.price.output / 1e6
    else:
        per_in = per_out = 0.0
    cost = workload.input_tokens * per_in + workload.output_tokens * per_out
    if slo.deadline_s is not None:
        cost *= 1.0 - target.batch_discount
    # Probability of meeting the SLO: the shares of recent samples within each objective, discounted
    # by the error rate. Unmeasured deployments get the benefit of the doubt.
    p_meet = 1.0 - observed.error_rate
    if known and observed.ttft_share_within is not None:
        p_meet *= observed.ttft_share_within
    if known and observed.tpot_share_within is not None:
        p_meet *= observed.tpot_share_within
    if slo.deadline_s is not None:
        total = ttft + tpot * workload.output_tokens
        if total > slo.deadline_s:
            p_meet = 0.0
    at_cap = target.max_concurrency is not None and observed.held >= target.max_concurrency
    if breaker == "open":
        reason, usable = "breaker open", False
    elif at_cap:
        reason, usable = f"at concurrency cap ({target.max_concurrency})", False
    else:
        usable, reason = True, "breaker half-open: probing" if breaker == "half_open" else ""
    misses = []
    if slo.ttft_p95_ms is not None and ttft * 1000 > slo.ttft_p95_ms:
        misses.append(f"TTFT p95 {ttft * 1000:.0f} ms > {slo.ttft_p95_ms:.0f} ms")
    if slo.tpot_p95_ms is not None and tpot * 1000 > slo.tpot_p95_ms:
        misses.append(f"TPOT p95 {tpot * 1000:.0f} ms > {slo.tpot_p95_ms:.0f} ms")
    if slo.deadline_s is not None and ttft + tpot * workload.output_tokens > slo.deadline_s:
        misses.append(f"would finish after the {slo.deadline_s:.0f} s deadline")
    if observed.engine is not None and observed.engine.kv_free < KV_RESERVE:
        misses.append(f"KV cache {observed.engine.kv_free:.0%} free")
    elif observed.engine is not None and observed.engine.kv_free < slo.engine_reserve:
        misses.append(f"KV cache {observed.engine.kv_free:.0%} free, kept for tighter classes")
    if observed.error_rate > 0.5 and breaker != "half_open":
        # Half-open, its breaker's one probe decides whether it is back (``Breaker``); judged by the
        # failures that opened the breaker, it would never be sent that probe.
        misses.append(f"error rate {observed.error_rate:.0%}")
    qualified = usable and not misses
    if usable and misses:
        reason = "; ".join(misses)
    return Candidate(target, ttft, tpot, cost, p_meet, usable, qualified, reason)


def _rendezvous(prefix_key: str, target: Target) -> bytes:
    return hashlib.blake2b(f"{prefix_key}|{target.key}".encode(), digest_size=8).digest()


def route(
    plan: Plan,
    observed: Mapping[str, Observed],
    breakers: Mapping[str, State],
    workload: Workload,
    providers: Mapping[str, ProviderConfig],
    options: RoutingOptions,
    draws: tuple[float, float],
) -> Decision:
    """Rank ``plan``'s targets for one request (pure: the same inputs give the same decision).

    Args:
        plan: the alias's targets, fallbacks and the request's SLO class.
        observed: per ``target.key``, what is known now (missing: nothing measured yet).
        breakers: per ``target.key``, the breaker's state (missing: closed).
        workload: the request's size and prefix.
        providers: provider configs (self-hosted engines price their tokens from their GPU cost).
        options: the policy's routing options (exploration share).
        draws: two numbers in [0, 1): whether to explore, and which candidate to explore.
    """
    judged = [
        _judge(t, observed.get(t.key, Observed()), breakers.get(t.key, "closed"), plan, workload, providers)
        for t in plan.targets
    ]
    qualified = sorted((c for c in judged if c.qualified), key=lambda c: (c.cost_usd, c.ttft_s))
    hopeful = sorted(
        (c for c in judged if c.usable and not c.qualified), key=lambda c: (-c.p_meet, c.cost_usd, c.ttft_s)
    )
    unusable = [c for c in judged if not c.usable]
    ranked = qualified + hopeful
    reason = "cheapest-meeting-slo" if qualified else "best-effort" if hopeful else "unusable"
    if qualified and workload.prefix_key is not None:
        engines = [c for c in qualified if providers[c.target.provider].gpu_dollars_per_hour is not None]
        # NOTE(hsim): the home is chosen among the replicas with headroom, but affinity applies whenever an
        # engine is the cheapest: a fuller replica prices lower (engine_price), so requiring the cheapest to
        # have headroom too would keep a prefix on its full home instead of moving it.
        roomy = [c for c in engines if _has_headroom(c, observed.get(c.target.key, Observed()))]
        if roomy and any(ranked[0] is c for c in engines):
            key = workload.prefix_key
            home = max(roomy, key=lambda c: _rendezvous(key, c.target))
            if home is not ranked[0]:
                ranked.remove(home)
                ranked.insert(0, home)
                reason = "prefix-affinity"
    explore_draw, pick_draw = draws
    if len(ranked) > 1 and explore_draw < options.explore_share:
        pick = _explored(ranked, pick_draw, explore_draw / options.explore_share)
        if pick is not None:
            ranked.remove(pick)
            ranked.insert(0, pick)
            reason = "explore"
    first = ranked[0].target if ranked else None
    candidates = tuple(_explained(c, reason, first) for c in judged)
    order = tuple(c.target for c in ranked) + tuple(c.target for c in unusable) + plan.fallbacks
    return Decision(order, reason, candidates)


def _explored(ranked: list[Candidate], pick_draw: float, accept_draw: float) -> Candidate | None:
    """The candidate to explore instead of ``ranked[0]``, or ``None`` to explore nothing this time.

    Every other usable candidate is drawn with equal chance, and a dearer one is then kept only in
    proportion to how much less the choice costs (never below ``EXPLORE_FLOOR``).
    """
    # NOTE(hsim): exploring a cheaper candidate can find money (it may qualify again); exploring a dearer
    # one only refreshes statistics for when it is needed, and pays the price difference on every try.
    # Uniform exploration sent a third of its tries to the premium API (bench/routing_sim.py).
    others = ranked[1:]
    pick = others[min(len(others) - 1, int(pick_draw * len(others)))]
    base = ranked[0].cost_usd
    weight = 1.0 if pick.cost_usd <= base else max(EXPLORE_FLOOR, base / pick.cost_usd)
    return pick if accept_draw < weight else None


def _has_headroom(candidate: Candidate, observed: Observed) -> bool:
    cap = candidate.target.max_concurrency
    return cap is None or observed.held < AFFINITY_HEADROOM * cap


def _explained(candidate: Candidate, reason: str, first: Target | None) -> Candidate:
    """The candidate with its reason said in full: chosen and why, or why it was passed over."""
    if candidate.target == first:
        note = f"chosen: {reason}" + (f" ({candidate.reason})" if candidate.reason else "")
    elif candidate.qualified:
        note = "qualifies; not chosen"
    else:
        note = candidate.reason
    return Candidate(
        candidate.target,
        candidate.ttft_s,
        candidate.tpot_s,
        candidate.cost_usd,
        candidate.p_meet,
        candidate.usable,
        candidate.qualified,
        note,
    )


class Router:
    """The live side of routing: statistics, breakers and randomness, around the pure ``route``."""

    def __init__(self, options: RoutingOptions, rng: random.Random | None = None) -> None:
        self.options = options
        self.stats = Stats(options.stats_window)
        self.breakers = Breakers(options.breaker_failures, options.breaker_cooldown_s)
        self.rng = rng or random.Random()  # noqa: S311 - exploration, not security

    def reconfigure(self, options: RoutingOptions) -> None:
        """Take an edited policy's options; statistics and breaker states carry over."""
        self.options = options
        self.breakers.configure(options.breaker_failures, options.breaker_cooldown_s)

    def decide(
        self,
        plan: Plan,
        workload: Workload,
        providers: Mapping[str, ProviderConfig],
        *,
        loads: Mapping[str, EngineLoad] | None = None,
        explore: bool = True,
    ) -> Decision:
        """Rank ``plan``'s targets now (``explore=False``: never explore, as ``explain`` shows the policy's choice)."""
        slo = plan.slo
        ttft_limit = slo.ttft_p95_ms / 1000 if slo.ttft_p95_ms is not None else None
        tpot_limit = slo.tpot_p95_ms / 1000 if slo.tpot_p95_ms is not None else None
        keys = {t.key for t in plan.targets}
        loads = {k: v for k, v in (loads or {}).items() if k in keys}
        # An engine's latency follows its load: judge it by the samples taken at the load this request
        # would start at (``DeploymentStats.observed``). NOTE(hsim): the load is the engine's own count
        # where it reports one, not this replica's in-flight count: behind N gateway replicas a
        # replica sees about 1/N of the engine's load and judged it by too light a band (in
        # bench/routing_sim.py, with 2 and 4 replicas, SLO met fell from 99.9 % to 99.6 and 99.5 %
        # and goodput per dollar by 5 and 13-15 %; with the engine's count, 98.0-100.2 % of one replica's).
        engines = {t.key for t in plan.targets if providers[t.provider].gpu_dollars_per_hour is not None}
        judged = {k: load.running + load.waiting + 1 for k, load in loads.items() if k in engines}
        observed = {
            k: self.stats[k].observed(
                ttft_limit,
                tpot_limit,
                load=judged.get(k, self.stats[k].in_flight + 1) if k in engines else None,
            )
            for k in keys
        }
        for key, load in loads.items():
            observed[key] = dataclasses.replace(observed[key], engine=load)
        breakers = {k: self.breakers.state(k) for k in keys}
        draws = (self.rng.random(), self.rng.random()) if explore else (1.0, 0.0)
        decision = route(plan, observed, breakers, workload, providers, self.options, draws)
        return dataclasses.replace(decision, loads=judged)
