"""One store fixture for the contract tests: the in-process LRU and the real Redis on 127.0.0.1."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import pytest

from gateway.cache.store import MemoryStore, RedisStore

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.cache.store import CacheStore

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[CacheStore]:
    if request.param == "memory":
        yield MemoryStore(1 << 20)
        return
    redis_store = RedisStore.from_url(REDIS_URL)
    yield redis_store
    await redis_store.aclose()


@pytest.fixture
def scope() -> str:
    """A tenant name no other test run uses, so tests on the shared Redis never see each other's keys."""
    return f"t{secrets.token_hex(6)}"
