"""Behaviours every adapter shares, run against each fake vendor over real loopback HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway.errors import (
    InvalidRequest,
    ProviderBadResponse,
    ProviderRateLimited,
    ProviderTimeout,
    ProviderUnavailable,
)
from gateway.providers import AnthropicProvider, GeminiProvider, OpenAIProvider, build_providers
from gateway.types import Finish, StreamEvent, TextDelta, UsageEvent
from tests.gateway.providers.conftest import (
    KINDS,
    MOCK_URL,
    BrokenStream,
    Recorder,
    chat,
    collect,
    drain,
    free_port,
    make_config,
)

pytestmark = pytest.mark.parametrize("kind", KINDS)


async def test_chat_echoes_the_last_user_turn(live, kind):
    response = await live(kind).chat(chat("ping 1"), "some-model")
    assert response.content == "echo: ping 1"
    assert response.finish_reason == "stop"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens == 3


async def test_stream_yields_deltas_then_one_finish_then_usage(live, kind):
    events = await collect(live(kind), chat("ping 2"), "some-model")
    assert events[:4] == [TextDelta("echo:"), TextDelta(" ping"), TextDelta(" 2"), Finish("stop")]
    assert len(events) == 5 and isinstance(events[4], UsageEvent) and events[4].usage.output_tokens == 3


async def test_long_stream_delivers_every_delta_in_order(live, kind):
    events = await collect(live(kind), chat(), "long-stream-300")
    assert [e.text for e in events if isinstance(e, TextDelta)] == [f" tok{i}" for i in range(300)]
    assert events[-2] == Finish("stop")


async def test_max_tokens_below_answer_length_finishes_with_length(live, kind):
    response = await live(kind).chat(chat("one two three", max_tokens=2), "some-model")
    assert (response.content, response.finish_reason) == ("echo: one", "length")


async def test_rate_limit_maps_to_provider_rate_limited_with_retry_after(live, kind):
    with pytest.raises(ProviderRateLimited) as info:
        await live(kind).chat(chat(), "error-429")
    assert info.value.retry_after == 1.0 and info.value.retryable


@pytest.mark.parametrize("status", [500, 503, 529])
async def test_server_errors_map_to_provider_unavailable(live, kind, status):
    with pytest.raises(ProviderUnavailable):
        await live(kind).chat(chat(), f"error-{status}")
    with pytest.raises(ProviderUnavailable):
        await collect(live(kind), chat(), f"error-{status}")


async def test_bad_request_maps_to_invalid_request(live, kind):
    with pytest.raises(InvalidRequest):
        await live(kind).chat(chat(), "error-400")


async def test_upstream_401_maps_to_bad_response_without_the_key(live, kind):
    with pytest.raises(ProviderBadResponse) as info:
        await live(kind).chat(chat(), "error-401")
    assert "401" in info.value.message


async def test_wrong_key_is_reported_without_echoing_it(live, kind):
    secret = "sk-wrong-secret-123456"
    for call in (lambda p: p.chat(chat(), "m"), lambda p: collect(p, chat(), "m")):
        with pytest.raises(ProviderBadResponse) as info:
            await call(live(kind, api_key=secret))
        assert secret not in str(info.value) and secret not in repr(info.value.args)


async def test_vendor_message_that_echoes_the_key_is_scrubbed(mocked, kind):
    body = b'{"error": {"message": "bad value near sk-real-key-999", "type": "invalid_request_error"}}'
    provider = mocked(kind, Recorder(body, status=400), api_key="sk-real-key-999")
    with pytest.raises(InvalidRequest) as info:
        await provider.chat(chat(), "m")
    assert "sk-real-key-999" not in str(info.value) and "***" in str(info.value)


async def test_slow_upstream_beyond_timeout_raises_provider_timeout(live, kind):
    provider = live(kind, timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        await provider.chat(chat(), "slow-3000")
    with pytest.raises(ProviderTimeout):
        await collect(provider, chat(), "slow-3000")
    assert time.monotonic() - started < 2


async def test_slow_upstream_within_timeout_answers(live, kind):
    assert (await live(kind).chat(chat("x"), "slow-50")).content == "echo: x"


async def test_connection_refused_raises_provider_unavailable(client, kind):
    config = make_config(kind, f"http://127.0.0.1:{free_port()}")
    provider = build_providers({kind: config}, client)[kind]
    with pytest.raises(ProviderUnavailable):
        await provider.chat(chat(), "m")
    with pytest.raises(ProviderUnavailable):
        await collect(provider, chat(), "m")


async def test_stream_raises_when_cut_before_its_terminator(live, kind):
    provider = live(kind)
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderBadResponse):
        await drain(provider.stream(chat(), "cut-stream"), seen)
    assert seen == [TextDelta("partial"), TextDelta(" answer")]  # never a Finish


async def test_stream_raises_when_connection_drops_mid_body(mocked, kind):
    first = {
        "openai": b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n',
        "anthropic": b'event: message_start\ndata: {"type":"message_start","message":{"content":[],"usage":{"input_tokens":1}}}\n\n',
        "gemini": b'data: {"candidates":[{"content":{"parts":[{"text":"hi"}]}}]}\r\n\r\n',
    }[kind]
    provider = mocked(kind, Recorder(BrokenStream(first)))
    with pytest.raises(ProviderBadResponse, match="cut the stream"):
        await collect(provider, chat(), "m")


async def test_in_stream_error_event_raises_the_mapped_error(live, kind):
    with pytest.raises(ProviderUnavailable):
        await collect(live(kind), chat(), "stream-error")


async def test_malformed_json_raises_bad_response(live, kind):
    provider = live(kind)
    with pytest.raises(ProviderBadResponse, match="malformed JSON"):
        await provider.chat(chat(), "bad-json")
    with pytest.raises(ProviderBadResponse, match="malformed JSON"):
        await provider.chat(chat(), "cut-stream")  # the JSON body is cut in half
    with pytest.raises(ProviderBadResponse, match="malformed JSON"):
        await collect(provider, chat(), "bad-json")


async def test_build_providers_picks_the_adapter_and_shares_the_client(kind):
    transport = Recorder()
    async with httpx.AsyncClient(transport=httpx.MockTransport(transport)) as shared:
        config = make_config(kind, MOCK_URL, timeout_s=7.0, connect_timeout_s=0.5, headers={"x-team": "search"})
        provider = build_providers({"p": config}, shared)["p"]
        expected = {"openai": OpenAIProvider, "anthropic": AnthropicProvider, "gemini": GeminiProvider}[kind]
        assert type(provider) is expected and provider.config is config
        assert getattr(provider, "_up").client is shared  # noqa: B009 - the private handle is the point
        with pytest.raises(ProviderBadResponse):
            await provider.chat(chat(), "m")  # b"{}" is not a usable answer
    sent = transport.requests[-1]
    assert sent.extensions["timeout"] == {"connect": 0.5, "read": 7.0, "write": 7.0, "pool": 7.0}
    assert sent.headers["x-team"] == "search" and sent.headers["content-type"] == "application/json"


async def test_finished_streams_give_their_connection_back_to_the_pool(live, client, kind):
    provider = live(kind)
    for _ in range(3):
        assert (await collect(provider, chat(), "m"))[-2] == Finish("stop")
    pool = client._transport._pool  # httpx internals: the only view of pooled connections
    assert len(pool.connections) == 1 and pool.connections[0].is_idle()
