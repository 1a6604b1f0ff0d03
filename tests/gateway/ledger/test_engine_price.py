"""A self-hosted engine's price: its GPU cost per hour over the throughput measured on its requests."""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ledger.prices import PriceBook
from gateway.ledger.throughput import BusyTime, Served, Throughput, busy_seconds, engine_token_price
from gateway.policy import Price, ProviderConfig, Target
from gateway.store.db import Database
from tests.gateway.e2e.conftest import start_gateway
from tests.gateway.ledger.helpers import rows

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream

GPU_PER_HOUR = 3.6  # one thousandth of a dollar per second


def test_busy_seconds_is_the_union_of_the_intervals() -> None:
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 2), (1, 3), (2.5, 2.75), (5, 6)]) == pytest.approx(4.0)


def test_throughput_shares_the_seconds_of_concurrent_requests() -> None:
    meter = Throughput(window_s=100)
    assert meter.tokens_per_s("local/m") is None
    meter.observe("local/m", 0.0, 2.0, 40)
    assert meter.tokens_per_s("local/m") == pytest.approx(20.0)
    meter.observe("local/m", 0.0, 2.0, 40)  # batched with the first: the same two GPU-seconds
    assert meter.tokens_per_s("local/m") == pytest.approx(40.0)
    meter.observe("local/m", 10.0, 11.0, 10)  # alone, after an idle gap that costs nobody
    assert meter.tokens_per_s("local/m") == pytest.approx(90 / 3)


def test_throughput_forgets_requests_older_than_its_window() -> None:
    meter = Throughput(window_s=10)
    meter.observe("e", 0.0, 1.0, 1000)
    meter.observe("e", 20.0, 22.0, 10)
    assert meter.tokens_per_s("e") == pytest.approx(5.0)


