"""Live statistics per deployment: what the router predicts latency and failure from.

Owns, per deployment (``provider/model``) and per gateway replica: windows of recent TTFT and TPOT
samples with their quantiles (also kept per band of load, for engines whose latency follows their
batch: the engine's own count where it reports one, else this replica's in-flight count), an
exponentially weighted error rate, and the count of requests in flight (this replica's, and the
other replicas' as ``gateway.inflight`` last read them). Does not own decisions
(``gateway.router``) or breakers (``gateway.breaker``).

NOTE(hsim): statistics are per replica, not shared through Redis. Every replica sees a sample of the
same traffic, so its quantiles converge to the same values; sharing would put a Redis round trip on
every request's path for little gain. Only the in-flight counts are shared, off that path, for
concurrency caps (``gateway.inflight``). What a replica cannot see is the others' load: an engine's
samples are filed, and looked up, by the load the engine itself reports (``Decision.loads``), not
by this replica's in-flight count. With that, two and four replicas behind round-robin reached
98-100 % of one replica's goodput per dollar in bench/routing_sim.py (``crossway-x2``, ``-x4``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass


class Window:
    """The last ``size`` samples of one measure, with quantiles over them."""

    def __init__(self, size: int) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._sorted: list[float] | None = []

    def add(self, value: float) -> None:
        """Record one sample (seconds)."""
        self._samples.append(value)
        self._sorted = None

    def __len__(self) -> int:
        return len(self._samples)

    def _ordered(self) -> list[float]:
        if self._sorted is None:  # sorted lazily: routing reads far more often than samples arrive
            self._sorted = sorted(self._samples)
        return self._sorted

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank), or ``None`` with no samples."""
        ordered = self._ordered()
        if not ordered:
            return None
        # Nearest rank is ceil(q * n); round() would take banker's rounding and read under the quantile.
        # The epsilon keeps float noise (0.07 * 100 = 7.000000000000001) from skipping a rank.
        rank = math.ceil(q * len(ordered) - 1e-9)
        return ordered[min(len(ordered) - 1, max(0, rank - 1))]

    def share_at_most(self, limit: float) -> float | None:
        """Share of samples ``<= limit``, or ``None`` with no samples."""
        ordered = self._ordered()
        if not ordered:
            return None
        return bisect.bisect_right(ordered, limit) / len(ordered)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """A self-hosted engine's own view of its load, as of its latest step."""

    waiting: int
    running: int
    kv_free: float
    """Share of KV-cache blocks free, 0..1."""


@dataclass(frozen=True, slots=True)
class Observed:
    """What is known of one deployment right now; the router's input. Times in seconds."""

    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    error_rate: float = 0.0
    in_flight: int = 0
    samples: int = 0
    ttft_share_within: float | None = None
    """Share of recent TTFTs within the SLO asked about (``None``: no samples or no TTFT objective)."""
    engine: EngineLoad | None = None
    """For a self-hosted engine whose load is known: its queue and free KV cache."""
    tpot_share_within: float | None = None
    elsewhere: int = 0
    """Requests in flight to it from the other gateway replicas, as last read (``gateway.inflight``)."""

    @property
    def held(self) -> int:
        """Requests in flight to it from every replica: what its concurrency cap counts."""
        return self.in_flight + self.elsewhere


LOAD_BAND = 4
"""Width of the in-flight bands a deployment's samples are also kept by (loads 1-4, 5-8, ...)."""
MIN_BAND_SAMPLES = 5
"""A band judges a load only once it holds this many samples; until then the whole window does."""


def load_band(load: int) -> int:
    """The band of an attempt that started with ``load`` requests in flight (itself included)."""
    return (max(load, 1) - 1) // LOAD_BAND


