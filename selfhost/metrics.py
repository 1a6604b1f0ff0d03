"""Live engine metrics: gauges, counters, latency histograms and per-step utilisation estimates.

Owns the numbers the gateway's router and ``/metrics`` read: queue depth, running requests, KV
blocks used and free, prefix-cache hit rate (tokens), TTFT and TPOT histograms, tokens per second,
and the estimated model bandwidth and FLOP utilisation (MBU, MFU) of the last step. Does not own
any decision; it only observes what the engine reports.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selfhost.config import EngineConfig, ModelConfig
    from selfhost.kv_cache import KVCacheManager
    from selfhost.request import Request
    from selfhost.scheduler import ScheduledBatch, Scheduler

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_RATE_WINDOW_S = 10.0


@dataclass(slots=True)
class Histogram:
    """Cumulative-bucket histogram in seconds, Prometheus style."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        """Add one observation."""
        index = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[index] += 1
        self.total += value
        self.count += 1

    def mean(self) -> float:
        """Mean of the observations (0 when empty)."""
        return self.total / self.count if self.count else 0.0


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """A consistent copy of the engine's metrics at one moment."""

    num_waiting: int
    num_running: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_used: int
    prefix_cache_query_tokens: int
    prefix_cache_hit_tokens: int
    prefix_cache_hit_rate: float
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    tokens_per_second: float
    """Tokens (prefill and decode) per second over the last 10 seconds."""
    ttft_mean_s: float
    tpot_mean_s: float
    last_step_mbu: float
    """Estimated bytes moved / step time / peak bandwidth, for the last step."""
    last_step_mfu: float
    """Estimated FLOPs / step time / peak FLOP/s, for the last step."""
    ttft: Histogram
    tpot: Histogram


class EngineMetrics:
    """Accumulates what the engine thread reports; ``snapshot`` may be read from any thread (a GIL-atomic copy)."""

    def __init__(
        self, model_cfg: ModelConfig, engine_cfg: EngineConfig, param_bytes: int, kv_bytes_per_token: int
    ) -> None:
        self.engine_cfg = engine_cfg
        self.param_bytes = param_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        # FLOPs per token in the linear layers (2 per weight; the embedding lookup is free)
        self.linear_flops_per_token = 2 * (model_cfg.num_params() - model_cfg.vocab_size * model_cfg.hidden_size)
        if model_cfg.tie_word_embeddings:
            self.linear_flops_per_token += 2 * model_cfg.vocab_size * model_cfg.hidden_size
        self.attn_flops_per_ctx_token = 4 * model_cfg.num_layers * model_cfg.num_heads * model_cfg.head_dim
        self.ttft = Histogram()
        self.tpot = Histogram()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.last_step_mbu = 0.0
        self.last_step_mfu = 0.0
        self._recent: deque[tuple[float, int]] = deque()

    def on_step(self, batch: ScheduledBatch, num_sampled: int, seconds: float) -> None:
        """Record one model step: token counts and the MBU/MFU estimates."""
        now = time.monotonic()
        tokens = batch.total_tokens
        self._recent.append((now, tokens))
        while self._recent and now - self._recent[0][0] > _RATE_WINDOW_S:
            self._recent.popleft()
        self.generation_tokens_total += num_sampled
        starts, counts = batch.starts, batch.num_new_tokens
        self.prompt_tokens_total += batch.num_prompt_tokens
        context = sum(starts) + tokens  # keys attended to
        moved = self.param_bytes + context * self.kv_bytes_per_token
        # query x key pairs (upper bound: causal); a step of one-token rows attends its context once
        attended = context if tokens == len(counts) else sum(n * (s + n) for s, n in zip(starts, counts, strict=True))
        flops = tokens * self.linear_flops_per_token + attended * self.attn_flops_per_ctx_token
        if seconds > 0:
            self.last_step_mbu = moved / seconds / self.engine_cfg.peak_memory_bandwidth
            self.last_step_mfu = flops / seconds / self.engine_cfg.peak_flops

    def on_first_token(self, request: Request) -> None:
        """Record a request's time to first token."""
        if request.first_token_time is not None:
            self.ttft.observe(request.first_token_time - request.arrival_time)

    def on_finish(self, request: Request) -> None:
        """Record a finished request's time per output token."""
        if request.first_token_time is not None and request.num_output_tokens > 1:
            self.tpot.observe((time.monotonic() - request.first_token_time) / (request.num_output_tokens - 1))

    def snapshot(self, scheduler: Scheduler, kv: KVCacheManager) -> MetricsSnapshot:
        """Copy every metric now."""
        free = kv.pool.num_free_blocks()
        total = kv.pool.num_blocks
        recent = list(self._recent)
        span = (time.monotonic() - recent[0][0]) if recent else 0.0
        rate = sum(t for _, t in recent) / span if span > 0 else 0.0
        queried = kv.prefix_query_tokens
        return MetricsSnapshot(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            kv_blocks_total=total,
            kv_blocks_free=free,
            kv_blocks_used=total - free,
            prefix_cache_query_tokens=queried,
            prefix_cache_hit_tokens=kv.prefix_hit_tokens,
            prefix_cache_hit_rate=kv.prefix_hit_tokens / queried if queried else 0.0,
            num_preemptions=scheduler.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            tokens_per_second=rate,
            ttft_mean_s=self.ttft.mean(),
            tpot_mean_s=self.tpot.mean(),
            last_step_mbu=self.last_step_mbu,
            last_step_mfu=self.last_step_mfu,
            ttft=Histogram(self.ttft.buckets, list(self.ttft.counts), self.ttft.total, self.ttft.count),
            tpot=Histogram(self.tpot.buckets, list(self.tpot.counts), self.tpot.total, self.tpot.count),
        )


def render_prometheus(snap: MetricsSnapshot, model: str) -> str:
    """The snapshot in Prometheus text exposition format."""
    label = f'model="{model}"'
    lines: list[str] = []
    gauges = {
        "num_requests_waiting": snap.num_waiting,
        "num_requests_running": snap.num_running,
        "kv_blocks_used": snap.kv_blocks_used,
        "kv_blocks_free": snap.kv_blocks_free,
        "prefix_cache_hit_rate": snap.prefix_cache_hit_rate,
        "tokens_per_second": snap.tokens_per_second,
        "mbu": snap.last_step_mbu,
        "mfu": snap.last_step_mfu,
    }
    counters = {
        "prefix_cache_queries_tokens_total": snap.prefix_cache_query_tokens,
        "prefix_cache_hits_tokens_total": snap.prefix_cache_hit_tokens,
        "num_preemptions_total": snap.num_preemptions,
        "prompt_tokens_total": snap.prompt_tokens_total,
        "generation_tokens_total": snap.generation_tokens_total,
    }
    for name, value in gauges.items():
        lines += [f"# TYPE crossway_engine_{name} gauge", f"crossway_engine_{name}{{{label}}} {value}"]
    for name, value in counters.items():
        lines += [f"# TYPE crossway_engine_{name} counter", f"crossway_engine_{name}{{{label}}} {value}"]
    for name, hist in (("time_to_first_token_seconds", snap.ttft), ("time_per_output_token_seconds", snap.tpot)):
        lines.append(f"# TYPE crossway_engine_{name} histogram")
        cumulative = 0
        for bound, count in zip((*hist.buckets, float("inf")), hist.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'crossway_engine_{name}_bucket{{{label},le="{le}"}} {cumulative}')
        lines += [
            f"crossway_engine_{name}_sum{{{label}}} {hist.total}",
            f"crossway_engine_{name}_count{{{label}}} {hist.count}",
        ]
    return "\n".join(lines) + "\n"
