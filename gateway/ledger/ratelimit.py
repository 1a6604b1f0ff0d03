"""Requests and tokens per minute, per tenant and per key, with ``Retry-After`` and ``x-ratelimit-*``.

Owns the sliding-window counters (this minute's count plus last minute's, weighted by how much of
last minute still lies inside the 60 s window; Cloudflare's approximation, exact at window edges and
within a few percent in between), the atomic check-and-charge over every rule of a request, the
retry delay of a refusal and the response headers. Tokens are charged at admission as the prompt
estimate plus the allowed output, then corrected to the actual count when the request ends. In
process (the embedded default) ``MemoryCounts`` checks and charges; with Redis, the counts live
under the keys ``RedisCounts`` names, shared by the replicas, and the lease script
(``gateway.ledger.lease_script``) checks and charges them. Does not own where the limits are
configured (``gateway.ledger.limits``) or the order of a request's checks (``gateway.ledger.gate``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from gateway.errors import RateLimited

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from redis.asyncio import Redis

WINDOW_S = 60
Kind = Literal["requests", "tokens"]
HeaderStyle = Literal["openai", "anthropic"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One limit: at most ``limit`` requests (or tokens) per minute for ``scope`` (``t:<tenant>``, ``k:<id>``)."""

    scope: str
    kind: Kind
    limit: int


class MemoryCounts:
    """In-process counters (the embedded default); each call runs without awaiting, hence atomically."""

    def __init__(self) -> None:
        self._c: dict[str, list[int]] = {}  # key -> [window, this window's count, previous window's count]

    def _get(self, key: str, window: int) -> list[int]:
        c = self._c.get(key)
        if c is None:
            c = self._c[key] = [window, 0, 0]
        elif c[0] != window:
            c[2] = c[1] if c[0] == window - 1 else 0
            c[0], c[1] = window, 0
        return c

    async def charge(self, keys: Sequence[str], window: int, weight: float, checks: Sequence[tuple[int, int]]) -> tuple[bool, list[tuple[int, int]]]:  # fmt: skip
        """Charge ``cost`` to each key's count in ``window`` if every ``(limit, cost)`` check passes.

        Returns:
            Whether charged, and each key's ``(this window, previous window)`` counts before charging.
        """
        counts = [self._get(k, window) for k in keys]
        before = [(c[1], c[2]) for c in counts]
        ok = all(prev * weight + cur + cost <= limit for (cur, prev), (limit, cost) in zip(before, checks, strict=True))
        if ok:
            for c, (_, cost) in zip(counts, checks, strict=True):
                c[1] += cost
        return ok, before

    async def adjust(self, key: str, window: int, delta: int) -> None:
        """Add ``delta`` (may be negative) to a key's count in ``window``."""
        c = self._c.get(key)
        if c is not None and c[0] == window:
            c[1] += delta


class RedisCounts:
    """Counters in Redis strings ``<prefix>:<key>:<window>``, shared by every replica.

    Names the keys and holds the client; the lease script reads and charges them.
    """

    def __init__(self, redis: Redis, prefix: str = "crossway:rl") -> None:
        self._redis = redis
        self._prefix = prefix

    def key(self, key: str, window: int) -> str:
        """The Redis key of ``key``'s count in ``window``."""
        return f"{self._prefix}:{key}:{window}"

    @property
    def redis(self) -> Redis:
        """The client the counts live behind."""
        return self._redis


Counts = MemoryCounts | RedisCounts
"""Where the per-minute counts live: in this process, or in Redis."""


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one rule stands after a request was admitted (for the ``x-ratelimit-*`` headers)."""

    rule: Rule
    remaining: int
    reset_s: float
    """Seconds until everything counted now has left the window."""


@dataclass(slots=True)
class Charged:
    """What an admitted request was charged, so that ``settle`` can correct its tokens."""

    window: int
    token_keys: list[str] = field(default_factory=list)
    tokens: int = 0
    standings: list[Standing] = field(default_factory=list)
    at: float = 0.0
    """Wall-clock seconds when it was charged (what ``Standing.reset_s`` counts from)."""

    def headers(self, style: HeaderStyle = "openai") -> dict[str, str]:
        """The rate-limit headers of the tightest rule per kind, in OpenAI's or Anthropic's names.

        OpenAI: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, the reset as a duration
        (``1s``, ``6m0s``). Anthropic: ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``,
        the reset as an RFC 3339 time.
        """
        out: dict[str, str] = {}
        for kind in ("requests", "tokens"):
            mine = [s for s in self.standings if s.rule.kind == kind]
            if not mine:
                continue
            tightest = min(mine, key=lambda s: s.remaining)
            if style == "openai":
                out[f"x-ratelimit-limit-{kind}"] = str(tightest.rule.limit)
                out[f"x-ratelimit-remaining-{kind}"] = str(tightest.remaining)
                out[f"x-ratelimit-reset-{kind}"] = _duration(tightest.reset_s)
            else:
                reset = datetime.fromtimestamp(math.ceil(self.at + tightest.reset_s), UTC)
                out[f"anthropic-ratelimit-{kind}-limit"] = str(tightest.rule.limit)
                out[f"anthropic-ratelimit-{kind}-remaining"] = str(tightest.remaining)
                out[f"anthropic-ratelimit-{kind}-reset"] = reset.strftime("%Y-%m-%dT%H:%M:%SZ")
        return out


def _duration(seconds: float) -> str:
    """A duration as OpenAI writes it in ``x-ratelimit-reset-*``: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.3g}s" if minutes else f"{rest:.3g}s"


