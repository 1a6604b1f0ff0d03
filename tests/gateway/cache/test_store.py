"""The store contract over both backends, the LRU's byte cap, and Redis failing open."""

from __future__ import annotations

import asyncio
import socket

from structlog.testing import capture_logs

from gateway.cache.store import MemoryStore, RedisStore


async def test_store_returns_what_was_set_until_deleted(store, scope):
    key = f"{scope}:abc"
    assert await store.get(key) is None
    assert await store.set(key, b"value", 60)
    assert await store.get(key) == b"value"
    assert await store.delete(key) == 1
    assert await store.get(key) is None
    assert await store.delete(key) == 0


async def test_store_forgets_an_entry_after_its_ttl(store, scope):
    key = f"{scope}:ttl"
    assert await store.set(key, b"v", 0.05)
    await asyncio.sleep(0.12)
    assert await store.get(key) is None


async def test_purge_scope_removes_only_that_tenants_entries(store, scope):
    other = scope + "x"
    for i in range(3):
        await store.set(f"{scope}:{i}", b"a", 60)
    await store.set(f"{other}:0", b"b", 60)
    assert await store.purge_scope(scope) == 3
    assert await store.get(f"{scope}:0") is None
    assert await store.get(f"{other}:0") == b"b"
    await store.purge_scope(other)


async def test_purge_scope_treats_glob_characters_literally(store, scope):
    await store.set(f"{scope}:1", b"a", 60)
    await store.purge_scope("*")  # the shared scope, not "every scope"
    await store.purge_scope(scope[:-1] + "?")
    assert await store.get(f"{scope}:1") == b"a"
    await store.purge_scope(scope)


async def test_memory_store_evicts_least_recently_used_beyond_its_byte_cap():
    store = MemoryStore(max_bytes=10)
    await store.set("t:a", b"aaaa", 60)
    await store.set("t:b", b"bbbb", 60)
    assert await store.get("t:a") == b"aaaa"  # a is now the most recently used
    await store.set("t:c", b"cccc", 60)  # 12 bytes > 10: b goes
    assert [await store.get(k) for k in ("t:a", "t:b", "t:c")] == [b"aaaa", None, b"cccc"]
    info = await store.info()
    assert (info.entries, info.bytes, info.max_bytes) == (2, 8, 10)


async def test_memory_store_refuses_a_value_larger_than_its_cap():
    store = MemoryStore(max_bytes=3)
    assert not await store.set("t:a", b"abcd", 60)
    assert (await store.info()).entries == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_redis_store_fails_open_with_one_warning_when_redis_is_down():
    store = RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0", retry_after_s=60)
    with capture_logs() as logs:
        assert await store.get("t:a") is None
        assert not store.available
        assert not await store.set("t:a", b"v", 60)
        assert await store.get("t:a") is None
    await store.aclose()
    warnings = [e for e in logs if e["event"] == "cache_backend_unavailable"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"


async def test_redis_store_tries_again_after_its_retry_window():
    store = RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0", retry_after_s=0.05)
    assert await store.get("t:a") is None
    assert not store.available
    await asyncio.sleep(0.08)
    assert store.available
    await store.aclose()


async def test_redis_store_reports_server_memory():
    store = RedisStore.from_url("redis://127.0.0.1:6379/0")
    info = await store.info()
    await store.aclose()
    assert info.backend == "redis" and info.bytes is not None and info.bytes > 0


async def test_redis_store_admin_calls_answer_nothing_removed_when_redis_is_down():
    store = RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0")
    assert await store.delete("t:a") == 0
    assert await store.purge_scope("t") == 0
    info = await store.info()
    await store.aclose()
    assert (info.backend, info.entries, info.bytes) == ("redis", None, None)
