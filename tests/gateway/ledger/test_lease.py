"""Per-replica leases over the real Redis: local admission, and limits that hold across replicas."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime

import pytest

from gateway.errors import BudgetExceeded, RateLimited
from gateway.ledger import Limits
from gateway.ledger.budget import RedisCounters, period_of
from gateway.ledger.gate import Reservation, Settlement
from gateway.ledger.lease import FLUSH_DELAY_S, LeasedGate
from gateway.ledger.ratelimit import RateLimiter, RedisCounts, Rule, verdict
from gateway.policy import Plan, Price, Target
from gateway.types import Usage
from tests.gateway.ledger.conftest import ACME
from tests.gateway.ledger.helpers import make_ledger, rows

PLAN = Plan("gpt-test", (Target("openai", "gpt-4o-mini", price=Price(input=1.0, output=2.0)),))
WORST = round((100 * 1.0 + 100 * 2.0) * 1000)  # nano-dollars for 100 prompt + 100 output tokens
T0 = 1_800_000_000.0 + 6  # 6 s into a minute


async def _replica(sqlite_db, redis_prefix, clock=None):
    client, prefix = redis_prefix
    kw = {"rate_clock": clock} if clock is not None else {}
    ledger = make_ledger(
        sqlite_db, budgets=RedisCounters(client, f"{prefix}:budget"), counts=RedisCounts(client, f"{prefix}:rl"), **kw
    )
    assert isinstance(ledger.gate, LeasedGate)
    await ledger.start()
    return ledger


async def _admit(ledger, rid: str):
    return await ledger.admit(
        ACME, PLAN, request_id=rid, endpoint="chat.completions", started=time.perf_counter(),
        streamed=False, input_tokens=lambda: 100, max_output_tokens=100,
    )  # fmt: skip


def _counting(client) -> list[str]:
    sent: list[str] = []
    execute = client.execute_command

    async def counting(*args, **kwargs):
        sent.append(str(args[0]))
        return await execute(*args, **kwargs)

    client.execute_command = counting  # type: ignore[method-assign]
    return sent


async def test_admission_covered_by_the_slices_sends_nothing_to_redis(sqlite_db, redis_prefix) -> None:
    client, _ = redis_prefix
    ledger = await _replica(sqlite_db, redis_prefix)
    await ledger.limits.put(Limits("acme", rpm=10_000, tpm=10**7, budget_soft_usd=1.0, budget_hard_usd=2.0))
    await ledger.limits.put(Limits("acme", key_id=ACME.key_id, rpm=10_000, budget_hard_usd=1.0))
    first, _ = await _admit(ledger, "first")  # takes the slices: one script run on its path
    await asyncio.sleep(FLUSH_DELAY_S * 3)
    sent = _counting(client)
    try:
        second, _ = await _admit(ledger, "second")
        assert sent == []
    finally:
        del client.execute_command
    assert second.charged is not None
    headers = second.charged.headers()
    assert headers["x-ratelimit-remaining-requests"] == str(10_000 - 2)  # the key's rule, both requests counted
    assert headers["x-ratelimit-remaining-tokens"] == str(10**7 - 2 * 200)
    for a in (first, second):
        ledger.finish(a, target=PLAN.targets[0], status=200, usage=Usage(100, 10))
    await ledger.aclose()
    spent, reserved = await ledger.budgets.state("t:acme", period_of(datetime.now(UTC)))
    assert (spent, reserved) == (2 * (100 + 20) * 1000, 0)  # settled at cost, every slice given back


async def test_settlements_reach_redis_shortly_after_the_request_ends(sqlite_db, redis_prefix) -> None:
    ledger = await _replica(sqlite_db, redis_prefix)
    await ledger.limits.put(Limits("acme", budget_hard_usd=1.0))
    admission, _ = await _admit(ledger, "a")
    period = period_of(datetime.now(UTC))
    spent, reserved = await ledger.budgets.state("t:acme", period)
    assert spent == 0
    assert reserved > WORST  # the request's reservation and this replica's slice
    ledger.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, 10))
    await asyncio.sleep(ledger.gate.settle_delay_s + FLUSH_DELAY_S * 5)
    spent, after = await ledger.budgets.state("t:acme", period)
    assert spent == (100 + 20) * 1000
    assert after == reserved - spent  # the unused part of the reservation went back to the slice
    await ledger.aclose()


async def test_rate_limit_holds_across_two_replicas_sharing_redis(sqlite_db, redis_prefix) -> None:
    """Two replicas, 200 concurrent requests between them, an RPM of 64: never more than 64 admitted."""
    a = await _replica(sqlite_db, redis_prefix, clock=lambda: T0)
    b = await _replica(sqlite_db, redis_prefix, clock=lambda: T0)
    await a.limits.put(Limits("acme", rpm=64))
    await b.limits.reload()
    admitted = {"a": 0, "b": 0}
    retry_after: list[float | None] = []

    async def one(i: int) -> None:
        name, ledger = ("a", a) if i % 2 else ("b", b)
        try:
            admission, _ = await _admit(ledger, f"r{i}")
        except RateLimited as exc:
            retry_after.append(exc.retry_after)
            return
        admitted[name] += 1
        await asyncio.sleep(0.001)
        ledger.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, 100))

    await asyncio.gather(*(one(i) for i in range(200)))
    total = admitted["a"] + admitted["b"]
    slice_ = 2  # ceil(64 / LEASE_SHARE): what an idle replica may hold unused
    assert 64 - 2 * slice_ <= total <= 64
    assert admitted["a"] > 0
    assert admitted["b"] > 0
    assert total + len(retry_after) == 200
    assert all(r is not None and 0 < r <= 120 for r in retry_after)
    await a.aclose()
    await b.aclose()
    client, prefix = redis_prefix
    count = int(await client.get(f"{prefix}:rl:t:acme:requests:{int(T0 // 60)}") or 0)
    assert count == total  # the unused slices were given back


async def test_rate_slice_of_a_past_minute_is_given_back(sqlite_db, redis_prefix) -> None:
    now = [T0]
    ledger = await _replica(sqlite_db, redis_prefix, clock=lambda: now[0])
    await ledger.limits.put(Limits("acme", rpm=6400))
    await _admit(ledger, "a")
    await asyncio.sleep(FLUSH_DELAY_S * 3)
    client, prefix = redis_prefix
    key = f"{prefix}:rl:t:acme:requests:{int(T0 // 60)}"
    assert int(await client.get(key)) > 1  # the request and the replica's slice
    now[0] = T0 + 60
    await _admit(ledger, "b")  # the next minute: the old slice goes back
    await asyncio.sleep(FLUSH_DELAY_S * 3)
    assert int(await client.get(key)) == 1
    await ledger.aclose()


async def test_budget_race_over_two_replicas_never_overspends_and_charges_once(sqlite_db, redis_prefix) -> None:
    """200 concurrent requests over two replicas against a budget that admits 50 worst cases at once."""
    a = await _replica(sqlite_db, redis_prefix)
    b = await _replica(sqlite_db, redis_prefix)
    hard = 50 * WORST
    await a.limits.put(Limits("acme", budget_hard_usd=hard / 1e9))
    await b.limits.reload()
    period = period_of(datetime.now(UTC))
    rng = random.Random(6)  # noqa: S311 - reproducible delays, not secrets
    admitted: list[int] = []
    refused: list[int] = []
    violations: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        ledger = a if i % 2 else b
        try:
            admission, _ = await _admit(ledger, f"r{i}")
        except BudgetExceeded:
            refused.append(i)
            return
        admitted.append(i)
        await asyncio.sleep(rng.uniform(0, 0.02))
        ledger.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, rng.randint(50, 100)))

    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            spent, reserved = await a.budgets.state("t:acme", period)  # reserved: in flight and slices
            if spent + reserved > hard:
                violations.append((spent, reserved))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(one(i) for i in range(200)))
    finally:
        done.set()
        await watcher
        await a.aclose()
        await b.aclose()
    spent, reserved = await a.budgets.state("t:acme", period)
    served = [r for r in await rows(sqlite_db) if r.status == 200]
    assert violations == []
    assert reserved == 0
    assert spent <= hard
    # at most one worst case per replica may be refused early: another replica's unused slice
    assert len(admitted) >= 50 - 2
    assert refused
    assert sorted(r.request_id for r in served) == sorted(f"r{i}" for i in admitted)
    assert spent == sum(r.cost_nanos for r in served)


@pytest.mark.parametrize("actual_output", [50, 150])
async def test_tokens_per_minute_count_the_actual_tokens_after_settling(sqlite_db, redis_prefix, actual_output) -> None:
    ledger = await _replica(sqlite_db, redis_prefix, clock=lambda: T0)
    await ledger.limits.put(Limits("acme", tpm=100_000))
    admission, _ = await _admit(ledger, "a")
    ledger.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, actual_output))
    await asyncio.sleep(ledger.gate.settle_delay_s + FLUSH_DELAY_S * 3)
    await ledger.aclose()
    client, prefix = redis_prefix
    assert int(await client.get(f"{prefix}:rl:t:acme:tokens:{int(T0 // 60)}")) == 100 + actual_output


async def test_a_settlement_made_while_a_flush_is_on_its_way_goes_in_the_next_one(redis_prefix) -> None:
    client, prefix = redis_prefix
    counts, budgets = RedisCounts(client, f"{prefix}:rl"), RedisCounters(client, f"{prefix}:budget")
    gate = LeasedGate(counts, budgets)
    limiter = RateLimiter(counts, lambda: T0)
    reservation = Reservation((("t:a", 10**9),), "2026-11", 500)
    settlements = []
    for tokens, actual in ((80, 300), (90, 400)):
        ask = limiter.ask([Rule("t:a", "tokens", 10**6)], 200)
        outcome = await gate.admit(ask, reservation)
        settlements.append(Settlement(verdict(ask, outcome.rates_ok, outcome.before), tokens, reservation, actual))
    await asyncio.sleep(FLUSH_DELAY_S * 3)  # the refill after the second admission is done
    entered, release = asyncio.Event(), asyncio.Event()
    execute = client.execute_command

    async def held(*args, **kwargs):
        if not entered.is_set():
            entered.set()
            await release.wait()
        return await execute(*args, **kwargs)

    client.execute_command = held  # type: ignore[method-assign]
    try:
        await gate.settle(settlements[:1])
        await entered.wait()  # the first flush is waiting on Redis
        await gate.settle(settlements[1:])
        release.set()
        await asyncio.sleep(FLUSH_DELAY_S * 5)
    finally:
        del client.execute_command
    spent, _ = await budgets.state("t:a", "2026-11")
    assert spent == 300 + 400
    await gate.aclose()
    assert await budgets.state("t:a", "2026-11") == (700, 0)
    assert int(await client.get(counts.key("t:a:tokens", int(T0 // 60)))) == 80 + 90


async def test_caller_gone_while_its_slices_are_taken_leaves_nothing_charged(sqlite_db, redis_prefix) -> None:
    client, prefix = redis_prefix
    ledger = await _replica(sqlite_db, redis_prefix, clock=lambda: T0)
    await ledger.limits.put(Limits("acme", rpm=6400, budget_hard_usd=1.0))
    period = period_of(datetime.now(UTC))
    await ledger.budgets.seed("t:acme", period, 0)  # so that the first script run is the admission's
    entered, release = asyncio.Event(), asyncio.Event()
    execute = client.execute_command

    async def held(*args, **kwargs):
        if args[0] == "EVALSHA" and not entered.is_set():
            entered.set()
            await release.wait()
        return await execute(*args, **kwargs)

    client.execute_command = held  # type: ignore[method-assign]
    try:
        task = asyncio.create_task(_admit(ledger, "gone"))
        await entered.wait()  # its admission is on its way to Redis
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        del client.execute_command
    await asyncio.sleep(ledger.gate.settle_delay_s + FLUSH_DELAY_S * 3)
    await ledger.aclose()  # gives the slices back
    assert await ledger.budgets.state("t:acme", period) == (0, 0)
    # the request itself still counts against the RPM (as with one script per admission); its slice went back
    assert int(await client.get(f"{prefix}:rl:t:acme:requests:{int(T0 // 60)}") or 0) == 1
    assert [r.request_id for r in await rows(sqlite_db)] == []  # a caller gone before admission: no record


def _crash(ledger) -> None:
    """What a SIGKILL leaves in Redis: the replica's holdings, no longer renewed (nothing is given back)."""
    renewer = ledger.gate._renewer
    assert renewer is not None  # a replica holding budget slices renews them
    renewer.cancel()