class _Recomputed:
    """The throughput as first written: the window's union recomputed (sorted) for every price."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.served: deque[Served] = deque()

    def observe(self, start: float, end: float, tokens: int) -> None:
        if tokens <= 0 or end <= start:
            return
        self.served.append(Served(start, end, tokens))
        while self.served and self.served[0].end < end - self.window_s:
            self.served.popleft()

    def tokens_per_s(self) -> float | None:
        if not self.served:
            return None
        busy = busy_seconds((s.start, s.end) for s in self.served)
        return sum(s.tokens for s in self.served) / busy if busy > 0 else None


# Ends mostly move forward (by 0 to 4 s, on a half-second grid so that intervals touch and tie, or
# by any float), sometimes back (a request reported late); lengths up to past the 10 s window.
_STEP = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0]), st.floats(0.0, 4.0))
_BACK = st.one_of(st.just(0.0), st.just(0.0), st.floats(0.0, 12.0), st.sampled_from([0.5, 3.0, 11.0]))
_LENGTH = st.one_of(st.sampled_from([0.5, 1.0, 3.0, 10.0, 14.0]), st.floats(0.0, 14.0))
_REQUESTS = st.lists(st.tuples(_STEP, _BACK, _LENGTH, st.integers(0, 50)), max_size=120)


@settings(max_examples=400, deadline=None)
@given(_REQUESTS)
def test_throughput_kept_incrementally_equals_the_window_recomputed(requests) -> None:
    """Late, overlapping, touching and expiring intervals: every price reads what a full recount gives."""
    meter, recount = Throughput(window_s=10.0), _Recomputed(10.0)
    now = 1000.0
    for step, back, length, tokens in requests:
        now += step
        end = now - back
        meter.observe("e", end - length, end, tokens)
        recount.observe(end - length, end, tokens)
        expected = recount.tokens_per_s()
        assert meter.tokens_per_s("e") == (pytest.approx(expected, rel=1e-9) if expected is not None else None)


@settings(max_examples=400, deadline=None)
@given(_REQUESTS)
def test_busy_time_is_the_union_of_the_requests_it_holds(requests) -> None:
    busy = BusyTime()
    now = 1000.0
    for step, back, length, tokens in requests:
        now += step
        end = now - back
        if length > 0:
            busy.add(end - length, end, tokens)
        busy.expire(now - 10.0)
        assert busy.seconds == pytest.approx(busy_seconds((s.start, s.end) for s in busy.served), rel=1e-9, abs=1e-9)
        assert busy.tokens == sum(s.tokens for s in busy.served)


def test_busy_time_keeps_what_a_later_request_still_covers_of_one_that_left() -> None:
    busy = BusyTime()
    busy.add(0.0, 100.0, 1)
    busy.add(50.0, 400.0, 1)  # overlaps the first: one busy stretch [0, 400]
    busy.expire(101.0)  # the first leaves; [50, 100] was the second's too
    assert busy.seconds == 350.0
    assert [s.start for s in busy.served] == [50.0]


def test_engine_token_price_is_gpu_dollars_per_second_over_tokens_per_second() -> None:
    price = engine_token_price(GPU_PER_HOUR, tokens_per_s=50.0, prefill_cost_ratio=0.1)
    assert price.output == pytest.approx(0.001 / 50 * 1e6)  # $20 per million output tokens
    assert price.input == pytest.approx(2.0)


def _config(name: str, kind: str, gpu: float | None) -> ProviderConfig:
    return ProviderConfig(name, kind, "http://x", None, 1.0, 1.0, gpu_dollars_per_hour=gpu)  # type: ignore[arg-type]


def test_price_book_derives_engine_prices_and_keeps_list_prices_first() -> None:
    engine = _config("local", "selfhost", GPU_PER_HOUR)
    api = _config("openai", "openai", None)
    configs = {"local": engine, "openai": api}
    book = PriceBook(lambda t: configs.get(t.provider))
    now = datetime.now(UTC)
    local, listed, vendor = Target("local", "m"), Target("local", "m2", price=Price(1, 2)), Target("openai", "gpt")
    assert book.price_for(local, now).price is None  # nothing measured yet
    book.observe(local, 0.0, 1.0, 100)
    book.observe(vendor, 0.0, 1.0, 100)  # not an engine: not measured
    book.observe(listed, 0.0, 1.0, 100)  # a list price wins over the GPU cost
    assert book.price_for(local, now).price == engine_token_price(GPU_PER_HOUR, 100.0, engine.prefill_cost_ratio)
    assert book.price_for(listed, now).price == Price(1, 2)
    assert book.price_for(vendor, now).price is None
    assert book.throughput.tokens_per_s("openai/gpt") is None


POLICY = """
providers:
  engine: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY, gpu_dollars_per_hour: {gpu}}}
models:
  local-test: {{targets: [{{provider: engine, model: long-stream-30}}]}}
"""


def test_engine_records_are_priced_from_gpu_cost_and_measured_tokens_per_second(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The engine server (an OpenAI-compatible provider with a GPU cost) bills what its GPU-seconds cost."""
    server, key = start_gateway(upstream, tmp_path, POLICY.format(url=upstream.url, gpu=GPU_PER_HOUR))
    try:
        with openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0) as client:
            for i in range(2):  # one after the other: their intervals do not overlap
                client.chat.completions.create(
                    model="local-test",
                    messages=[{"role": "user", "content": "go"}],
                    extra_headers={"x-request-id": f"e{i}"},
                )
    finally:
        server.stop()

    async def read() -> list:
        async with Database.connect(server.settings.database_url) as db:
            return await rows(db)

    first, second = sorted(asyncio.run(read()), key=lambda r: r.request_id)
    assert first.deployment == "engine/long-stream-30"
    assert first.output_tokens > 0

    def expected(records) -> int:
        tokens_per_s = sum(r.output_tokens for r in records) / sum(r.latency_ms / 1000 for r in records)
        price = engine_token_price(GPU_PER_HOUR, tokens_per_s, 0.1)
        last = records[-1]
        return round((last.input_tokens * price.input + last.output_tokens * price.output) * 1000)

    assert first.cost_nanos > 0
    assert first.price_id is None  # derived, not a stored price version
    assert abs(first.cost_nanos - expected([first])) <= 2  # latency_ms is a float copy of the same seconds
    assert abs(second.cost_nanos - expected([first, second])) <= 2
