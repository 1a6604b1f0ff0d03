"""A budgeted stream whose upstream ignores ``max_tokens`` is stopped with a budget error, and billed.

Through the real gateway in front of the fake vendors: ``long-stream-400-ignore-max-tokens`` streams
400 deltas whatever ``max_tokens`` says. With a budget on the tenant, the stream ends early with an
error event in the caller's format; the record bills the tokens produced. Without a budget, or with
an upstream that keeps to ``max_tokens``, the stream runs to its end.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anthropic
import httpx
import openai
import pytest

from gateway.store.db import Database
from gateway.tokens import count_text
from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway
from tests.gateway.ledger.helpers import rows

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream
    from tests.gateway.e2e.server import GatewayServer

POLICY = """
providers:
  openai: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY, timeout_s: 5}}
  anthropic: {{kind: anthropic, base_url: "{url}", api_key_env: ANTHROPIC_API_KEY, timeout_s: 5}}
models:
  runaway: {{targets: [{{provider: openai, model: long-stream-400-ignore-max-tokens, price: {{input: 1, output: 2}}}}]}}
  runaway-claude: {{targets: [{{provider: anthropic, model: long-stream-400-ignore-max-tokens, price: {{input: 1, output: 2}}}}]}}
  honest: {{targets: [{{provider: openai, model: gpt-4o-mini, price: {{input: 1, output: 2}}}}]}}
"""
MSGS = [{"role": "user", "content": "go"}]
CAP = 20


@pytest.fixture
def served(upstream: FakeUpstream, tmp_path: Path) -> Iterator[tuple[GatewayServer, str, str]]:
    """A gateway; ``acme`` (its key) has a budget, ``free`` (the other key) has none."""
    server, acme = start_gateway(upstream, tmp_path, POLICY.format(url=upstream.url))
    try:
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
            admin.put("/admin/finance/limits", json={"tenant": "acme", "budget_hard_usd": 5.0}).raise_for_status()
            free = admin.post("/admin/keys", json={"tenant": "free"}).raise_for_status().json()["key"]
        yield server, acme, free
    finally:
        server.stop()


def _records(server: GatewayServer) -> list:
    async def read() -> list:
        async with Database.connect(server.settings.database_url) as db:
            return await rows(db)

    return asyncio.run(read())


def _read(stream, into: list[str]) -> None:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            into.append(chunk.choices[0].delta.content)


def test_stream_past_its_reservation_is_stopped_with_a_budget_error_and_billed(served) -> None:
    server, acme, _ = served
    received: list[str] = []
    with openai.OpenAI(api_key=acme, base_url=f"{server.url}/v1", max_retries=0, timeout=20) as client:
        stream = client.chat.completions.create(model="runaway", messages=MSGS, max_tokens=CAP, stream=True)
        with pytest.raises(openai.APIError, match="Stream stopped") as info:
            _read(stream, received)
    assert info.value.code == "budget_exceeded"
    assert 0 < len(received) < 400
    assert count_text("".join(received)) <= CAP + CAP // 4 + 8  # never past the limit that stops it
    server.stop()  # a graceful stop flushes the records
    [record] = [r for r in _records(server) if r.alias == "runaway"]
    assert (record.status, record.error) == (402, "BudgetExceeded")
    assert record.usage_source == "estimate"
    assert count_text("".join(received)) <= record.output_tokens <= CAP + CAP // 4 + 8 + 2
    assert record.cost_nanos == record.input_tokens * 1000 + record.output_tokens * 2000


def test_anthropic_caller_gets_the_budget_error_as_an_anthropic_error_event(served) -> None:
    server, acme, _ = served
    with (
        anthropic.Anthropic(api_key=acme, base_url=server.url, max_retries=0, timeout=20) as client,
        client.messages.stream(model="runaway-claude", max_tokens=CAP, messages=MSGS) as stream,
        pytest.raises(anthropic.APIStatusError, match="Stream stopped"),
    ):
        stream.get_final_message()


def test_stream_without_a_budget_or_within_its_cap_runs_to_its_end(served) -> None:
    server, acme, free = served
    with openai.OpenAI(api_key=free, base_url=f"{server.url}/v1", max_retries=0, timeout=20) as client:
        chunks = list(client.chat.completions.create(model="runaway", messages=MSGS, max_tokens=CAP, stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 400  # no budget: not watched
    words = " ".join(["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran"] * 3)  # a token each
    with openai.OpenAI(api_key=acme, base_url=f"{server.url}/v1", max_retries=0, timeout=20) as client:
        chunks = list(
            client.chat.completions.create(
                model="honest", messages=[{"role": "user", "content": words}], max_tokens=CAP, stream=True
            )
        )
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason is not None
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == CAP  # cut at max_tokens upstream