async def test_a_crashed_replicas_slices_and_requests_in_flight_return_to_the_pool_after_the_lease(
    sqlite_db, redis_prefix
) -> None:
    a = await _replica(sqlite_db, redis_prefix)
    b = await _replica(sqlite_db, redis_prefix)
    a.gate.lease_ttl_s = 1.0
    hard = 64 * WORST
    await a.limits.put(Limits("acme", budget_hard_usd=hard / 1e9))
    await b.limits.reload()
    period = period_of(datetime.now(UTC))
    served, _ = await _admit(a, "served")
    await _admit(a, "in-flight")  # never finishes: a dies with it
    a.finish(served, target=PLAN.targets[0], status=200, usage=Usage(100, 10))
    await asyncio.sleep(a.gate.settle_delay_s + FLUSH_DELAY_S * 5)
    spent, reserved = await b.budgets.state("t:acme", period)
    assert spent == (100 + 20) * 1000
    assert reserved >= WORST  # the request in flight and a's unused slice
    _crash(a)
    started = time.monotonic()
    for _ in range(100):  # polls the status for up to 5 s
        if not (await b.budgets.state("t:acme", period))[1]:
            break
        await asyncio.sleep(0.05)
    waited = time.monotonic() - started
    assert await b.budgets.state("t:acme", period) == (spent, 0)  # nothing held by a dead replica
    assert 0.5 < waited < 1.6  # given back once a's last renewal is lease_ttl_s old, not before
    admitted = []
    for i in range(70):
        try:
            admitted.append(await _admit(b, f"b{i}"))
        except BudgetExceeded:
            break
    assert len(admitted) < 70  # refused once the budget is used up
    await asyncio.sleep(FLUSH_DELAY_S * 3)  # b's last refill lands
    # the whole budget is b's again: all of it held by b (a refill of its own in flight may refuse
    # a request up to one slice, 2 worst cases, early: as in the race test above)
    assert len(admitted) >= (hard - spent) // WORST - 2
    assert hard - WORST < sum(await b.budgets.state("t:acme", period)) <= hard
    await a.aclose()  # a late give-back of a reclaimed holding changes nothing
    spent_after, reserved_after = await b.budgets.state("t:acme", period)
    assert spent_after == spent
    assert reserved_after >= len(admitted) * WORST  # b's requests in flight are still reserved
    for admission, _ in admitted:
        b.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, 10))
    await b.aclose()
    assert await b.budgets.state("t:acme", period) == (spent + len(admitted) * 120_000, 0)


