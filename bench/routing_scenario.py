"""The world ``bench.routing_sim`` simulates: its deployments, their policy, and a day of requests.

Owns the scenario (four deployments of one alias with their latency distributions, prices, capacity
and incidents), the policy YAML the router reads for it, and the seeded trace generator. Does not
own the simulation's mechanics (``bench.routing_sim``) or the policies compared (``bench.routing_policies``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CLASSES = (("interactive", 0.35), ("standard", 0.45), ("batch", 0.20))

POLICY_YAML = """
providers:
  local: {kind: openai, base_url: "http://engine:8000/v1", api_key_required: false, gpu_dollars_per_hour: 3.0}
  budget: {kind: openai, base_url: "http://budget/v1", api_key_required: false}
  mid: {kind: openai, base_url: "http://mid/v1", api_key_required: false}
  premium: {kind: openai, base_url: "http://premium/v1", api_key_required: false}
models:
  chat:
    targets:
      - {provider: local, model: llama, max_concurrency: 40}
      - {provider: budget, model: llama, price: {input: 0.5, output: 1.5}, batch_discount: 0.5, max_concurrency: 32}
      - {provider: mid, model: llama, price: {input: 1.0, output: 3.0}, max_concurrency: 64}
      - {provider: premium, model: llama, price: {input: 3.0, output: 9.0}, max_concurrency: 64}
slo_classes:
  interactive: {ttft_p95_ms: 800, tpot_p95_ms: 60}
  standard: {ttft_p95_ms: 2500, tpot_p95_ms: 100, engine_reserve: 0.2}
  batch: {deadline_s: 86400, engine_reserve: 0.45}
default_slo_class: standard
routing: {explore_share: 0.01, breaker_failures: 5, breaker_cooldown_s: 30}
"""


@dataclass(frozen=True, slots=True)
class Incident:
    """A period (hours of the day) in which a deployment fails a share of attempts or slows down."""

    start_h: float
    end_h: float
    error_rate: float = 0.0
    slow: float = 1.0


@dataclass(frozen=True, slots=True)
class Engine:
    """The engine's latency model: decode step = ``step_s + step_per_seq_s * running``."""

    slots: int
    step_s: float
    step_per_seq_s: float
    prefill_s_per_token: float


@dataclass(frozen=True, slots=True)
class Deployment:
    """True behaviour of one deployment: lognormal TTFT and TPOT around their medians, and incidents."""

    key: str
    ttft_s: float
    ttft_sigma: float
    tpot_s: float
    tpot_sigma: float
    fail_s: float = 1.0
    """How long a failed attempt takes to come back."""
    engine: Engine | None = None
    incidents: tuple[Incident, ...] = ()

    def incident(self, now: float) -> tuple[float, float]:
        """Error rate and slow-down factor at simulated second ``now``."""
        hour = (now / 3600.0) % 24.0
        for i in self.incidents:
            if i.start_h <= hour < i.end_h:
                return i.error_rate, i.slow
        return 0.0, 1.0


SCENARIO = (
    Deployment(
        "local/llama", 0.0, 0.15, 0.0, 0.12, fail_s=0.01,
        engine=Engine(slots=24, step_s=0.015, step_per_seq_s=0.0012, prefill_s_per_token=30e-6),
        incidents=(Incident(3.0, 3.34, error_rate=1.0),),  # a restart: connections refused for 20 minutes
    ),
    Deployment("budget/llama", 0.7, 0.55, 0.03, 0.35, incidents=(Incident(20.0, 21.0, slow=2.0),)),
    Deployment("mid/llama", 0.3, 0.35, 0.022, 0.25, incidents=(Incident(9.0, 10.5, error_rate=0.5),)),
    Deployment("premium/llama", 0.18, 0.25, 0.01, 0.2, incidents=(Incident(13.0, 15.0, slow=4.0),)),
)  # fmt: skip


@dataclass(slots=True)
class Trace:
    """Requests, in arrival order, with the random draws every policy shares."""

    arrival: np.ndarray
    cls: list[str]
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    z: np.ndarray
    """Standard normals ``(n, deployment, 2)``: where this request's TTFT and TPOT fall on each deployment."""
    u: np.ndarray
    """Uniforms ``(n, deployment)``: whether an attempt fails during an error incident."""


def make_trace(seed: int, hours: float, peak_rps: float, deployments: int) -> Trace:
    """A non-homogeneous Poisson day (thinning): quiet at night, peaking at 14:00 at ``peak_rps``."""
    rng = np.random.default_rng(seed)
    span = hours * 3600.0
    candidates = np.cumsum(rng.exponential(1.0 / peak_rps, size=int(span * peak_rps * 1.2) + 16))
    candidates = candidates[candidates < span]
    shape = 0.25 + 0.75 * (0.5 - 0.5 * np.cos(2 * np.pi * ((candidates / 3600.0 - 2.0) % 24.0) / 24.0))
    arrival = candidates[rng.random(candidates.size) < shape]
    n = arrival.size
    names = [c for c, _ in CLASSES]
    cls = [names[i] for i in rng.choice(len(CLASSES), size=n, p=[w for _, w in CLASSES])]
    inputs = np.clip(rng.lognormal(math.log(800), 0.8, n), 50, 8000).astype(int)
    outputs = np.clip(rng.lognormal(math.log(200), 0.7, n), 10, 2000).astype(int)
    z = rng.standard_normal((n, deployments, 2))
    return Trace(arrival, cls, inputs, outputs, z, rng.random((n, deployments)))
