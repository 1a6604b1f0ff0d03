"""Reconciliation: a mixed workload through the real gateway; the ledger matches what the fakes reported.

Requests run one at a time, so the fake's request log splits into each gateway request's upstream
calls; the last upstream call of a served request is the one whose usage the gateway was told.
The fakes' usage is recomputed from the recorded bodies with the same deterministic ``plan``.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import openai
import pytest
from sqlalchemy import text

from gateway.ledger.prices import add_price
from gateway.ledger.record import cost_of
from gateway.policy import Price
from gateway.store.db import Database
from gateway.store.migrate import migrate
from gateway.types import Usage
from tests.fakes import fake_anthropic, fake_gemini, fake_openai
from tests.fakes.scenario import plan
from tests.gateway.e2e.conftest import _prepare, start_gateway
from tests.gateway.ledger.helpers import rows
from tests.gateway.store.conftest import BACKENDS, POSTGRES_URL

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream, RecordedRequest

PRICES = {
    "openai/gpt-4o-mini": Price(0.15, 0.6, 0.075),
    "openai/gpt-cached": Price(2.5, 10.0, 1.25),
    "anthropic/claude-sonnet-4-5": Price(3.0, 15.0, 0.3),
    "gemini/gemini-2.5-flash": Price(0.3, 2.5),
    "openai/long-stream-50000": Price(1.0, 4.0),
}


def _reported(req: RecordedRequest) -> Usage:
    body: dict[str, Any] = req.body
    if req.path.startswith("/v1beta/"):
        model, prompt = req.path.split("/")[3].split(":")[0], fake_gemini.prompt(body)
    elif req.path.startswith("/v1/messages"):
        model, prompt = body["model"], fake_anthropic.prompt(body)
    else:
        model, prompt = body["model"], fake_openai.prompt(body)
    a = plan(model, prompt)
    return Usage(a.input_tokens, a.output_tokens, a.cached_tokens)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database's URL: a SQLite file, or a PostgreSQL database of its own (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
        return
    name = f"crossway_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


async def _pg_admin(sql: str) -> None:
    admin = Database.connect(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await admin.aclose()


def test_ledger_totals_equal_usage_reported_by_upstreams(upstream: FakeUpstream, tmp_path: Path, db_url: str) -> None:
    asyncio.run(_prices(db_url))  # before the gateway starts: it loads price versions at startup
    key = asyncio.run(_prepare(db_url))  # start_gateway prepares its own SQLite file; this is the database used
    server, _ = start_gateway(upstream, tmp_path, database_url=db_url)
    oa = openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, timeout=20)
    expected: dict[str, tuple[Usage, str]] = {}
    msgs = [{"role": "user", "content": "count the tokens of this prompt please"}]

    def run(rid: str, call: Any) -> None:
        before = len(upstream.requests)
        call({"x-request-id": rid})
        last = upstream.requests[-1]
        assert len(upstream.requests) > before
        expected[rid] = (_reported(last), _deployment(last))

    try:
        for i in range(3):
            run(f"plain-{i}", lambda h: oa.chat.completions.create(model="gpt-test", messages=msgs, extra_headers=h))
            run(f"stream-{i}", lambda h: list(oa.chat.completions.create(
                model="gpt-test", messages=msgs, stream=True, extra_headers=h)))  # fmt: skip
        run("cached", lambda h: oa.chat.completions.create(model="openai/gpt-cached", messages=msgs, extra_headers=h))
        run(
            "translated-anthropic",
            lambda h: oa.chat.completions.create(model="claude-test", messages=msgs, extra_headers=h),
        )
        run("translated-anthropic-stream", lambda h: list(oa.chat.completions.create(
            model="claude-test", messages=msgs, stream=True, extra_headers=h)))  # fmt: skip
        run(
            "translated-gemini",
            lambda h: oa.chat.completions.create(model="gemini-test", messages=msgs, extra_headers=h),
        )
        with pytest.raises(openai.InternalServerError):
            oa.chat.completions.create(
                model="openai/error-500", messages=msgs, extra_headers={"x-request-id": "failed"}
            )
        with oa.chat.completions.create(model="openai/long-stream-50000", messages=msgs, stream=True,
                                        extra_headers={"x-request-id": "cancelled"}) as stream:  # fmt: skip
            for n, _ in enumerate(stream):
                if n == 3:
                    break
    finally:
        oa.close()
        server.stop()  # graceful shutdown flushes the ledger
    records = {r.request_id: r for r in asyncio.run(_rows(db_url))}
    served = {rid: records[rid] for rid in expected}
    for rid, (usage, deployment) in expected.items():
        r = served[rid]
        assert (r.input_tokens, r.output_tokens, r.cached_input_tokens) == (
            usage.input_tokens, usage.output_tokens, usage.cached_input_tokens), rid  # fmt: skip
        assert r.usage_source == "provider", rid
        assert r.deployment == deployment, rid
        assert r.cost_nanos == cost_of(usage, PRICES[deployment]).nanos, rid
        assert r.price_id is not None, rid
    total_cost = sum(r.cost_nanos for r in served.values())
    assert total_cost == sum(cost_of(u, PRICES[d]).nanos for u, d in expected.values())
    assert sum(r.input_tokens + r.output_tokens for r in served.values()) == sum(
        u.input_tokens + u.output_tokens for u, _ in expected.values()
    )
    assert records["cached"].saved_nanos > 0
    assert records["failed"].status >= 500
    assert records["failed"].cost_nanos == 0
    assert records["failed"].error == "ProviderUnavailable"
    cancelled = records["cancelled"]
    assert cancelled.status == 499
    assert cancelled.usage_source == "estimate"
    assert 0 < cancelled.output_tokens < 50000  # billed for what was produced, not for the whole answer
    assert cancelled.cost_nanos > 0


def _deployment(req: RecordedRequest) -> str:
    if req.path.startswith("/v1beta/"):
        return "gemini/" + req.path.split("/")[3].split(":")[0]
    if req.path.startswith("/v1/messages"):
        return f"anthropic/{req.body['model']}"
    return f"openai/{req.body['model']}"


async def _prices(url: str) -> None:
    await migrate(url)
    async with Database.connect(url) as db:
        since = datetime.now(UTC) - timedelta(hours=1)
        for deployment, price in PRICES.items():
            await add_price(db, deployment, since, price, author="test")


async def _rows(url: str) -> list[Any]:
    async with Database.connect(url) as db:
        return await rows(db)
