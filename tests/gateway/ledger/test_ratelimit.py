from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from gateway.errors import RateLimited
from gateway.ledger import Limits
from gateway.ledger.budget import MemoryCounters, RedisCounters
from gateway.ledger.gate import Settlement, gate_for
from gateway.ledger.ratelimit import MemoryCounts, RateLimiter, RedisCounts, Rule, verdict
from gateway.policy import Plan, Price, Target
from tests.gateway.ledger.conftest import ACME
from tests.gateway.ledger.helpers import make_ledger, rows

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gateway.ledger.gate import Gate
    from gateway.ledger.ratelimit import Charged, Counts


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


T0 = 1_800_000_000.0  # a window boundary (divisible by 60)


class Rates:
    """Rate rules charged as the ledger charges them: ``RateLimiter.ask``, then the gate's one step."""

    def __init__(self, counts: Counts, gate: Gate) -> None:
        self.counts, self.gate = counts, gate

    def limiter(self, clock: Callable[[], float]) -> RateLimiter:
        return RateLimiter(self.counts, clock)

    async def acquire(self, limiter: RateLimiter, rules: Sequence[Rule], tokens: int) -> Charged:
        """The standing after charging, or ``RateLimited`` (with ``retry_after``) when a rule refuses."""
        ask = limiter.ask(rules, tokens)
        outcome = await self.gate.admit(ask, None)
        return verdict(ask, outcome.rates_ok, outcome.before)

    async def settle(self, charged: Charged, tokens: int) -> None:
        await self.gate.settle([Settlement(charged, tokens, None, 0)])


@pytest.fixture(params=["memory", "redis"])
async def rates(request: pytest.FixtureRequest, redis_prefix):
    """In process, or in the real Redis behind this replica's leases (the gateway's two set-ups)."""
    client, prefix = redis_prefix
    if request.param == "memory":
        gate = gate_for(counts := MemoryCounts(), MemoryCounters())
    else:
        gate = gate_for(counts := RedisCounts(client, f"{prefix}:rl"), RedisCounters(client, f"{prefix}:budget"))
    yield Rates(counts, gate)
    await gate.aclose()


async def test_requests_per_minute_refuses_the_extra_request_with_retry_after(rates) -> None:
    clock = Clock(T0 + 30)
    limiter = rates.limiter(clock)
    rules = [Rule("t:acme", "requests", 3)]
    for _ in range(3):
        await rates.acquire(limiter, rules, 0)
    with pytest.raises(RateLimited) as info:
        await rates.acquire(limiter, rules, 0)
    assert info.value.status_code == 429
    # this minute alone is full: wait 30 s for it to end, then for a third of it to decay (3 -> 2)
    assert info.value.retry_after == pytest.approx(30 + 20)
    assert info.value.code == "rate_limit_requests"


async def test_sliding_window_counts_last_minute_weighted_by_its_overlap(rates) -> None:
    clock = Clock(T0 + 10)
    limiter = rates.limiter(clock)
    rules = [Rule("k:1", "requests", 4)]
    for _ in range(4):
        await rates.acquire(limiter, rules, 0)
    clock.now = T0 + 60 + 30  # next minute, half way: last minute counts 4 * 0.5 = 2
    await rates.acquire(limiter, rules, 0)
    await rates.acquire(limiter, rules, 0)
    with pytest.raises(RateLimited):
        await rates.acquire(limiter, rules, 0)
    clock.now = T0 + 60 + 46  # 4 * (14/60) + 2 = 2.93: one more fits
    charged = await rates.acquire(limiter, rules, 0)
    assert charged.headers()["x-ratelimit-remaining-requests"] == "0"


async def test_tokens_per_minute_charges_estimate_and_settles_to_actual(rates) -> None:
    clock = Clock(T0 + 5)
    limiter = rates.limiter(clock)
    rules = [Rule("t:acme", "tokens", 1000)]
    first = await rates.acquire(limiter, rules, 800)
    with pytest.raises(RateLimited):
        await rates.acquire(limiter, rules, 300)
    await rates.settle(first, 100)  # it used far less than its estimate
    second = await rates.acquire(limiter, rules, 300)
    headers = second.headers()
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "600"


async def test_request_larger_than_the_token_limit_is_refused_without_retry_after(rates) -> None:
    limiter = rates.limiter(Clock(T0))
    with pytest.raises(RateLimited) as info:
        await rates.acquire(limiter, [Rule("t:acme", "tokens", 100)], 101)
    assert info.value.retry_after is None
    assert info.value.code == "tokens_exceed_limit"


async def test_refusal_by_one_rule_charges_no_other_rule(rates) -> None:
    limiter = rates.limiter(Clock(T0 + 1))
    tenant, key = Rule("t:acme", "requests", 10), Rule("k:1", "requests", 1)
    await rates.acquire(limiter, [tenant, key], 0)
    with pytest.raises(RateLimited):
        await rates.acquire(limiter, [tenant, key], 0)
    charged = await rates.acquire(limiter, [tenant], 0)
    assert charged.headers()["x-ratelimit-remaining-requests"] == "8"  # 2 charged, not 3


async def test_ledger_applies_key_limits_and_records_the_refusal(sqlite_db) -> None:
    ledger = make_ledger(sqlite_db, rate_clock=Clock(T0 + 1))
    await ledger.start()
    await ledger.limits.put(Limits("acme", key_id=ACME.key_id, rpm=1))
    plan = Plan("gpt-test", (Target("openai", "gpt-4o-mini", price=Price(1, 1)),))

    async def admit(rid: str):
        return await ledger.admit(ACME, plan, request_id=rid, endpoint="chat.completions", started=time.perf_counter(),
                                  streamed=False, input_tokens=lambda: 10, max_output_tokens=10)  # fmt: skip

    admission, _ = await admit("ok")
    assert admission.headers()["x-ratelimit-limit-requests"] == "1"
    with pytest.raises(RateLimited):
        await admit("limited")
    await ledger.aclose()
    assert [(r.request_id, r.status) for r in await rows(sqlite_db) if r.request_id == "limited"] == [("limited", 429)]


async def test_headers_name_the_tightest_rule_in_openai_and_anthropic_styles(rates) -> None:
    limiter = rates.limiter(Clock(T0 + 15))
    charged = await rates.acquire(limiter, [Rule("t:acme", "requests", 100), Rule("k:1", "requests", 5)], 0)
    openai_style = charged.headers()
    assert openai_style == {
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "4",
        "x-ratelimit-reset-requests": "1m45s",  # what was charged now leaves the window at the end of next minute
    }
    anthropic_style = charged.headers("anthropic")
    assert anthropic_style["anthropic-ratelimit-requests-limit"] == "5"
    assert anthropic_style["anthropic-ratelimit-requests-remaining"] == "4"
    assert anthropic_style["anthropic-ratelimit-requests-reset"] == "2027-01-15T08:02:00Z"  # T0 + 15 s + 105 s
