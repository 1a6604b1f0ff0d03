"""ResponseCache: policy modes, directives, single flight, and what is (never) stored."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.cache.entry import decode
from gateway.cache.key import cache_key
from gateway.cache.responses import ResponseCache
from gateway.cache.store import MemoryStore, RedisStore
from gateway.errors import ProviderUnavailable
from gateway.policy import CacheRules, Price, Target
from gateway.types import ChatRequest, ChatResponse, Finish, Message, TextDelta, TextPart, Usage, UsageEvent

TARGET = Target("openai", "gpt-4o-mini", price=Price(input=2.0, output=8.0))
ON = CacheRules(mode="on", ttl_s=60)


def make_request(text: str = "ping", tenant: str = "acme", **overrides) -> ChatRequest:
    fields = {"model": "gpt-test", "messages": [Message("user", [TextPart(text)])], "temperature": 0.0}
    fields.update(overrides)
    request = ChatRequest(**fields)
    request.tenant = tenant
    return request


def answer(text: str = "pong") -> ChatResponse:
    return ChatResponse("gpt-4o-mini", text, usage=Usage(1000, 500))


@pytest.fixture
def cache() -> ResponseCache:
    return ResponseCache(MemoryStore(1 << 20))


async def test_second_identical_request_hits_with_the_stored_answer_and_its_savings(cache):
    first = await cache.open(make_request(), ON, TARGET.key)
    assert first.hit is None and first.status is not None and first.status.outcome == "miss"
    await first.store(answer(), TARGET)
    second = await cache.open(make_request(), ON, TARGET.key)
    assert second.hit is not None and second.hit.response == answer()
    assert second.status is not None and second.status.outcome == "hit" and second.status.age_s is not None
    assert second.status.headers()["x-crossway-cache"] == "hit"
    stats = cache.stats["acme"]
    assert (stats.hits, stats.misses, stats.stores) == (1, 1, 1)
    assert stats.saved_usd == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)


async def test_cache_off_returns_no_status_and_stores_nothing(cache):
    slot = await cache.open(make_request(), CacheRules(mode="off"), TARGET.key)
    assert slot.status is None and slot.hit is None
    await slot.store(answer(), TARGET)
    assert (await cache.store.info()).entries == 0


async def test_other_tenants_never_see_an_entry_unless_the_policy_shares_them(cache):
    await (await cache.open(make_request(tenant="acme"), ON, TARGET.key)).store(answer(), TARGET)
    assert (await cache.open(make_request(tenant="globex"), ON, TARGET.key)).hit is None
    shared = CacheRules(mode="on", shared_across_tenants=True)
    await (await cache.open(make_request(tenant="acme"), shared, TARGET.key)).store(answer(), TARGET)
    assert (await cache.open(make_request(tenant="globex"), shared, TARGET.key)).hit is not None


@pytest.mark.parametrize(
    ("rules", "directive", "overrides", "outcome"),
    [
        (ON, "bypass", {}, "bypass"),
        (ON, None, {"temperature": 0.7}, "bypass"),  # deterministic only: neither temperature 0 nor a seed
        (ON, None, {"temperature": 0.7, "seed": 1}, "miss"),
        (CacheRules(mode="on", cacheable="opt_in"), None, {}, "bypass"),
        (CacheRules(mode="on", cacheable="opt_in"), "use", {}, "miss"),
        (CacheRules(mode="on", cacheable="all"), None, {"temperature": 1.0}, "miss"),
        (ON, "refresh", {}, "refresh"),
    ],
)
async def test_policy_and_directive_decide_the_outcome(cache, rules, directive, overrides, outcome):
    slot = await cache.open(make_request(**overrides), rules, TARGET.key, directive)
    assert slot.status is not None and slot.status.outcome == outcome


async def test_refresh_skips_the_stored_entry_and_replaces_it(cache):
    await (await cache.open(make_request(), ON, TARGET.key)).store(answer("old"), TARGET)
    slot = await cache.open(make_request(), ON, TARGET.key, "refresh")
    assert slot.hit is None
    await slot.store(answer("new"), TARGET)
    hit = (await cache.open(make_request(), ON, TARGET.key)).hit
    assert hit is not None and hit.response is not None and hit.response.content == "new"


async def test_read_only_serves_but_never_stores_and_write_only_stores_but_never_serves(cache):
    read_only, write_only = CacheRules(mode="read_only"), CacheRules(mode="write_only")
    await (await cache.open(make_request(), read_only, TARGET.key)).store(answer(), TARGET)
    assert (await cache.store.info()).entries == 0
    await (await cache.open(make_request(), write_only, TARGET.key)).store(answer(), TARGET)
    assert (await cache.store.info()).entries == 1
    assert (await cache.open(make_request(), write_only, TARGET.key)).hit is None
    assert (await cache.open(make_request(), read_only, TARGET.key)).hit is not None


async def test_an_answer_over_max_entry_bytes_is_not_stored(cache):
    rules = CacheRules(mode="on", max_entry_bytes=64)
    await (await cache.open(make_request(), rules, TARGET.key)).store(answer("x" * 100), TARGET)
    assert (await cache.store.info()).entries == 0


async def _upstream_once(cache: ResponseCache, calls: list[int], fail: bool = False) -> str:
    """One request through the cache to a counting upstream that takes 20 ms."""
    slot = await cache.open(make_request(), ON, TARGET.key)
    if slot.hit is not None:
        assert slot.hit.response is not None
        return "hit:" + slot.hit.response.content
    calls.append(1)
    await asyncio.sleep(0.02)
    if fail:
        raise ProviderUnavailable("upstream down")
    await slot.store(answer(), TARGET)
    return "upstream"


async def test_single_flight_makes_one_upstream_call_for_50_concurrent_identical_requests(cache):
    calls: list[int] = []
    results = await asyncio.gather(*(asyncio.create_task(_upstream_once(cache, calls)) for _ in range(50)))
    assert len(calls) == 1
    assert sorted(results) == ["hit:pong"] * 49 + ["upstream"]
    assert cache.flights.shared == 49 and not cache.flights.flights


async def test_an_upstream_failure_is_never_cached_nor_shared(cache):
    calls: list[int] = []
    leader = asyncio.create_task(_upstream_once(cache, calls, fail=True))
    await asyncio.sleep(0)  # the leader takes the flight first
    followers = [asyncio.create_task(_upstream_once(cache, calls)) for _ in range(3)]
    with pytest.raises(ProviderUnavailable):
        await leader
    assert await asyncio.gather(*followers) == ["upstream"] * 3  # the failure was not handed on: each asked
    assert len(calls) == 4
    assert cache.flights.shared == 0 and not cache.flights.flights
    assert (await cache.store.info()).entries == 1  # what the followers fetched (one key, one entry); no failure


async def test_a_cancelled_leader_releases_its_followers(cache):
    leader_slot: list[object] = []

    async def leader() -> None:
        leader_slot.append(await cache.open(make_request(), ON, TARGET.key))
        await asyncio.sleep(10)

    task = asyncio.create_task(leader())
    await asyncio.sleep(0.01)
    follower = asyncio.create_task(cache.open(make_request(), ON, TARGET.key))
    await asyncio.sleep(0.01)
    task.cancel()
    slot = await asyncio.wait_for(follower, 1)
    assert slot.hit is None and slot.status is not None and slot.status.outcome == "miss"


def _events(text: str) -> list:
    return [TextDelta(w) for w in text.split(" ")] + [Finish("stop"), UsageEvent(Usage(10, 3))]


async def _drain(stream) -> list:
    return [e async for e in stream]


async def test_a_complete_stream_is_stored_event_for_event(cache):
    request = make_request(stream=True)
    slot = await cache.open(request, ON, TARGET.key)

    async def upstream():
        for event in _events("a b c"):
            yield event

    assert await _drain(slot.tee(upstream(), TARGET)) == _events("a b c")
    hit = (await cache.open(request, ON, TARGET.key)).hit
    assert hit is not None and hit.events == _events("a b c") and hit.response is None
    assert (await cache.open(make_request(stream=False), ON, TARGET.key)).hit is None  # its own entry


@pytest.mark.parametrize("how", ["error", "no_usage", "client_left"])
async def test_a_stream_that_does_not_end_properly_is_not_stored(cache, how):
    request = make_request(stream=True)
    slot = await cache.open(request, ON, TARGET.key)

    async def upstream():
        yield TextDelta("partial")
        if how == "error":
            raise ProviderUnavailable("cut")
        yield Finish("stop")
        if how == "client_left":
            yield UsageEvent(Usage(1, 1))

    stream = slot.tee(upstream(), TARGET)
    if how == "error":
        with pytest.raises(ProviderUnavailable):
            await _drain(stream)
    elif how == "client_left":
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
    else:
        await _drain(stream)
    assert (await cache.store.info()).entries == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_redis_down_means_bypass_never_an_error():
    cache = ResponseCache(RedisStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0"))
    first = await cache.open(make_request(), ON, TARGET.key)
    assert first.status is not None and first.status.outcome == "bypass"
    await first.store(answer(), TARGET)  # nothing raised
    second = await cache.open(make_request(), ON, TARGET.key)
    assert second.status is not None and second.status.outcome == "bypass" and second.hit is None
    await cache.store.aclose()


async def test_entries_round_trip_through_redis(scope):
    cache = ResponseCache(RedisStore.from_url("redis://127.0.0.1:6379/0"))
    slot = await cache.open(make_request(tenant=scope), ON, TARGET.key)
    await slot.store(answer(), TARGET)
    hit = await cache.open(make_request(tenant=scope), ON, TARGET.key)
    assert hit.hit is not None and hit.hit.response == answer()
    assert await cache.purge_tenant(scope) == 1
    assert (await cache.open(make_request(tenant=scope), ON, TARGET.key)).hit is None
    await cache.purge_tenant(scope)
    await cache.store.aclose()


def test_decode_reads_foreign_bytes_as_a_miss():
    assert decode(b"\x93garbage") is None


async def test_a_follower_stops_waiting_after_flight_wait_s_and_goes_upstream(cache):
    rules = CacheRules(mode="on", flight_wait_s=0.05)
    leader = await cache.open(make_request(), rules, TARGET.key)
    assert leader.flight is not None
    follower = await cache.open(make_request(), rules, TARGET.key)
    assert follower.hit is None and follower.flight is None
    assert follower.status is not None and follower.status.outcome == "miss"
    assert await cache.flights.follow(cache_key(make_request(text="other"), "gpt-test", "acme"), 1) is None
    leader.flight.land(None)


async def test_key_by_deployment_never_stores_a_fallback_deployments_answer(cache):
    rules = CacheRules(mode="on", key_by="deployment")
    fallback = Target("anthropic", "claude-sonnet-4-5")
    await (await cache.open(make_request(), rules, TARGET.key)).store(answer(), fallback)
    assert (await cache.store.info()).entries == 0
    await (await cache.open(make_request(), rules, TARGET.key)).store(answer(), TARGET)
    assert (await cache.open(make_request(), rules, TARGET.key)).hit is not None
    assert (await cache.open(make_request(), rules, fallback.key)).hit is None


async def test_read_only_requests_lead_no_flight_so_none_wait_on_them(cache):
    rules = CacheRules(mode="read_only")
    first = await cache.open(make_request(), rules, TARGET.key)
    second = await asyncio.wait_for(cache.open(make_request(), rules, TARGET.key), 0.5)
    assert first.flight is None and second.flight is None and not cache.flights.flights