@dataclass(frozen=True, slots=True)
class Ask:
    """One request's charge against its rules, computed before the counters are asked (``RateLimiter.ask``)."""

    rules: tuple[Rule, ...]
    keys: tuple[str, ...]
    """``<scope>:<kind>`` per rule: the counter each rule charges."""
    costs: tuple[int, ...]
    """1 per requests rule, the token estimate per tokens rule."""
    tokens: int
    window: int
    """The current minute (wall-clock seconds // 60)."""
    elapsed: float
    """Seconds into the current minute."""

    @property
    def weight(self) -> float:
        """The share of last minute still inside the sliding 60 s window."""
        return 1.0 - self.elapsed / WINDOW_S

    def checks(self) -> list[tuple[int, int]]:
        """``(limit, cost)`` per rule, as ``MemoryCounts.charge`` takes them."""
        return [(r.limit, c) for r, c in zip(self.rules, self.costs, strict=True)]


def verdict(ask: Ask, ok: bool, before: Sequence[tuple[int, int]]) -> Charged:
    """The outcome of a charge: what was charged (with the standings for the headers), or the refusal.

    Args:
        ask: The charge asked for.
        ok: Whether the counters charged it.
        before: Each rule's ``(this window, previous window)`` counts before charging.

    Raises:
        RateLimited: ``ok`` is false; ``retry_after`` is when the tightest refusing rule would admit it.
    """
    weight, elapsed = ask.weight, ask.elapsed
    if not ok:
        waits = [
            (_wait(rule.limit, cost, cur, prev, elapsed), rule)
            for rule, cost, (cur, prev) in zip(ask.rules, ask.costs, before, strict=True)
            if prev * weight + cur + cost > rule.limit
        ]
        wait, rule = max(waits, key=lambda w: w[0])
        standing = Charged(ask.window, at=ask.window * WINDOW_S + elapsed)  # nothing was charged
        for r, (cur, prev) in zip(ask.rules, before, strict=True):
            reset = (WINDOW_S - elapsed) + (WINDOW_S if cur else 0.0) if (cur or prev) else 0.0
            standing.standings.append(Standing(r, max(0, math.floor(r.limit - prev * weight - cur)), reset))
        raise RateLimited(
            f"Rate limit reached for `{rule.scope}`: {rule.limit} {rule.kind} per minute. Try again in {wait:.1f}s.",
            retry_after=wait,
            code=f"rate_limit_{rule.kind}",
            headers_for=standing.headers,
        )
    charged = Charged(
        ask.window,
        [k for k, r in zip(ask.keys, ask.rules, strict=True) if r.kind == "tokens"],
        ask.tokens,
        at=ask.window * WINDOW_S + elapsed,
    )
    for rule, cost, (cur, prev) in zip(ask.rules, ask.costs, before, strict=True):
        used = prev * weight + cur + cost
        reset = (WINDOW_S - elapsed) + (WINDOW_S if cur + cost else 0.0) if (cur + cost or prev) else 0.0
        charged.standings.append(Standing(rule, max(0, math.floor(rule.limit - used)), reset))
    return charged


class RateLimiter:
    """Turns a request's rules into an ``Ask`` in the current minute (``gateway.ledger.gate`` charges it).

    Args:
        counts: Where the per-minute counts live (``MemoryCounts`` or ``RedisCounts``).
        clock: Wall-clock seconds (windows are aligned to it, so replicas agree); injectable for tests.
    """

    def __init__(self, counts: Counts, clock: Callable[[], float] = time.time) -> None:
        self._counts = counts
        self._clock = clock

    @property
    def counts(self) -> Counts:
        """Where the per-minute counts live."""
        return self._counts

    def ask(self, rules: Sequence[Rule], tokens: int) -> Ask:
        """What charging one request and ``tokens`` against ``rules`` now means, before asking the counters.

        Raises:
            RateLimited: the request alone is larger than a rule allows (no ``retry_after``: it never fits).
        """
        now = self._clock()
        window = int(now // WINDOW_S)
        elapsed = now - window * WINDOW_S
        costs = [1 if r.kind == "requests" else tokens for r in rules]
        for rule, cost in zip(rules, costs, strict=True):
            if cost > rule.limit:
                raise RateLimited(
                    f"Request too large for `{rule.scope}`: {cost} {rule.kind} per minute asked, limit {rule.limit}.",
                    code=f"{rule.kind}_exceed_limit",
                )
        return Ask(tuple(rules), tuple(f"{r.scope}:{r.kind}" for r in rules), tuple(costs), tokens, window, elapsed)


def _wait(limit: int, cost: int, cur: int, prev: int, elapsed: float) -> float:
    """Seconds until a request of ``cost`` fits under ``limit`` if nothing else is charged meanwhile."""
    if cur + cost > limit:  # this minute alone is too full: wait for it to become "last minute" and decay
        decay = WINDOW_S * (1 - (limit - cost) / cur) if cur else 0.0
        return (WINDOW_S - elapsed) + max(decay, 0.0)
    return max(WINDOW_S * (1 - (limit - cur - cost) / prev) - elapsed, 0.0) if prev else 0.0
