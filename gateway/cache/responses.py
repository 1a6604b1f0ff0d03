"""The exact-match response cache as the pipeline sees it: look up, share in flight, store, count.

``ResponseCache.open`` decides, for one request, whether the cache applies (the policy's mode and
``cacheable`` rule, the caller's ``x-crossway-cache`` directive, the backend's health), reads the
entry, and otherwise joins or leads the single flight for its key. The ``Slot`` it returns is
either a hit (replay its entry) or the place the upstream answer is stored through: ``store`` for a
complete response, ``tee`` around a stream (stored only when the stream ends with ``Finish`` and
usage; a stream cut short or failed is never stored). Upstream errors never reach the cache at all.

NOTE(h5): a follower of a streamed leader waits for the whole stream, then replays it at once: one
upstream call for N identical streams, at the price of the followers' TTFT being the leader's full
duration. Tailing the leader's events live would keep their TTFT too; not done yet.

Owns the per-tenant statistics (hits, misses, bypasses, bytes written, money and time saved) of
this replica. Does not own keys (``gateway.cache.key``), bytes (``gateway.cache.entry``), stores,
HTTP headers (``gateway.api.calls`` renders ``CacheStatus.headers``) or billing (the ledger).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import structlog

from gateway.cache import entry as entries
from gateway.cache.flight import SingleFlight
from gateway.cache.key import SHARED_SCOPE, cache_key
from gateway.ledger.record import cost_of
from gateway.types import UsageEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.cache.flight import Flight
    from gateway.cache.key import CacheKey
    from gateway.cache.store import CacheStore
    from gateway.policy import CacheRules, Target
    from gateway.types import ChatRequest, ChatResponse, StreamEvent, Usage

log = structlog.get_logger(__name__)

Directive = Literal["use", "bypass", "refresh"]
"""What a caller may ask in the ``x-crossway-cache`` request header: opt in, skip the cache, or skip
reading it but store the fresh answer."""
Outcome = Literal["hit", "miss", "bypass", "refresh"]
DIRECTIVES: frozenset[str] = frozenset({"use", "bypass", "refresh"})


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """What the cache did for one request; rendered as response headers."""

    outcome: Outcome
    key: CacheKey | None = None
    age_s: float | None = None
    """A hit: seconds since the entry was stored."""

    def headers(self) -> dict[str, str]:
        """``x-crossway-cache`` (hit, miss, bypass or refresh), its age on a hit, and the key to purge."""
        out: dict[str, str] = {"x-crossway-cache": self.outcome}
        if self.age_s is not None:
            out["x-crossway-cache-age"] = str(int(self.age_s))
        if self.key is not None:
            out["x-crossway-cache-key"] = self.key
        return out


@dataclass(slots=True)
class TenantStats:
    """Counters of one tenant on this replica."""

    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    stores: int = 0
    bytes_written: int = 0
    saved_usd: float = 0.0
    saved_s: float = 0.0


@dataclass(slots=True)
class Slot:
    """One request's place in the cache. ``hit`` is set on a hit; otherwise store the answer through it."""

    status: CacheStatus | None
    """``None`` when the policy turned the cache off (then no header is sent)."""
    hit: entries.Entry | None = None
    cache: ResponseCache | None = None
    """Set when this slot stores what comes back."""
    rules: CacheRules | None = None
    flight: Flight | None = None
    """Set when this request leads the single flight of its key."""
    tenant: str = ""
    keyed_on: str = ""
    """The alias or deployment in the key: with ``key_by: deployment``, only that deployment's answer is stored."""
    started: float = field(default_factory=time.perf_counter)

    async def store(self, response: ChatResponse, target: Target) -> None:
        """Store a complete non-streamed answer from ``target`` (a no-op when this slot does not write)."""
        if self.cache is not None:
            await self.cache.put(self, target, response.usage, response=response)

    def tee(self, events: AsyncIterator[StreamEvent], target: Target) -> AsyncIterator[StreamEvent]:
        """Pass ``events`` through unchanged, recording them; store them once the stream has ended properly.

        A slot that stores nothing returns ``events`` itself: every generator layer costs per event.
        """
        return events if self.cache is None else self._tee(events, target)

    async def _tee(self, events: AsyncIterator[StreamEvent], target: Target) -> AsyncIterator[StreamEvent]:
        assert self.cache is not None  # noqa: S101 - tee calls this only for a slot that stores
        recorded: list[StreamEvent] = []
        try:
            async for event in events:
                recorded.append(event)
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]  # a client that left closes the source now
        # NOTE: reached only when the stream ran to its end; an error or a client that went away
        # leaves through the ``async for`` and nothing is stored (the flight lands empty with the task).
        if entries.complete(recorded):
            usage = recorded[-1].usage if isinstance(recorded[-1], UsageEvent) else None
            await self.cache.put(self, target, usage, events=recorded)
        elif self.flight is not None:
            self.flight.land(None)