class DeploymentStats:
    """The statistics of one deployment."""

    ERROR_DECAY = 0.1
    """Weight of the newest outcome in the error rate: about the last 10 outcomes matter."""

    def __init__(self, window: int) -> None:
        self.ttft = Window(window)
        self.tpot = Window(window)
        self.error_rate = 0.0
        self.in_flight = 0
        self.elsewhere = 0
        """Requests in flight from the other replicas, as ``gateway.inflight`` last read them (0 without Redis)."""
        self.outcomes = 0
        self._window = window
        self.by_load: dict[int, tuple[Window, Window]] = {}
        """TTFT and TPOT windows per load band, for deployments whose latency follows their load (engines)."""

    @property
    def held(self) -> int:
        """Requests in flight to it from every replica: what its concurrency cap counts."""
        return self.in_flight + self.elsewhere

    def add(self, *, ttft: float | None = None, tpot: float | None = None, load: int | None = None) -> None:
        """Record latency samples; with ``load`` (in flight when the attempt started), in its band too."""
        band = None
        if load is not None:
            band = self.by_load.get(load_band(load))
            if band is None:
                band = self.by_load[load_band(load)] = (Window(self._window), Window(self._window))
        if ttft is not None:
            self.ttft.add(ttft)
            if band is not None:
                band[0].add(ttft)
        if tpot is not None:
            self.tpot.add(tpot)
            if band is not None:
                band[1].add(tpot)

    def outcome(self, ok: bool) -> None:
        """Fold one success or failure into the error rate."""
        self.outcomes += 1
        self.error_rate += self.ERROR_DECAY * ((0.0 if ok else 1.0) - self.error_rate)

    def recovered(self) -> None:
        """Its breaker's probe succeeded: the failures that opened it say nothing about it now.

        Without this, a deployment back from an outage stays behind its error rate, and only the few
        requests that explore it would ever bring that rate down.
        """
        self.error_rate = 0.0

    def observed(
        self, ttft_limit: float | None = None, tpot_limit: float | None = None, *, load: int | None = None
    ) -> Observed:
        """A snapshot, with the share of samples within the given limits.

        Args:
            ttft_limit: TTFT objective (seconds) whose share of samples to report.
            tpot_limit: TPOT objective (seconds) whose share of samples to report.
            load: judge the samples taken at this load (its band), when the band holds enough of them.
                For a self-hosted engine, whose latency follows its batch and queue, this keeps samples
                from a burst that overloaded it from condemning it once it is idle again, and stops
                traffic at the load where its latency broke before.
        """
        ttft, tpot = self.ttft, self.tpot
        band = self.by_load.get(load_band(load)) if load is not None else None
        if band is not None:
            ttft = band[0] if len(band[0]) >= MIN_BAND_SAMPLES else ttft
            tpot = band[1] if len(band[1]) >= MIN_BAND_SAMPLES else tpot
        return Observed(
            ttft_p50=ttft.quantile(0.5),
            ttft_p95=ttft.quantile(0.95),
            tpot_p50=tpot.quantile(0.5),
            tpot_p95=tpot.quantile(0.95),
            error_rate=self.error_rate,
            in_flight=self.in_flight,
            elsewhere=self.elsewhere,
            samples=len(ttft),
            ttft_share_within=ttft.share_at_most(ttft_limit) if ttft_limit is not None else None,
            tpot_share_within=tpot.share_at_most(tpot_limit) if tpot_limit is not None else None,
        )


class Stats:
    """Statistics of every deployment this replica has used, created on first mention."""

    def __init__(self, window: int = 200) -> None:
        self.window = window
        self._by_key: dict[str, DeploymentStats] = {}

    def __getitem__(self, key: str) -> DeploymentStats:
        stats = self._by_key.get(key)
        if stats is None:
            stats = self._by_key[key] = DeploymentStats(self.window)
        return stats

    def keys(self) -> list[str]:
        """Deployments seen so far."""
        return sorted(self._by_key)

    def record(
        self,
        key: str,
        *,
        ttft: float | None = None,
        tpot: float | None = None,
        ok: bool | None = True,
        load: int | None = None,
    ) -> None:
        """One attempt's latencies (when measured) and whether it succeeded.

        Args:
            key: the deployment.
            ttft: time to its first token, seconds.
            tpot: time per output token, seconds.
            ok: its verdict; ``None`` when it was already counted (a stream's TPOT at its end).
            load: requests in flight on the deployment when the attempt started, itself included.
        """
        stats = self[key]
        stats.add(ttft=ttft, tpot=tpot, load=load)
        if ok is not None:
            stats.outcome(ok)
