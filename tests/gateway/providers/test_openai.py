"""OpenAIProvider: request and response translation, streams, embeddings."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest, ProviderBadResponse, ProviderRateLimited
from gateway.types import (
    ChatRequest,
    EmbeddingRequest,
    Finish,
    ImagePart,
    Message,
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
COMPLETION = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-2024-08-06","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"Hi!","refusal":null},"logprobs":null,"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":20,"completion_tokens":3,"total_tokens":23,"prompt_tokens_details":{"cached_tokens":16}}}'
)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return data(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


async def test_openai_request_translates_every_canonical_field(mocked):
    recorder = Recorder(COMPLETION)
    request = ChatRequest(
        model="alias",
        messages=[
            Message("system", [TextPart("Be terse.")]),
            Message(
                "user",
                [
                    TextPart("What is this?"),
                    ImagePart(url="https://x.test/a.png"),
                    ImagePart(media_type="image/jpeg", data="QUJD"),
                ],
            ),
            Message("assistant", tool_calls=[ToolCall("call_1", "get_weather", '{"city":"Paris"}')]),
            Message("tool", [TextPart("sunny")], tool_call_id="call_1"),
        ],
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
        stop=["END"],
        seed=7,
        user="u-1",
        tools=[Tool("get_weather", "Weather in a city", {"type": "object"}, strict=True)],
        tool_choice=ToolChoice("tool", "get_weather"),
        parallel_tool_calls=False,
        response_format=ResponseFormat("json_schema", name="answer", schema={"type": "object"}, strict=True),
        extra={"presence_penalty": 0.1, "logit_bias": {"50256": -100}, "temperature": 2.0},
    )
    await mocked("openai", recorder).chat(request, "gpt-4o")
    sent = recorder.requests[-1]
    assert str(sent.url) == f"{MOCK_URL}/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-fake-openai"
    assert recorder.json == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        ],
        "max_completion_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 7,
        "user": "u-1",
        "stop": ["END"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather in a city",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
        },
        "presence_penalty": 0.1,
        "logit_bias": {"50256": -100},  # extras merged; canonical temperature wins
    }


async def test_openai_extras_are_not_forwarded_from_another_wire(mocked):
    recorder = Recorder(COMPLETION)
    await mocked("openai", recorder).chat(chat(wire="anthropic", extra={"metadata": {"a": 1}}), "gpt-4o")
    assert "metadata" not in recorder.json


@pytest.mark.parametrize(("mode", "expected"), [("auto", "auto"), ("none", "none"), ("required", "required")])
async def test_openai_tool_choice_modes_pass_as_strings(mocked, mode, expected):
    recorder = Recorder(COMPLETION)
    await mocked("openai", recorder).chat(chat(tools=[WEATHER], tool_choice=ToolChoice(mode)), "m")
    assert recorder.json["tool_choice"] == expected


async def test_openai_sends_no_authorization_without_a_key(mocked):
    recorder = Recorder(COMPLETION)
    await mocked("openai", recorder, api_key=None, key_required=False).chat(chat(), "local-model")
    assert "authorization" not in recorder.requests[-1].headers


async def test_openai_stream_always_asks_for_usage(live, upstream):
    await collect(live("openai"), chat("marker-usage"), "gpt-4o-mini")
    body = upstream.requests[-1].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "marker-usage"}]


async def test_openai_chat_parses_text_finish_and_cached_usage(mocked):
    response = await mocked("openai", Recorder(COMPLETION)).chat(chat(), "gpt-4o")
    assert response.model == "gpt-4o-2024-08-06" and response.content == "Hi!" and response.finish_reason == "stop"
    assert response.usage == Usage(input_tokens=20, output_tokens=3, cached_input_tokens=16)


@pytest.mark.parametrize(
    ("reason", "has_calls", "expected"),
    [
        ("stop", False, "stop"),
        ("length", False, "length"),
        ("content_filter", False, "content_filter"),
        ("tool_calls", True, "tool_calls"),
        ("function_call", True, "tool_calls"),
        ("stop", True, "tool_calls"),
    ],
)
async def test_openai_finish_reasons_map_to_canonical(mocked, reason, has_calls, expected):
    calls = (
        ', "tool_calls":[{"id":"call_9","type":"function","function":{"name":"f","arguments":"{}"}}]'
        if has_calls
        else ""
    )
    body = f'{{"choices":[{{"index":0,"message":{{"content":null{calls}}},"finish_reason":"{reason}"}}]}}'.encode()
    response = await mocked("openai", Recorder(body)).chat(chat(), "m")
    assert response.finish_reason == expected
    assert response.tool_calls == ([ToolCall("call_9", "f", "{}")] if has_calls else [])


async def test_openai_error_object_in_a_200_body_is_raised(mocked):
    body = b'{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}'
    with pytest.raises(ProviderRateLimited, match="slow down"):
        await mocked("openai", Recorder(body)).chat(chat(), "m")


async def test_openai_stream_translates_chunks_into_exact_events(mocked):
    body = sse(
        _chunk({"role": "assistant", "content": "", "refusal": None}),
        ": keep-alive comment",
        _chunk({"content": "Hel"}),
        _chunk({"content": "lo"}),
        _chunk({}, "stop"),
        data(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}},
            }
        ),
        "data: [DONE]",
    )
    events = await collect(mocked("openai", Recorder(body)), chat(), "m")
    assert events == [TextDelta("Hel"), TextDelta("lo"), Finish("stop"), UsageEvent(Usage(9, 2))]


async def test_openai_stream_tool_calls_keep_their_index_and_first_piece_names(mocked):
    body = sse(
        _chunk(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ],
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        _chunk({}, "tool_calls"),
        "data: [DONE]",
    )
    events = await collect(mocked("openai", Recorder(body)), chat(), "m")
    assert events == [
        ToolCallDelta(0, "call_a", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city":'),
        ToolCallDelta(1, "call_b", "get_time", "{}"),
        ToolCallDelta(0, arguments='"Paris"}'),
        Finish("tool_calls"),
    ]


async def test_openai_stream_tool_call_from_fake_arrives_in_pieces(live):
    events = await collect(live("openai"), chat(tools=[WEATHER]), "tool-gpt")
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].name == "get_weather" and deltas[0].id and len(deltas) == 4
    assert "".join(d.arguments for d in deltas) == '{"city":"Paris"}'
    assert events[len(deltas)] == Finish("tool_calls")


async def test_openai_stream_raises_when_done_arrives_without_finish_reason(mocked):
    body = sse(_chunk({"content": "Hi"}), "data: [DONE]")
    with pytest.raises(ProviderBadResponse, match="finish_reason"):
        await collect(mocked("openai", Recorder(body)), chat(), "m")


async def test_openai_stream_raises_when_cut_after_finish_but_before_done(mocked):
    body = sse(_chunk({"content": "Hi"}), _chunk({}, "stop"))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderBadResponse, match=r"\[DONE\]"):
        await drain(mocked("openai", Recorder(body)).stream(chat(), "m"), seen)
    assert seen == [TextDelta("Hi")]  # Finish is only ever emitted once [DONE] proves the stream whole


async def test_openai_stream_error_chunk_raises_mapped_error(mocked):
    body = sse(
        _chunk({"content": "Hi"}),
        data({"error": {"message": "Rate limit", "type": "tokens", "code": "rate_limit_exceeded"}}),
    )
    with pytest.raises(ProviderRateLimited):
        await collect(mocked("openai", Recorder(body)), chat(), "m")


async def test_openai_stream_rejects_http_error_before_first_event(mocked):
    body = b'{"error":{"message":"Invalid value for messages","type":"invalid_request_error","param":"messages","code":null}}'
    with pytest.raises(InvalidRequest, match="Invalid value for messages"):
        await collect(mocked("openai", Recorder(body, status=400)), chat(), "m")


async def test_openai_json_response_format_from_fake_is_json_text(live, upstream):
    response = await live("openai").chat(chat("hi", response_format=ResponseFormat("json_object")), "json")
    assert response.content == '{"answer":"echo: hi"}'
    assert upstream.requests[-1].body["response_format"] == {"type": "json_object"}


async def test_openai_cached_usage_from_fake(live):
    response = await live("openai").chat(chat("a" * 400), "gpt-cached")
    assert response.usage.cached_input_tokens == response.usage.input_tokens // 2 > 0


async def test_openai_embed_asks_for_floats_and_orders_by_index(mocked):
    body = (
        b'{"object":"list","model":"text-embedding-3-small","usage":{"prompt_tokens":4,"total_tokens":4},"data":['
        b'{"object":"embedding","index":1,"embedding":[0.5,0.25]},{"object":"embedding","index":0,"embedding":[1.0,-1.0]}]}'
    )
    recorder = Recorder(body)
    result = await mocked("openai", recorder).embed(EmbeddingRequest("e", ["a", "b"], dimensions=2, user="u"), "te-3")
    assert str(recorder.requests[-1].url) == f"{MOCK_URL}/v1/embeddings"
    assert recorder.json == {
        "model": "te-3",
        "input": ["a", "b"],
        "encoding_format": "float",
        "dimensions": 2,
        "user": "u",
    }
    assert result.data == [[1.0, -1.0], [0.5, 0.25]] and result.usage.input_tokens == 4


async def test_openai_embed_against_fake_returns_one_vector_per_input(live):
    result = await live("openai").embed(EmbeddingRequest("e", [[1, 2, 3], [4, 5]], dimensions=5), "te-3")
    assert [len(v) for v in result.data] == [5, 5] and result.usage.input_tokens == 5


async def test_openai_tool_message_without_call_id_is_invalid(mocked):
    request = ChatRequest(model="a", messages=[user("x"), Message("tool", [TextPart("r")])])
    with pytest.raises(InvalidRequest):
        await mocked("openai", Recorder(COMPLETION)).chat(request, "m")