class ResponseCache:
    """The response cache of one gateway replica over one store.

    Safe to share between requests of one event loop; the store's state is the store's.
    """

    def __init__(self, store: CacheStore) -> None:
        """Use ``store`` (memory or Redis) for entries."""
        self.store = store
        self.flights = SingleFlight()
        self.stats: defaultdict[str, TenantStats] = defaultdict(TenantStats)

    async def open(
        self, request: ChatRequest, rules: CacheRules, deployment: str, directive: Directive | None = None
    ) -> Slot:
        """Look a request up: a hit, or a slot to store its answer through.

        Args:
            request: the canonical request, its tenant set.
            rules: the live policy's cache section.
            deployment: the first deployment the router chose (``provider/model``), for ``key_by: deployment``.
            directive: the caller's ``x-crossway-cache`` header, if any.
        """
        if rules.mode == "off":
            return Slot(None)
        tenant = request.tenant or ""
        stats = self.stats[tenant]
        if directive == "bypass" or not _cacheable(request, rules, directive) or not self.store.available:
            stats.bypasses += 1
            return Slot(CacheStatus("bypass"))
        scope = SHARED_SCOPE if rules.shared_across_tenants else tenant
        keyed_on = deployment if rules.key_by == "deployment" else request.model
        key = cache_key(request, keyed_on, scope)
        writer = self if rules.writes else None
        if directive == "refresh" or not rules.reads:
            stats.misses += 1
            status = CacheStatus("refresh" if directive == "refresh" else "miss", key)
            return Slot(status, None, writer, rules, None, tenant, keyed_on)
        data = await self.store.get(key)
        found = entries.decode(data) if data is not None else None
        # NOTE: only a request that will store its answer leads a flight (read_only has nothing to share)
        if found is None and writer is not None and (flight := self.flights.lead(key)) is not None:
            stats.misses += 1
            outcome: Outcome = "miss" if self.store.available else "bypass"  # the read just failed: fail open
            return Slot(CacheStatus(outcome, key), None, writer, rules, flight, tenant, keyed_on)
        if found is None:  # another request may lead this key: wait for its answer
            data = await self.flights.follow(key, rules.flight_wait_s)
            found = entries.decode(data) if data is not None else None
            if found is None:  # it failed or was not storable: go upstream alone, never share a failure
                stats.misses += 1
                return Slot(CacheStatus("miss", key), None, writer, rules, None, tenant, keyed_on)
        stats.hits += 1
        stats.saved_usd += found.cost_usd
        stats.saved_s += found.seconds
        return Slot(CacheStatus("hit", key, max(0.0, time.time() - found.created)), found)

    async def put(
        self,
        slot: Slot,
        target: Target,
        usage: Usage | None,
        *,
        response: ChatResponse | None = None,
        events: list[StreamEvent] | None = None,
    ) -> None:
        """Store a complete answer for ``slot`` and hand it to the requests waiting in its flight.

        Too large an answer (the policy's ``max_entry_bytes``) is neither stored nor shared, and with
        ``key_by: deployment`` neither is an answer from a fallback deployment (it is not the keyed one's).
        """
        status, rules = slot.status, slot.rules
        if status is None or status.key is None or rules is None:  # only slots opened with a key write
            return
        shared: bytes | None = None
        if rules.key_by == "alias" or target.key == slot.keyed_on:
            cost = cost_of(usage, target.price).nanos / 1e9 if usage is not None else 0.0
            seconds = time.perf_counter() - slot.started
            data = entries.encode(
                entries.Entry(time.time(), target.provider, target.model, seconds, cost, response, events)
            )
            if len(data) <= rules.max_entry_bytes and await self.store.set(status.key, data, rules.ttl_s):
                stats = self.stats[slot.tenant]
                stats.stores += 1
                stats.bytes_written += len(data)
                shared = data
        if slot.flight is not None:
            slot.flight.land(shared)

    async def purge_tenant(self, tenant: str) -> int:
        """Remove every entry of a tenant (not shared entries; purge ``*`` for those)."""
        return await self.store.purge_scope(tenant)

    async def purge_key(self, key: str) -> int:
        """Remove one entry by its key (as sent in ``x-crossway-cache-key``)."""
        return await self.store.delete(key)


def _cacheable(request: ChatRequest, rules: CacheRules, directive: Directive | None) -> bool:
    if rules.cacheable == "all":
        return True
    if rules.cacheable == "opt_in":
        return directive in ("use", "refresh")
    return request.temperature == 0 or request.seed is not None