async def test_renewal_keeps_a_live_replicas_slice_past_the_lease_time(sqlite_db, redis_prefix) -> None:
    client, _ = redis_prefix
    a = await _replica(sqlite_db, redis_prefix)
    b = await _replica(sqlite_db, redis_prefix)
    a.gate.lease_ttl_s = 0.6
    await a.limits.put(Limits("acme", budget_hard_usd=64 * WORST / 1e9))
    await b.limits.reload()
    period = period_of(datetime.now(UTC))
    first, _ = await _admit(a, "first")
    await asyncio.sleep(FLUSH_DELAY_S * 3)
    _, held = await b.budgets.state("t:acme", period)
    assert held >= 2 * WORST  # the request and a's slice
    await asyncio.sleep(1.5)  # two and a half lease times, renewed every 0.2 s
    assert await b.budgets.state("t:acme", period) == (0, held)
    sent = _counting(client)
    try:
        second, _ = await _admit(a, "second")
        assert sent == []  # still admitted from a's slice
    finally:
        del client.execute_command
    for admission in (first, second):
        a.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, 10))
    await a.aclose()
    await b.aclose()
    assert await b.budgets.state("t:acme", period) == (2 * 120_000, 0)


async def test_a_replica_that_could_not_renew_stops_using_its_slice(sqlite_db, redis_prefix) -> None:
    client, _ = redis_prefix
    a = await _replica(sqlite_db, redis_prefix)
    a.gate.lease_ttl_s = 0.5
    await a.limits.put(Limits("acme", budget_hard_usd=64 * WORST / 1e9))
    period = period_of(datetime.now(UTC))
    first, _ = await _admit(a, "first")
    await asyncio.sleep(FLUSH_DELAY_S * 3)
    _crash(a)  # a lives on, but its renewals stop (as when Redis cannot be reached)
    await asyncio.sleep(0.6)
    sent = _counting(client)
    try:
        second, _ = await _admit(a, "second")
        assert sent != []  # the old slice may be someone else's now: the request asks Redis
    finally:
        del client.execute_command
    _, reserved = await a.budgets.state("t:acme", period)
    assert reserved >= WORST  # the new request's reservation, held under a fresh lease
    for admission in (first, second):  # first's holding was reclaimed: its settlement releases nothing twice
        a.finish(admission, target=PLAN.targets[0], status=200, usage=Usage(100, 10))
    await a.aclose()
    assert await a.budgets.state("t:acme", period) == (2 * 120_000, 0)
