"""In-flight counts shared between gateway replicas, so that a deployment's concurrency cap holds across them.

Owns publishing this replica's requests in flight per deployment to Redis and reading the other
replicas' counts back into ``Stats`` (``DeploymentStats.elsewhere``), which the router and the
dispatcher add to this replica's own count before comparing it with a cap. Does not own the counts
themselves (``gateway.stats``, kept by ``gateway.dispatch``) nor the caps (``gateway.policy``).

NOTE(h4): nothing here is on a request's path. Every ``interval_s`` a replica rewrites its own hash
(``<prefix>:inflight:<replica>``, deployment -> count), which expires after ``ttl_s``, and reads every
other replica's; a replica that stops (or crashes) stops counting once its hash lapses. Between two
syncs the others' counts are the last ones read, so a cap can be overshot by what other replicas
admitted within one interval. When Redis cannot be reached for ``ttl_s``, the others' counts are
dropped and each replica holds the cap alone again, as it does without Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from gateway.stats import Stats

log = structlog.get_logger(__name__)

INTERVAL_S = 0.1
"""How often a replica publishes its counts and reads the others'."""
TTL_S = 3.0
"""How long a replica's counts outlive its last sync."""


class InFlightShare:
    """This replica's side of the shared in-flight counts: one background task that syncs them."""

    def __init__(
        self,
        redis: Redis,
        stats: Stats,
        *,
        prefix: str = "crossway",
        interval_s: float = INTERVAL_S,
        ttl_s: float = TTL_S,
    ) -> None:
        self.redis = redis
        self.stats = stats
        self.replica = uuid.uuid4().hex
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._replicas = f"{prefix}:inflight:replicas"
        self._prefix = f"{prefix}:inflight:"
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._synced = time.monotonic()
        self._failing = False

    async def start(self) -> None:
        """Sync once (failures logged, not raised), then keep syncing in the background."""
        await self._sync_or_log()
        self._task = asyncio.create_task(self._run(), name="inflight-share")

    async def aclose(self) -> None:
        """Stop syncing and withdraw this replica's counts at once (they would lapse after ``ttl_s``).

        NOTE(h4): the loop is told to stop and awaited, not cancelled. A cancellation that landed
        in a sync's Redis calls was sometimes lost there (redis-py 8.1 under uvloop; where exactly
        was not traced): the loop went on syncing, and the replica's shutdown hung until something
        cancelled it again (4 of 25 runs of tests/gateway/e2e/test_policy_replicas.py before this change).
        """
        self._stop.set()
        if self._task is not None:
            await self._task
        with contextlib.suppress(Exception):
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(self._own)
            pipe.srem(self._replicas, self.replica)
            await pipe.execute()

    @property
    def _own(self) -> str:
        return self._prefix + self.replica

    async def sync(self) -> None:
        """Publish this replica's counts and read the others' into ``stats`` (two round trips).

        Raises:
            redis.RedisError: Redis could not be reached; nothing in ``stats`` changed.
        """
        seen = self.stats.keys()
        own = {key: self.stats[key].in_flight for key in seen}
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._own)
        own[""] = 0  # a field that is always there keeps the hash, and so this replica, alive
        pipe.hset(self._own, items=[x for pair in own.items() for x in pair])
        pipe.pexpire(self._own, int(self.ttl_s * 1000))
        pipe.sadd(self._replicas, self.replica)
        pipe.smembers(self._replicas)
        members = (await pipe.execute())[-1]
        others = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        others = [r for r in others if r != self.replica]
        read = self.redis.pipeline(transaction=False)
        for replica in others:
            read.hgetall(self._prefix + replica)
        hashes = await read.execute() if others else []
        totals: Counter[str] = Counter()
        gone = []
        for replica, fields in zip(others, hashes, strict=True):
            if not fields:  # lapsed: that replica stopped syncing
                gone.append(replica)
                continue
            for key, count in fields.items():
                name = key.decode() if isinstance(key, bytes) else str(key)
                if name:
                    totals[name] += int(count)
        if gone:
            await self.redis.srem(self._replicas, *gone)
        self._apply(totals)
        self._synced = time.monotonic()

    def _apply(self, totals: Counter[str]) -> None:
        seen = self.stats.keys()
        for key in {*seen, *totals}:
            self.stats[key].elsewhere = totals.get(key, 0)

    async def _sync_or_log(self) -> None:
        try:
            await self.sync()
        except Exception as exc:  # noqa: BLE001 - Redis down: keep serving; caps fall back to per replica
            if time.monotonic() - self._synced > self.ttl_s:
                self._apply(Counter())
            if not self._failing:
                log.warning("inflight_sync_failed", error=repr(exc))
            self._failing = True
        else:
            if self._failing:
                log.info("inflight_sync_recovered")
            self._failing = False

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            if not self._stop.is_set():
                await self._sync_or_log()
