"""AnthropicProvider: request and response translation, JSON emulation, named-event streams."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.errors import InvalidRequest, ProviderBadResponse, ProviderUnavailable
from gateway.providers.anthropic import JSON_TOOL
from gateway.types import (
    ChatRequest,
    EmbeddingRequest,
    Finish,
    ImagePart,
    Message,
    Part,
    ResponseFormat,
    StreamEvent,
    TextDelta,
    TextPart,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
    UsageEvent,
)
from tests.gateway.providers.conftest import MOCK_URL, Recorder, chat, collect, data, drain, sse, user

WEATHER = Tool("get_weather", "Weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}})
MESSAGE = (
    b'{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":'
    b'[{"type":"text","text":"Hello"},{"type":"text","text":" there"}],"stop_reason":"end_turn","stop_sequence":null,'
    b'"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":20,"output_tokens":7}}'
)


def _event(name: str, doc: dict[str, Any]) -> str:
    return f"event: {name}\n{data(doc)}"


async def test_anthropic_request_extracts_system_and_merges_tool_results(mocked):
    recorder = Recorder(MESSAGE)
    request = ChatRequest(
        model="alias",
        messages=[
            Message("system", [TextPart("Be terse.")]),
            user("Weather in Paris and Rome?"),
            Message(
                "assistant",
                [TextPart("Checking.")],
                tool_calls=[
                    ToolCall("toolu_1", "get_weather", '{"city":"Paris"}'),
                    ToolCall("toolu_2", "get_weather", ""),
                ],
            ),
            Message("tool", [TextPart("sunny")], tool_call_id="toolu_1"),
            Message("tool", [TextPart("no such city")], tool_call_id="toolu_2", is_error=True),
            user("Thanks"),
        ],
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop=["END"],
        user="u-1",
        seed=3,
        tools=[WEATHER],
    )
    await mocked("anthropic", recorder).chat(request, "claude-sonnet-4-5")
    sent = recorder.requests[-1]
    assert str(sent.url) == f"{MOCK_URL}/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-fake" and sent.headers["anthropic-version"] == "2023-06-01"
    assert recorder.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": "Be terse.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": True},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
        "tools": [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER.parameters}],
        "metadata": {"user_id": "u-1"},
    }


async def test_anthropic_several_system_messages_become_text_blocks(mocked):
    recorder = Recorder(MESSAGE)
    request = ChatRequest(
        model="a",
        messages=[Message("system", [TextPart("A")]), user("x"), Message("system", [TextPart("B")])],
        max_tokens=9,
    )
    await mocked("anthropic", recorder).chat(request, "m")
    assert recorder.json["system"] == [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    assert recorder.json["max_tokens"] == 9


async def test_anthropic_images_become_base64_or_url_sources(mocked):
    recorder = Recorder(MESSAGE)
    parts: list[Part] = [
        ImagePart(url="https://x.test/a.png"),
        ImagePart(url="data:image/webp;base64,UklG"),
        ImagePart(media_type="image/gif", data="R0lG"),
    ]
    await mocked("anthropic", recorder).chat(ChatRequest(model="a", messages=[Message("user", parts)]), "m")
    assert recorder.json["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklG"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"}},
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (ToolChoice("auto"), None, {"type": "auto"}),
        (ToolChoice("required"), None, {"type": "any"}),
        (ToolChoice("tool", "get_weather"), None, {"type": "tool", "name": "get_weather"}),
        (ToolChoice("none"), False, {"type": "none"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        (ToolChoice("required"), False, {"type": "any", "disable_parallel_tool_use": True}),
    ],
)
async def test_anthropic_tool_choice_and_parallel_calls_map(mocked, choice, parallel, expected):
    recorder = Recorder(MESSAGE)
    await mocked("anthropic", recorder).chat(
        chat(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=parallel), "m"
    )
    assert recorder.json["tool_choice"] == expected


async def test_anthropic_extras_are_merged_only_from_the_anthropic_wire(mocked):
    recorder = Recorder(MESSAGE)
    provider = mocked("anthropic", recorder)
    extra = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1}
    await provider.chat(chat(wire="anthropic", extra=extra, max_tokens=2000), "m")
    assert recorder.json["thinking"] == extra["thinking"] and recorder.json["max_tokens"] == 2000
    await provider.chat(chat(wire="openai", extra=extra), "m")
    assert "thinking" not in recorder.json


async def test_anthropic_chat_joins_text_and_counts_cache_tokens_as_input(mocked):
    response = await mocked("anthropic", Recorder(MESSAGE)).chat(chat(), "m")
    assert response.model == "claude-sonnet-4-5" and response.content == "Hello there"
    assert response.usage == Usage(input_tokens=35, output_tokens=7, cached_input_tokens=20, cache_write_tokens=5)


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ],
)
async def test_anthropic_stop_reasons_map_to_canonical(mocked, stop_reason, expected):
    body = msgspec.json.encode(
        {"content": [], "stop_reason": stop_reason, "usage": {"input_tokens": 1, "output_tokens": 1}}
    )
    assert (await mocked("anthropic", Recorder(body)).chat(chat(), "m")).finish_reason == expected


async def test_anthropic_tool_use_blocks_become_tool_calls(live):
    response = await live("anthropic").chat(chat(tools=[WEATHER]), "tool-claude")
    assert response.finish_reason == "tool_calls" and response.content.startswith("Let me")
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("get_weather", '{"city":"Paris"}')]
    assert response.tool_calls[0].id.startswith("toolu_")


@pytest.mark.parametrize(
    "fmt",
    [
        ResponseFormat("json_object"),
        ResponseFormat(
            "json_schema", name="a", schema={"type": "object", "properties": {"answer": {"type": "string"}}}
        ),
    ],
)
async def test_anthropic_json_format_is_emulated_with_a_forced_tool(live, upstream, fmt):
    provider = live("anthropic")
    response = await provider.chat(chat("hi", response_format=fmt), "json")
    assert (response.content, response.finish_reason, response.tool_calls) == ('{"answer":"echo: hi"}', "stop", [])
    body = upstream.requests[-1].body
    schema = fmt.schema or {"type": "object"}
    assert body["tools"][-1] == {
        "name": JSON_TOOL,
        "description": body["tools"][-1]["description"],
        "input_schema": schema,
    }
    assert body["tool_choice"] == {"type": "tool", "name": JSON_TOOL}

    events = await collect(provider, chat("hi", response_format=fmt), "json")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == '{"answer":"echo: hi"}'
    assert not any(isinstance(e, ToolCallDelta) for e in events) and Finish("stop") in events


async def test_anthropic_stream_translates_named_events_exactly(mocked):
    body = sse(
        _event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude",
                    "stop_reason": None,
                    "usage": {
                        "input_tokens": 25,
                        "cache_read_input_tokens": 100,
                        "cache_creation_input_tokens": 0,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        _event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        _event("ping", {"type": "ping"}),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me"}},
        ),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " check."}},
        ),
        _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {}},
            },
        ),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}},
        ),
        _event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": "Pa'},
            },
        ),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": 'ris"}'}},
        ),
        _event("content_block_stop", {"type": "content_block_stop", "index": 1}),
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 42},
            },
        ),
        _event("message_stop", {"type": "message_stop"}),
    )
    events = await collect(mocked("anthropic", Recorder(body)), chat(), "m")
    assert events == [
        TextDelta("Let me"),
        TextDelta(" check."),
        ToolCallDelta(0, "toolu_9", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city": "Pa'),
        ToolCallDelta(0, arguments='ris"}'),
        Finish("tool_calls"),
        UsageEvent(Usage(input_tokens=125, output_tokens=42, cached_input_tokens=100)),
    ]


async def test_anthropic_stream_raises_when_cut_before_message_stop(mocked):
    body = sse(
        _event("message_start", {"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 3}}}),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        ),
        _event(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        ),
    )
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderBadResponse, match="message_stop"):
        await drain(mocked("anthropic", Recorder(body)).stream(chat(), "m"), seen)
    assert seen == [TextDelta("Hi")]


async def test_anthropic_stream_error_event_raises_mapped_error(mocked):
    body = sse(_event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    with pytest.raises(ProviderUnavailable, match="Overloaded"):
        await collect(mocked("anthropic", Recorder(body)), chat(), "m")


async def test_anthropic_529_overloaded_maps_to_unavailable(mocked):
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    with pytest.raises(ProviderUnavailable, match="Overloaded"):
        await mocked("anthropic", Recorder(body, status=529)).chat(chat(), "m")


async def test_anthropic_default_max_tokens_satisfies_the_fake(live, upstream):
    await live("anthropic").chat(chat("marker-max"), "claude")
    assert upstream.requests[-1].body["max_tokens"] == 4096


async def test_anthropic_embed_is_an_invalid_request(live):
    with pytest.raises(InvalidRequest, match="no embeddings"):
        await live("anthropic").embed(EmbeddingRequest("e", ["a"]), "m")


async def test_anthropic_tool_call_arguments_must_be_a_json_object(mocked):
    request = ChatRequest(model="a", messages=[user("x"), Message("assistant", tool_calls=[ToolCall("t", "f", "[1]")])])
    with pytest.raises(InvalidRequest, match="JSON object"):
        await mocked("anthropic", Recorder(MESSAGE)).chat(request, "m")


async def test_anthropic_answer_in_another_vendors_shape_is_a_bad_response(mocked):
    with pytest.raises(ProviderBadResponse):
        await mocked("anthropic", Recorder(b'{"choices": []}')).chat(chat(), "m")
