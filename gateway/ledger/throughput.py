"""A self-hosted engine's measured throughput, and the per-token price that follows from its GPU cost.

Owns, per engine deployment and per gateway replica, the requests it served over a trailing window
(when each started and ended, how many tokens it produced), its throughput (output tokens per second
in which it had at least one request: the union of the requests' intervals, so a batch of concurrent
requests shares the same seconds), and the price of a token at that throughput: the GPU's dollars
per second divided by tokens per second, with prompt tokens at ``prefill_cost_ratio`` of an output
token (as ``gateway.router.engine_price`` prices them for routing). Does not own where the GPU cost
is configured (``ProviderSpec.gpu_dollars_per_hour``) nor cost arithmetic (``gateway.ledger.record``).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from gateway.policy import Price

if TYPE_CHECKING:
    from collections.abc import Iterable


class Served(NamedTuple):
    """One request an engine served: its interval (``time.perf_counter`` seconds) and output tokens."""

    start: float
    end: float
    tokens: int


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``[start, end]`` intervals."""
    total, reach = 0.0, -float("inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


class Throughput:
    """Output tokens per busy second of each engine deployment over the last ``window_s`` seconds.

    Args:
        window_s: How far back requests count (by their end).
    """

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self._served: dict[str, deque[Served]] = {}

    def observe(self, key: str, start: float, end: float, tokens: int) -> None:
        """Count one request that ``key`` served from ``start`` to ``end`` (ends arrive in about that order)."""
        if tokens <= 0 or end <= start:
            return
        served = self._served.setdefault(key, deque())
        served.append(Served(start, end, tokens))
        while served and served[0].end < end - self.window_s:
            served.popleft()

    def tokens_per_s(self, key: str) -> float | None:
        """Measured throughput, or ``None`` before ``key`` served anything."""
        served = self._served.get(key)
        if not served:
            return None
        busy = busy_seconds((s.start, s.end) for s in served)
        return sum(s.tokens for s in served) / busy if busy > 0 else None


def engine_token_price(gpu_dollars_per_hour: float, tokens_per_s: float, prefill_cost_ratio: float) -> Price:
    """Dollars per million tokens when a GPU costing ``gpu_dollars_per_hour`` produces ``tokens_per_s``."""
    output = gpu_dollars_per_hour / 3600.0 / tokens_per_s * 1e6
    return Price(input=output * prefill_cost_ratio, output=output)
