"""The admission gate: every rate rule and budget scope of a request in one atomic step, or nothing."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from gateway.errors import BudgetExceeded, RateLimited
from gateway.ledger import Limits
from gateway.ledger.budget import MemoryCounters, RedisCounters, period_of
from gateway.ledger.gate import MemoryGate, Reservation, Settlement, gate_for
from gateway.ledger.lease import LeasedGate
from gateway.ledger.ratelimit import MemoryCounts, RateLimiter, RedisCounts, Rule, verdict
from gateway.policy import Plan, Price, Target
from gateway.types import Usage
from tests.gateway.ledger.conftest import ACME, REDIS_URL
from tests.gateway.ledger.helpers import make_ledger

T0 = 1_800_000_000.0 + 6  # 6 s into a minute
PERIOD = "2026-11"


def _clock() -> float:
    return T0


@pytest.fixture(params=["memory", "redis"])
async def parts(request: pytest.FixtureRequest, redis_prefix):
    """(counts, budgets, gate): in process, or both in the real Redis behind this replica's leases.

    Where a test reads the counters themselves, it closes the gate first: a lease gate then gives
    its unused slices back and sends its waiting settlements (a memory gate holds nothing).
    """
    client, prefix = redis_prefix
    if request.param == "memory":
        counts, budgets = MemoryCounts(), MemoryCounters()
    else:
        counts, budgets = RedisCounts(client, f"{prefix}:rl"), RedisCounters(client, f"{prefix}:budget")
    gate = gate_for(counts, budgets)
    yield counts, budgets, gate
    await gate.aclose()  # a second close gives back nothing more


async def test_gate_for_admits_in_process_or_from_leases_and_refuses_mixed_counters(redis_prefix) -> None:
    client, prefix = redis_prefix
    assert isinstance(gate_for(MemoryCounts(), MemoryCounters()), MemoryGate)
    assert isinstance(gate_for(RedisCounts(client, prefix), RedisCounters(client, prefix)), LeasedGate)
    with pytest.raises(ValueError, match="must both be in process or both in one Redis"):
        gate_for(MemoryCounts(), RedisCounters(client, prefix))
    with pytest.raises(ValueError, match="must both be in process or both in one Redis"):
        gate_for(RedisCounts(client, prefix), MemoryCounters())
    other = Redis.from_url(REDIS_URL)
    try:
        with pytest.raises(ValueError, match="must both be in process or both in one Redis"):
            gate_for(RedisCounts(client, prefix), RedisCounters(other, prefix))
    finally:
        await other.aclose()


async def test_gate_admits_charging_every_rule_and_reserving_every_scope(parts) -> None:
    counts, budgets, gate = parts
    limiter = RateLimiter(counts, _clock)
    ask = limiter.ask([Rule("t:a", "requests", 5), Rule("t:a", "tokens", 1000), Rule("k:1", "requests", 2)], 300)
    reservation = Reservation((("t:a", 10_000), ("k:1", None)), PERIOD, 700)
    outcome = await gate.admit(ask, reservation)
    assert outcome.rates_ok
    assert outcome.refused is None
    assert outcome.before == [(0, 0), (0, 0), (0, 0)]
    assert outcome.states == [(0, 700), (0, 700)]
    charged = verdict(ask, outcome.rates_ok, outcome.before)
    assert charged.headers()["x-ratelimit-remaining-requests"] == "1"  # the key's rule is the tightest
    assert charged.headers()["x-ratelimit-remaining-tokens"] == "700"
    await gate.aclose()
    assert await budgets.state("t:a", PERIOD) == (0, 700)
    assert await budgets.state("k:1", PERIOD) == (0, 700)


async def test_gate_rate_refusal_charges_and_reserves_nothing(parts) -> None:
    counts, budgets, gate = parts
    limiter = RateLimiter(counts, _clock)
    rules = [Rule("t:a", "requests", 10), Rule("k:1", "requests", 1)]
    assert (await gate.admit(limiter.ask(rules, 0), None)).rates_ok
    reservation = Reservation((("t:a", 10_000),), PERIOD, 100)
    refused = await gate.admit(limiter.ask(rules, 0), reservation)
    assert not refused.rates_ok
    assert refused.before == [(1, 0), (1, 0)]
    with pytest.raises(RateLimited):
        verdict(limiter.ask(rules, 0), refused.rates_ok, refused.before)
    assert await budgets.state("t:a", PERIOD) == (0, 0)
    again = await gate.admit(limiter.ask(rules[:1], 0), None)
    assert again.before == [(1, 0)]  # the refused request was not counted against the tenant


async def test_gate_budget_refusal_charges_no_rate_rule(parts) -> None:
    counts, budgets, gate = parts
    limiter = RateLimiter(counts, _clock)
    rules = [Rule("t:a", "requests", 10), Rule("t:a", "tokens", 1000)]
    tight = Reservation((("t:a", 1_000), ("k:1", 50)), PERIOD, 60)
    outcome = await gate.admit(limiter.ask(rules, 400), tight)
    assert outcome.rates_ok
    assert outcome.refused is not None
    assert (outcome.refused.scope, outcome.refused.hard) == ("k:1", 50)
    assert await budgets.state("t:a", PERIOD) == (0, 0)
    after = await gate.admit(limiter.ask(rules, 400), None)
    assert after.before == [(0, 0), (0, 0)]


async def test_gate_settle_moves_reserved_to_spent_and_corrects_tokens(parts) -> None:
    counts, budgets, gate = parts
    limiter = RateLimiter(counts, _clock)
    rules = [Rule("t:a", "tokens", 1000)]
    reservation = Reservation((("t:a", 10_000),), PERIOD, 700)
    ask = limiter.ask(rules, 800)
    outcome = await gate.admit(ask, reservation)
    await gate.settle([Settlement(verdict(ask, outcome.rates_ok, outcome.before), 120, reservation, 333)])
    assert (await gate.admit(limiter.ask(rules, 0), None)).before == [(120, 0)]
    await gate.aclose()
    assert await budgets.state("t:a", PERIOD) == (333, 0)


async def test_ledger_over_redis_races_within_budget_and_rate_limits(sqlite_db, redis_prefix) -> None:
    """100 concurrent requests against an RPM of 30 and a budget of 50 worst cases, all in one Redis."""
    client, prefix = redis_prefix
    ledger = make_ledger(
        sqlite_db,
        budgets=RedisCounters(client, f"{prefix}:budget"),
        counts=RedisCounts(client, f"{prefix}:rl"),
        rate_clock=_clock,
    )
    assert isinstance(ledger.gate, LeasedGate)
    await ledger.start()
    price = Price(input=1.0, output=2.0)
    plan = Plan("gpt-test", (Target("openai", "gpt-4o-mini", price=price),))
    worst = round((100 * 1.0 + 100 * 2.0) * 1000)
    await ledger.limits.put(Limits("acme", rpm=30, budget_hard_usd=50 * worst / 1e9))
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            admission, _ = await ledger.admit(
                ACME, plan, request_id=f"r{i}", endpoint="chat.completions", started=time.perf_counter(),
                streamed=False, input_tokens=lambda: 100, max_output_tokens=100,
            )  # fmt: skip
        except RateLimited:
            outcomes.append("429")
            return
        except BudgetExceeded:
            outcomes.append("402")
            return
        outcomes.append("200")
        ledger.finish(admission, target=plan.targets[0], status=200, usage=Usage(100, 100))

    await asyncio.gather(*(one(i) for i in range(100)))
    await ledger.aclose()
    spent, reserved = await ledger.budgets.state("t:acme", period_of(datetime.now(UTC)))
    assert outcomes.count("200") == 30
    assert outcomes.count("429") == 70
    assert (spent, reserved) == (30 * worst, 0)


async def test_gate_settles_many_requests_in_one_step(parts) -> None:
    counts, budgets, gate = parts
    limiter = RateLimiter(counts, _clock)
    settlements = []
    for scope, tokens, actual in (("t:a", 30, 100), ("t:b", 5, 40), ("t:a", 0, 0)):
        reservation = Reservation(((scope, 10_000), ("k:9", None)), PERIOD, 500)
        ask = limiter.ask([Rule(scope, "tokens", 1000)], 200)
        outcome = await gate.admit(ask, reservation)
        settlements.append(Settlement(verdict(ask, outcome.rates_ok, outcome.before), tokens, reservation, actual))
    await gate.settle(settlements)
    assert (await gate.admit(limiter.ask([Rule("t:a", "tokens", 1000)], 0), None)).before == [(30, 0)]
    assert (await gate.admit(limiter.ask([Rule("t:b", "tokens", 1000)], 0), None)).before == [(5, 0)]
    await gate.aclose()
    assert await budgets.state("t:a", PERIOD) == (100, 0)
    assert await budgets.state("t:b", PERIOD) == (40, 0)
    assert await budgets.state("k:9", PERIOD) == (140, 0)  # the key scope of all three
