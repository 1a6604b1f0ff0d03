"""Requests in flight shared between replicas through the real Redis (``gateway.inflight``)."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from gateway.inflight import InFlightShare
from gateway.stats import Stats
from tests.gateway.ledger.conftest import redis_prefix  # noqa: F401 - the real Redis, keys of this test's own

KEY = "openai/cheap"


def _replicas(client: Redis, prefix: str, n: int, **timing: float) -> list[InFlightShare]:
    return [InFlightShare(client, Stats(), prefix=prefix, **timing) for _ in range(n)]


async def test_each_replica_reads_the_others_in_flight_counts_not_its_own(redis_prefix):  # noqa: F811
    client, prefix = redis_prefix
    a, b, c = _replicas(client, prefix, 3)
    a.stats[KEY].in_flight, b.stats[KEY].in_flight = 3, 1
    b.stats["anthropic/dear"].in_flight = 2
    for share in (a, b, c, a):  # a syncs again to read b's and c's first counts
        await share.sync()
    assert [s.stats[KEY].elsewhere for s in (a, b, c)] == [1, 3, 4]
    assert [s.stats["anthropic/dear"].elsewhere for s in (a, b, c)] == [2, 0, 2]
    a.stats[KEY].in_flight = 0  # its requests ended
    await a.sync()
    await c.sync()
    assert c.stats[KEY].elsewhere == 1


async def test_a_replica_that_stops_syncing_stops_counting_once_its_counts_lapse(redis_prefix):  # noqa: F811
    client, prefix = redis_prefix
    a, b = _replicas(client, prefix, 2, ttl_s=0.2)
    a.stats[KEY].in_flight = 5
    await a.sync()
    await b.sync()
    assert b.stats[KEY].elsewhere == 5
    await asyncio.sleep(0.3)  # a crashed: no more syncs
    await b.sync()
    assert b.stats[KEY].elsewhere == 0
    assert await client.smembers(f"{prefix}:inflight:replicas") == {b.replica.encode()}


async def test_a_closed_replica_withdraws_its_counts_at_once(redis_prefix):  # noqa: F811
    client, prefix = redis_prefix
    a, b = _replicas(client, prefix, 2, interval_s=0.02)
    a.stats[KEY].in_flight = 2
    await a.start()
    await b.sync()
    assert b.stats[KEY].elsewhere == 2
    await a.aclose()
    await b.sync()
    assert b.stats[KEY].elsewhere == 0


async def test_closing_waits_for_the_sync_in_flight_without_cancelling_it(redis_prefix):  # noqa: F811
    """A cancellation swallowed inside a Redis command once kept the sync loop (and shutdown) going."""
    client, prefix = redis_prefix
    (share,) = _replicas(client, prefix, 1, interval_s=0.01)
    in_sync = asyncio.Event()
    syncs: list[str] = []
    real_sync = share.sync

    async def slow_sync() -> None:
        in_sync.set()
        try:
            await asyncio.sleep(0.1)
        except asyncio.CancelledError:  # what redis-py did with a cancellation mid-command
            syncs.append("cancelled")
        await real_sync()
        syncs.append("done")

    share.sync = slow_sync  # type: ignore[method-assign]
    await share.start()  # its own first sync
    in_sync.clear()
    await in_sync.wait()  # the background loop's sync is under way
    closing = asyncio.ensure_future(share.aclose())
    done, _ = await asyncio.wait({closing}, timeout=2.0)  # not wait_for: it would wait for a cancellation too
    assert done, "aclose did not return: the sync loop went on"
    assert share._task is not None and share._task.done()
    assert "cancelled" not in syncs and syncs[-1] == "done"
    assert not await client.exists(f"{prefix}:inflight:{share.replica}")  # withdrawn after the last sync


async def test_the_background_sync_keeps_counts_current(redis_prefix):  # noqa: F811
    client, prefix = redis_prefix
    a, b = _replicas(client, prefix, 2, interval_s=0.02)
    await a.start()
    await b.start()
    try:
        a.stats[KEY].in_flight = 4
        for _ in range(100):
            if b.stats[KEY].elsewhere == 4:
                break
            await asyncio.sleep(0.02)
        assert b.stats[KEY].elsewhere == 4
    finally:
        await a.aclose()
        await b.aclose()


async def test_without_redis_the_others_counts_are_dropped_after_their_ttl():
    unreachable = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    share = InFlightShare(unreachable, Stats(), ttl_s=0.05)
    share.stats[KEY].elsewhere = 7  # as last read, before Redis went away
    await asyncio.sleep(0.1)
    await share.start()  # logs the failure, does not raise
    try:
        assert share.stats[KEY].elsewhere == 0
    finally:
        await share.aclose()
        await unreachable.aclose()
