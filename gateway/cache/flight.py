"""Single flight: concurrent identical requests make one upstream call, the others wait and share it.

Owns the table of keys in flight on this process and the leader/follower handshake. The leader's
flight ends with the stored entry's bytes (shared) or with ``None`` (failed, cut short, not
storable): followers then go upstream on their own, so one failure is never fanned out and nothing
failed is shared. A flight also ends when the leader's task ends, however it ends, so a crashed or
cancelled leader cannot strand its followers. Not shared between replicas (each replica makes at
most one call per key). Does not own storing anything (``gateway.cache.responses``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.cache.key import CacheKey


class Flight:
    """One key in flight. ``land`` is idempotent; the first call decides what followers get."""

    __slots__ = ("_table", "done", "key")

    def __init__(self, table: SingleFlight, key: CacheKey) -> None:
        self._table = table
        self.key = key
        self.done: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

    def land(self, result: bytes | None) -> None:
        """End the flight: followers get ``result`` (an entry's bytes) or ``None`` (go upstream yourself)."""
        if self._table.flights.get(self.key) is self:
            del self._table.flights[self.key]
        if not self.done.done():
            self.done.set_result(result)


class SingleFlight:
    """The flights of one process. Not thread-safe: one event loop owns it."""

    def __init__(self) -> None:
        self.flights: dict[CacheKey, Flight] = {}
        self.shared = 0
        """Followers that got the leader's answer (a statistic)."""

    def lead(self, key: CacheKey) -> Flight | None:
        """Become the leader of ``key``, or ``None`` when another request already leads it."""
        if key in self.flights:
            return None
        flight = self.flights[key] = Flight(self, key)
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _: flight.land(None))
        return flight

    async def follow(self, key: CacheKey, timeout_s: float) -> bytes | None:
        """Wait for the leader of ``key``: its entry's bytes, or ``None`` (no flight, failed, or timed out)."""
        flight = self.flights.get(key)
        if flight is None:
            return None
        try:
            result = await asyncio.wait_for(asyncio.shield(flight.done), timeout_s)
        except TimeoutError:
            return None
        if result is not None:
            self.shared += 1
        return result
