"""Where cache entries live: an in-process LRU with a byte cap, or Redis shared by every replica.

Owns bytes in, bytes out, TTLs, eviction and purging by scope or key. Both stores fail open: an
error is logged as a warning and reads as a miss, never a failed request; the Redis store then stays
away from Redis for ``retry_after_s`` so a dead server costs one warning, not one per request. Does
not own what the bytes mean (``gateway.cache.entry``) nor the keys (``gateway.cache.key``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple, Protocol

import structlog
from redis.exceptions import RedisError

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio import Redis

log = structlog.get_logger(__name__)

REDIS_PREFIX = "crossway:cache:"


class StoreInfo(NamedTuple):
    """What a store holds now."""

    backend: str
    entries: int | None
    """``None`` when counting would cost a scan (Redis)."""
    bytes: int | None
    """Payload bytes (memory) or Redis ``used_memory``; ``None`` when unknown."""
    max_bytes: int | None


class CacheStore(Protocol):
    """A key-value store with TTLs. Values are owned by the caller after ``get``; no locking needed.

    Every method fails open: errors are logged and read as "nothing there" or "not stored".
    """

    @property
    def available(self) -> bool:
        """False while the backend is known to be down (its calls are then skipped)."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The value, or ``None`` when missing, expired or the store failed."""
        ...

    async def set(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store ``value`` for ``ttl_s`` seconds; ``False`` when it was not stored."""
        ...

    async def delete(self, key: str) -> int:
        """Remove one key; the number removed (0 or 1)."""
        ...

    async def purge_scope(self, scope: str) -> int:
        """Remove every key of a scope (a tenant, or ``*``); the number removed."""
        ...

    async def info(self) -> StoreInfo:
        """Size figures for the admin endpoint."""
        ...

    async def aclose(self) -> None:
        """Release connections the store owns."""
        ...


class MemoryStore:
    """The embedded default: an LRU of byte strings, capped in total bytes, with per-entry expiry.

    Not shared between processes or replicas. Single-threaded (one event loop), so no locks.
    """

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        """Create an empty store holding at most ``max_bytes`` of values."""
        self.max_bytes = max_bytes
        self._clock = clock
        self._data: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0

    @property
    def available(self) -> bool:  # noqa: D102 - see CacheStore
        return True

    def _now(self) -> float:
        return self._clock()

    async def get(self, key: str) -> bytes | None:  # noqa: D102
        item = self._data.get(key)
        if item is None:
            return None
        value, expires = item
        if expires <= self._now():
            self._drop(key)
            return None
        self._data.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl_s: float) -> bool:  # noqa: D102
        if len(value) > self.max_bytes:
            return False
        if key in self._data:
            self._drop(key)
        self._data[key] = (value, self._now() + ttl_s)
        self._bytes += len(value)
        while self._bytes > self.max_bytes:  # NOTE: least recently used first; expired ones go the same way
            self._drop(next(iter(self._data)))
        return True

    async def delete(self, key: str) -> int:  # noqa: D102
        return 1 if self._drop(key) else 0

    async def purge_scope(self, scope: str) -> int:  # noqa: D102
        doomed = [k for k in self._data if k.rpartition(":")[0] == scope]
        for k in doomed:
            self._drop(k)
        return len(doomed)

    async def info(self) -> StoreInfo:  # noqa: D102
        return StoreInfo("memory", len(self._data), self._bytes, self.max_bytes)

    async def aclose(self) -> None:  # noqa: D102
        self._data.clear()
        self._bytes = 0

    def _drop(self, key: str) -> bool:
        item = self._data.pop(key, None)
        if item is None:
            return False
        self._bytes -= len(item[0])
        return True


class RedisStore:
    """Entries in Redis under ``crossway:cache:<scope>:<hash>``, with ``SET ... PX`` expiry.

    The memory cap and eviction are Redis's own (``maxmemory`` with an ``allkeys-lru`` or
    ``volatile-lru`` policy); every entry carries a TTL so ``volatile-*`` policies apply. The client
    should have short socket timeouts: a slow Redis is treated like a dead one.
    """

    def __init__(self, redis: Redis, retry_after_s: float = 5.0) -> None:
        """Use ``redis`` (closed by ``aclose``); after a failure, skip Redis for ``retry_after_s``."""
        self._redis = redis
        self.retry_after_s = retry_after_s
        self._down_until = 0.0

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 0.5, retry_after_s: float = 5.0) -> RedisStore:
        """A store with its own client whose socket timeouts are short: a slow Redis counts as a dead one."""
        from redis.asyncio import Redis

        return cls(Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s), retry_after_s)

    async def aclose(self) -> None:  # noqa: D102
        await self._redis.aclose()

    @property
    def available(self) -> bool:  # noqa: D102
        return time.monotonic() >= self._down_until

    def _failed(self, op: str, exc: Exception) -> None:
        if self.available:  # NOTE: one warning per outage window, not one per request
            log.warning("cache_backend_unavailable", backend="redis", op=op, error=f"{type(exc).__name__}: {exc}")
        self._down_until = time.monotonic() + self.retry_after_s

    async def get(self, key: str) -> bytes | None:  # noqa: D102
        if not self.available:
            return None
        try:
            value = await self._redis.get(REDIS_PREFIX + key)
        except (RedisError, OSError) as exc:
            self._failed("get", exc)
            return None
        return value if isinstance(value, bytes) else None

    async def set(self, key: str, value: bytes, ttl_s: float) -> bool:  # noqa: D102
        if not self.available:
            return False
        try:
            await self._redis.set(REDIS_PREFIX + key, value, px=max(1, int(ttl_s * 1000)))
        except (RedisError, OSError) as exc:
            self._failed("set", exc)
            return False
        return True

    async def delete(self, key: str) -> int:  # noqa: D102
        try:
            return int(await self._redis.unlink(REDIS_PREFIX + key))
        except (RedisError, OSError) as exc:
            self._failed("delete", exc)
            return 0

    async def purge_scope(self, scope: str) -> int:  # noqa: D102
        pattern = f"{REDIS_PREFIX}{_glob_escape(scope)}:*"
        removed = 0
        try:
            batch: list[bytes] = []
            async for name in self._redis.scan_iter(match=pattern, count=500):
                batch.append(name)
                if len(batch) >= 500:
                    removed += int(await self._redis.unlink(*batch))
                    batch.clear()
            if batch:
                removed += int(await self._redis.unlink(*batch))
        except (RedisError, OSError) as exc:
            self._failed("purge", exc)
        return removed

    async def info(self) -> StoreInfo:  # noqa: D102
        try:
            memory = await self._redis.info("memory")
        except (RedisError, OSError) as exc:
            self._failed("info", exc)
            return StoreInfo("redis", None, None, None)
        cap = int(memory.get("maxmemory", 0)) or None
        return StoreInfo("redis", None, int(memory.get("used_memory", 0)), cap)


def build_store(redis_url: str | None, memory_bytes: int) -> CacheStore:
    """Redis when the gateway has one (shared by replicas), else the in-process LRU of ``memory_bytes``.

    The Redis store gets its own client with short timeouts (the app's has none): a cache must never
    hold a request up.
    """
    return RedisStore.from_url(redis_url) if redis_url else MemoryStore(memory_bytes)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
