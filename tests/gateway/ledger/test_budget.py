from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime

import pytest

from gateway.errors import BudgetExceeded
from gateway.ledger import Limits
from gateway.ledger.budget import MemoryCounters, RedisCounters, period_of
from gateway.ledger.ratelimit import RedisCounts
from gateway.policy import Plan, Price, Target
from gateway.types import Usage
from tests.gateway.ledger.conftest import ACME
from tests.gateway.ledger.helpers import make_ledger, make_record, rows

PRICE = Price(input=1.0, output=2.0)
PLAN = Plan("gpt-test", (Target("openai", "gpt-4o-mini", price=PRICE),))
WORST = (1000 * 1.0 + 1000 * 2.0) * 1000  # nano-dollars for 1000 prompt + 1000 output tokens


async def test_counters_reserve_refuses_past_hard_limit_and_settle_moves_reserved_to_spent() -> None:
    c = MemoryCounters()  # with Redis the lease script reserves and settles (test_gate, test_lease)
    assert await c.reserve([("t:a", 100)], "2026-11", 60) is None
    refused = await c.reserve([("t:a", 100)], "2026-11", 60)
    assert refused is not None
    assert (refused.scope, refused.spent, refused.reserved, refused.hard) == ("t:a", 0, 60, 100)
    await c.settle(["t:a"], "2026-11", 60, 25)
    assert await c.state("t:a", "2026-11") == (25, 0)
    assert await c.reserve([("t:a", 100)], "2026-11", 60) is None


async def test_counters_reserve_all_scopes_or_none() -> None:
    c = MemoryCounters()
    refused = await c.reserve([("t:a", 1000), ("k:1", 50)], "2026-11", 60)
    assert refused is not None
    assert refused.scope == "k:1"
    assert await c.state("t:a", "2026-11") == (0, 0)  # the tenant scope was not charged either


async def test_counters_seed_only_once(budget_counters) -> None:
    c = budget_counters
    assert not await c.seeded("t:a", "2026-11")
    await c.seed("t:a", "2026-11", 500)
    await c.seed("t:a", "2026-11", 900)
    assert await c.seeded("t:a", "2026-11")
    assert await c.state("t:a", "2026-11") == (500, 0)


async def _admit(ledger, **kw):
    return await ledger.admit(
        ACME, PLAN, request_id=kw.pop("request_id", "r"), endpoint="chat.completions", started=time.perf_counter(),
        streamed=False, input_tokens=lambda: 1000, max_output_tokens=kw.pop("max_output_tokens", 1000),
    )  # fmt: skip


async def test_admit_rejects_with_budget_exceeded_and_records_the_refusal(sqlite_db) -> None:
    ledger = make_ledger(sqlite_db)
    await ledger.start()
    await ledger.limits.put(Limits("acme", budget_hard_usd=WORST * 1.5 / 1e9))
    await _admit(ledger)
    with pytest.raises(BudgetExceeded) as info:
        await _admit(ledger, request_id="second")
    assert info.value.status_code == 402
    assert "acme" in info.value.message
    await ledger.aclose()
    refused = [r for r in await rows(sqlite_db) if r.request_id == "second"]
    assert [(r.status, r.error, r.cost_nanos) for r in refused] == [(402, "BudgetExceeded", 0)]


async def test_admit_caps_max_tokens_when_a_budget_applies_and_the_caller_set_none(sqlite_db) -> None:
    ledger = make_ledger(sqlite_db, default_max_output_tokens=256)
    await ledger.start()
    _, unlimited = await _admit(ledger, max_output_tokens=None)
    assert unlimited is None
    await ledger.limits.put(Limits("acme", budget_hard_usd=100.0))
    admission, capped = await _admit(ledger, max_output_tokens=None)
    assert capped == 256
    assert admission.reserved == round((1000 * 1.0 + 256 * 2.0) * 1000)
    await ledger.aclose()


async def test_soft_limit_flags_the_request_but_lets_it_through(sqlite_db) -> None:
    ledger = make_ledger(sqlite_db)
    await ledger.start()
    await ledger.limits.put(Limits("acme", budget_soft_usd=WORST * 0.5 / 1e9, budget_hard_usd=1.0))
    admission, _ = await _admit(ledger)
    assert admission.soft_exceeded
    assert admission.headers()["x-crossway-budget"] == "soft-limit"
    await ledger.aclose()


async def test_budget_counters_start_from_the_months_spend_in_the_database(sqlite_db) -> None:
    now = datetime.now(UTC)
    writer_ledger = make_ledger(sqlite_db)
    writer_ledger.writer.submit(make_record(tenant="acme", cost_nanos=int(WORST * 2), ts=now))
    writer_ledger.writer.submit(make_record(tenant="other", cost_nanos=int(WORST * 50), ts=now))
    await writer_ledger.writer.flush()
    ledger = make_ledger(sqlite_db)
    await ledger.start()
    await ledger.limits.put(Limits("acme", budget_hard_usd=WORST * 2.5 / 1e9))
    with pytest.raises(BudgetExceeded):  # 2 spent earlier + 1 worst case > 2.5
        await _admit(ledger)
    assert await ledger.budgets.state("t:acme", period_of(now)) == (int(WORST * 2), 0)
    await ledger.aclose()


async def test_budget_race_never_overspends_and_never_charges_twice(sqlite_db, budget_counters, redis_prefix) -> None:
    """200 concurrent requests against a budget that admits 50 worst cases at once (with Redis: from leases)."""
    client, prefix = redis_prefix
    counts = RedisCounts(client, f"{prefix}:rl") if isinstance(budget_counters, RedisCounters) else None
    ledger = make_ledger(sqlite_db, budgets=budget_counters, counts=counts)
    await ledger.start()
    hard = round(50 * WORST)
    await ledger.limits.put(Limits("acme", budget_hard_usd=hard / 1e9))
    period = period_of(datetime.now(UTC))
    rng = random.Random(6)  # noqa: S311 - reproducible delays, not secrets
    violations: list[tuple[int, int]] = []
    admitted: list[int] = []
    refused: list[int] = []

    async def one(i: int) -> None:
        try:
            admission, _ = await _admit(ledger, request_id=f"r{i}")
        except BudgetExceeded:
            refused.append(i)
            return
        admitted.append(i)
        await asyncio.sleep(rng.uniform(0, 0.02))
        usage = Usage(input_tokens=1000, output_tokens=rng.randint(500, 1000))
        ledger.finish(admission, target=PLAN.targets[0], status=200, usage=usage)
        ledger.finish(admission, target=PLAN.targets[0], status=200, usage=usage)  # a second finish is a no-op

    done = asyncio.Event()

    async def watch() -> None:
        # NOTE: stopped by a flag and awaited, not cancelled: a Redis command cancelled mid-flight can
        # leave the task behind to spin in the event loop's teardown
        while not done.is_set():
            spent, reserved = await ledger.budgets.state("t:acme", period)
            if spent + reserved > hard:
                violations.append((spent, reserved))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(one(i) for i in range(200)))
    finally:
        done.set()
        await watcher
        await ledger.aclose()
    spent, reserved = await ledger.budgets.state("t:acme", period)
    written = await rows(sqlite_db)
    served = [r for r in written if r.status == 200]
    assert violations == []
    assert reserved == 0
    assert spent <= hard
    assert len(admitted) >= 50
    assert refused  # the budget did bind
    assert len(admitted) + len(refused) == 200
    assert sorted(r.request_id for r in served) == sorted(f"r{i}" for i in admitted)  # one record each
    assert spent == sum(r.cost_nanos for r in served)  # every settled cost is a recorded cost, once
