"""Ledger fixtures: databases on both back-ends (from the store tests), budget counters in memory and in the real Redis."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import BlockingConnectionPool, Redis

from gateway.ledger.budget import MemoryCounters, RedisCounters
from gateway.store.keys import Principal
from gateway.store.migrate import upgrade
from tests.gateway.e2e.conftest import upstream  # noqa: F401 - the fake vendors, for the reconciliation test
from tests.gateway.store.conftest import BACKENDS, open_database

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from gateway.store.db import Database

REDIS_URL = "redis://127.0.0.1:6379/0"
ACME = Principal(tenant_id=1, tenant="acme", key_id=11)


@pytest.fixture(params=BACKENDS)
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated database, once per back-end."""
    async with open_database(request.param, tmp_path) as database:
        await upgrade(database)
        yield database


@pytest.fixture
async def sqlite_db(tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated SQLite file, for logic above the database."""
    async with open_database("sqlite", tmp_path) as database:
        await upgrade(database)
        yield database


@pytest.fixture
async def redis_prefix() -> AsyncIterator[tuple[Redis, str]]:
    """The real Redis and a key prefix of this test's own; its keys are deleted afterwards."""
    # NOTE: redis-py 8's default pool raises past 100 connections; the gateway's client waits instead.
    client = Redis.from_pool(BlockingConnectionPool.from_url(REDIS_URL, max_connections=64, timeout=10))
    prefix = f"crossway-test:{uuid.uuid4().hex[:12]}"
    try:
        yield client, prefix
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def budget_counters(
    request: pytest.FixtureRequest, redis_prefix: tuple[Redis, str]
) -> MemoryCounters | RedisCounters:
    """Budget counters, once in process and once in Redis."""
    client, prefix = redis_prefix
    return MemoryCounters() if request.param == "memory" else RedisCounters(client, prefix)
