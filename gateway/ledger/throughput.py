"""A self-hosted engine's measured throughput, and the per-token price that follows from its GPU cost.

Owns, per engine deployment and per gateway replica, the requests it served over a trailing window
(when each started and ended, how many tokens it produced), its throughput (output tokens per second
in which it had at least one request: the union of the requests' intervals, so a batch of concurrent
requests shares the same seconds), and the price of a token at that throughput: the GPU's dollars
per second divided by tokens per second, with prompt tokens at ``prefill_cost_ratio`` of an output
token (as ``gateway.router.engine_price`` prices them for routing). Does not own where the GPU cost
is configured (``ProviderSpec.gpu_dollars_per_hour``) nor cost arithmetic (``gateway.ledger.record``).

Cost: the union is kept up to date as requests come and go (``BusyTime``), so pricing a request reads
two running sums. Requests reach it in about the order they end (the ledger observes a request when
it finishes); in that order each one costs O(1) amortized, and one that arrives late costs a walk over
the intervals after it (and, when it leaves the window before those, one rebuild of the union).
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


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``[start, end]`` intervals as disjoint intervals, by start (touching ones are merged)."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``[start, end]`` intervals."""
    return sum(end - start for start, end in merged(intervals))


class BusyTime:
    """One engine's requests in the window and the union of their intervals, kept as they come and go.

    Requests leave in the order they came (``expire``), as ``Throughput`` drops them. The union is a
    deque of disjoint intervals sorted by start, with its length as a running sum. Not thread-safe:
    the ledger calls it from the event loop only.
    """

    def __init__(self) -> None:
        self.served: deque[Served] = deque()
        """The requests in the window, in the order they came."""
        self.tokens = 0
        """Their output tokens."""
        self.seconds = 0.0
        """The length of the union of their intervals."""
        self._union: deque[tuple[float, float]] = deque()
        # Sliding minima of the served requests' starts and ends: (value, arrival number), values
        # increasing; the front is the minimum. ``_first`` is the arrival number of ``served[0]``.
        self._starts: deque[tuple[float, int]] = deque()
        self._ends: deque[tuple[float, int]] = deque()
        self._first = 0
        self._changes = 0
        """Changes to ``seconds`` since it was last summed afresh (to keep float error from adding up)."""

    def add(self, start: float, end: float, tokens: int) -> None:
        """Count a request served from ``start`` to ``end`` (``start < end``)."""
        number = self._first + len(self.served)
        self.served.append(Served(start, end, tokens))
        self.tokens += tokens
        for minima, value in ((self._starts, start), (self._ends, end)):
            while minima and minima[-1][0] >= value:
                minima.pop()
            minima.append((value, number))
        # Merge into the union from the right: in order, the new interval reaches only its last parts.
        after: list[tuple[float, float]] = []
        union = self._union
        while union and union[-1][0] > end:  # entirely after the new interval: it came late
            after.append(union.pop())
        while union and union[-1][1] >= start:
            s, e = union.pop()
            self.seconds -= e - s
            start, end = min(start, s), max(end, e)
        union.append((start, end))
        self.seconds += end - start
        union.extend(reversed(after))
        self._changed()

    def expire(self, before: float) -> None:
        """Drop the oldest requests while the oldest ended before ``before`` (the window's start)."""
        served = self.served
        rebuild = False
        while served and served[0].end < before:
            gone = served.popleft()
            self.tokens -= gone.tokens
            for minima in (self._starts, self._ends):
                if minima[0][1] == self._first:
                    minima.popleft()
            self._first += 1
            if not served:
                self._union.clear()
                self.seconds, rebuild = 0.0, False
            elif rebuild or gone.end > self._ends[0][0]:
                rebuild = True  # a later request ended first: the rest cannot be told from the union
            else:
                # NOTE: every remaining request ends at or after ``gone``, so inside ``gone`` they cover
                # exactly [their earliest start, gone.end]: what only ``gone`` covered is the union's
                # part before min(earliest start, gone.end), and nothing else.
                self._cut(min(self._starts[0][0], gone.end))
        if rebuild:
            self._union = deque(merged((s.start, s.end) for s in served))
            self._resum()

    def _cut(self, at: float) -> None:
        """Drop the union's part before ``at``."""
        union = self._union
        while union and union[0][0] < at:
            s, e = union.popleft()
            if e > at:
                union.appendleft((at, e))
                self.seconds -= at - s
                break
            self.seconds -= e - s
        self._changed()

    def _changed(self) -> None:
        self._changes += 1
        if self._changes > len(self._union):  # amortized O(1): at most one term summed per change
            self._resum()

    def _resum(self) -> None:
        self.seconds = sum(e - s for s, e in self._union)
        self._changes = 0


class Throughput:
    """Output tokens per busy second of each engine deployment over the last ``window_s`` seconds.

    Args:
        window_s: How far back requests count (by their end).
    """

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self._busy: dict[str, BusyTime] = {}

    def observe(self, key: str, start: float, end: float, tokens: int) -> None:
        """Count one request that ``key`` served from ``start`` to ``end`` (ends arrive in about that order).

        Requests that ended more than ``window_s`` before ``end`` leave the window, oldest first,
        until one that has not (so one that came late stays until those before it have left).
        """
        if tokens <= 0 or end <= start:
            return
        busy = self._busy.get(key)
        if busy is None:
            busy = self._busy[key] = BusyTime()
        busy.add(start, end, tokens)
        busy.expire(end - self.window_s)

    def tokens_per_s(self, key: str) -> float | None:
        """Measured throughput, or ``None`` before ``key`` served anything."""
        busy = self._busy.get(key)
        if busy is None or not busy.served:
            return None
        return busy.tokens / busy.seconds if busy.seconds > 0 else None


def engine_token_price(gpu_dollars_per_hour: float, tokens_per_s: float, prefill_cost_ratio: float) -> Price:
    """Dollars per million tokens when a GPU costing ``gpu_dollars_per_hour`` produces ``tokens_per_s``."""
    output = gpu_dollars_per_hour / 3600.0 / tokens_per_s * 1e6
    return Price(input=output * prefill_cost_ratio, output=output)
