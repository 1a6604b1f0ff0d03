"""Rate-limit headers on served responses, through the real gateway and the vendors' SDKs.

OpenAI's names (``x-ratelimit-*``) on ``/v1/chat/completions``, Anthropic's (``anthropic-ratelimit-*``)
on ``/v1/messages``, JSON and streamed, and only for a tenant with limits configured.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import anthropic
import httpx
import openai
import pytest

from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.fakes.upstream import FakeUpstream
    from tests.gateway.e2e.server import GatewayServer

MSGS = [{"role": "user", "content": "hello there"}]
RPM, TPM = 1000, 100_000
OPENAI_RESET = re.compile(r"^(\d+ms|\d+(\.\d+)?s|\d+m\d+(\.\d+)?s)$")


@pytest.fixture(scope="module")
def served(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayServer, str, str]]:
    """A gateway with two tenants: ``acme`` without limits, ``limited`` with RPM and TPM on the tenant."""
    server, acme_key = start_gateway(upstream, tmp_path_factory.mktemp("headers"))
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
        limited_key = admin.post("/admin/keys", json={"tenant": "limited"}).raise_for_status().json()["key"]
        admin.put("/admin/finance/limits", json={"tenant": "limited", "rpm": RPM, "tpm": TPM}).raise_for_status()
    try:
        yield server, acme_key, limited_key
    finally:
        server.stop()


def _openai(server: GatewayServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0)


def test_openai_json_response_carries_x_ratelimit_headers_when_limits_apply(served) -> None:
    server, _, key = served
    with _openai(server, key) as client:
        first = client.chat.completions.with_raw_response.create(model="gpt-test", messages=MSGS, max_tokens=50)
        second = client.chat.completions.with_raw_response.create(model="gpt-test", messages=MSGS, max_tokens=50)
    assert first.parse().choices[0].message.content
    h1, h2 = first.headers, second.headers
    assert h1["x-ratelimit-limit-requests"] == str(RPM)
    assert h1["x-ratelimit-limit-tokens"] == str(TPM)
    assert int(h2["x-ratelimit-remaining-requests"]) == int(h1["x-ratelimit-remaining-requests"]) - 1
    assert int(h1["x-ratelimit-remaining-tokens"]) <= TPM - 50  # the prompt estimate plus max_tokens
    assert int(h2["x-ratelimit-remaining-tokens"]) < int(h1["x-ratelimit-remaining-tokens"])
    assert OPENAI_RESET.match(h1["x-ratelimit-reset-requests"]), h1["x-ratelimit-reset-requests"]
    assert OPENAI_RESET.match(h1["x-ratelimit-reset-tokens"]), h1["x-ratelimit-reset-tokens"]


def test_openai_stream_carries_x_ratelimit_headers(served) -> None:
    server, _, key = served
    with _openai(server, key) as client:
        raw = client.chat.completions.with_raw_response.create(model="gpt-test", messages=MSGS, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text
    assert raw.headers["x-ratelimit-limit-requests"] == str(RPM)
    assert int(raw.headers["x-ratelimit-remaining-requests"]) < RPM
    assert "x-ratelimit-remaining-tokens" in raw.headers


def test_anthropic_messages_carry_anthropic_ratelimit_headers_json_and_stream(served) -> None:
    server, _, key = served
    before = datetime.now(UTC).replace(microsecond=0)
    with anthropic.Anthropic(api_key=key, base_url=server.url, max_retries=0) as client:
        raw = client.messages.with_raw_response.create(model="claude-test", max_tokens=50, messages=MSGS)
        streamed = client.messages.with_raw_response.create(
            model="claude-test", max_tokens=50, messages=MSGS, stream=True
        )
        events = [e.type for e in streamed.parse()]
    assert raw.parse().content[0].text  # type: ignore[union-attr]
    assert "message_stop" in events
    for headers in (raw.headers, streamed.headers):
        assert headers["anthropic-ratelimit-requests-limit"] == str(RPM)
        assert headers["anthropic-ratelimit-tokens-limit"] == str(TPM)
        assert int(headers["anthropic-ratelimit-requests-remaining"]) < RPM
        assert int(headers["anthropic-ratelimit-tokens-remaining"]) < TPM
        reset = datetime.fromisoformat(headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00"))
        assert before <= reset <= before + timedelta(seconds=121)  # at most two windows ahead
        assert "x-ratelimit-limit-requests" not in headers


def test_no_ratelimit_headers_without_limits(served) -> None:
    server, key, _ = served
    with _openai(server, key) as client:
        raw = client.chat.completions.with_raw_response.create(model="gpt-test", messages=MSGS)
    assert raw.headers["x-crossway-deployment"]  # a served response...
    assert not [h for h in raw.headers if "ratelimit" in h]  # ...with no rate-limit headers


@pytest.fixture(scope="module")
def strict_key(served) -> str:
    """A tenant allowed two requests a minute."""
    server, _, _ = served
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
        key = admin.post("/admin/keys", json={"tenant": "strict"}).raise_for_status().json()["key"]
        admin.put("/admin/finance/limits", json={"tenant": "strict", "rpm": 2}).raise_for_status()
    return key


def test_429_carries_retry_after_and_the_exhausted_standing_in_both_styles(served, strict_key) -> None:
    server, _, _ = served
    with _openai(server, strict_key) as client:
        ok = client.chat.completions.with_raw_response.create(model="gpt-test", messages=MSGS)
        assert ok.headers["x-ratelimit-remaining-requests"] == "1"
        client.chat.completions.create(model="gpt-test", messages=MSGS)
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="gpt-test", messages=MSGS)
    h = limited.value.response.headers
    assert int(h["retry-after"]) >= 1
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "0")
    assert OPENAI_RESET.match(h["x-ratelimit-reset-requests"])
    with (
        anthropic.Anthropic(api_key=strict_key, base_url=server.url, max_retries=0) as client,
        pytest.raises(anthropic.RateLimitError) as refused,
    ):
        client.messages.create(model="claude-test", max_tokens=20, messages=MSGS)
    a = refused.value.response.headers
    assert (a["anthropic-ratelimit-requests-limit"], a["anthropic-ratelimit-requests-remaining"]) == ("2", "0")
    assert datetime.fromisoformat(a["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00")) > datetime.now(UTC)
    assert int(a["retry-after"]) >= 1
