"""A self-hosted engine's price: its GPU cost per hour over the throughput measured on its requests."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import openai
import pytest

from gateway.ledger.prices import PriceBook
from gateway.ledger.throughput import Throughput, busy_seconds, engine_token_price
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
