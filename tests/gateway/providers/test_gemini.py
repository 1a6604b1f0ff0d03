"""GeminiProvider: request and response translation, SSE chunks, embeddings."""

from __future__ import annotations

import re
from typing import Any

import msgspec
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
from tests.gateway.providers.conftest import MOCK_URL, Recorder, chat, collect, drain, user

WEATHER = Tool(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": False},
)
RESPONSE = (
    b'{"candidates":[{"content":{"parts":[{"text":"thinking...","thought":true},{"text":"Hello"},{"text":" there"}],'
    b'"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":30,"candidatesTokenCount":4,'
    b'"thoughtsTokenCount":6,"cachedContentTokenCount":12,"totalTokenCount":40},"modelVersion":"gemini-2.5-flash"}'
)


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + msgspec.json.encode(c) + b"\r\n\r\n" for c in chunks)


def _text_chunk(text: str, finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage or {"promptTokenCount": 5, "totalTokenCount": 5}}


async def test_gemini_request_translates_roles_tools_and_generation_config(mocked):
    recorder = Recorder(RESPONSE)
    request = ChatRequest(
        model="alias",
        messages=[
            Message("system", [TextPart("Be terse.")]),
            Message(
                "user",
                [
                    TextPart("Weather?"),
                    ImagePart(url="data:image/png;base64,iVBO"),
                    ImagePart(url="https://x.test/a.jpg", media_type="image/jpeg"),
                ],
            ),
            Message(
                "assistant",
                tool_calls=[
                    ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                    ToolCall("call_2", "get_time", "{}"),
                ],
            ),
            Message("tool", [TextPart('{"temp": 21}')], tool_call_id="call_1"),
            Message("tool", [TextPart("12:00")], tool_call_id="call_2"),
            Message("assistant", [TextPart("It is 21C.")]),
            Message("user", [TextPart("And Rome?")]),
        ],
        max_tokens=100,
        temperature=0.3,
        top_p=0.8,
        top_k=20,
        stop=["END"],
        seed=5,
        tools=[WEATHER],
        tool_choice=ToolChoice("tool", "get_weather"),
    )
    await mocked("gemini", recorder).chat(request, "gemini-2.5-flash")
    sent = recorder.requests[-1]
    assert str(sent.url) == f"{MOCK_URL}/v1beta/models/gemini-2.5-flash:generateContent"
    assert sent.headers["x-goog-api-key"] == "gm-fake"
    assert recorder.json == {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "Weather?"},
                    {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
                    {"fileData": {"fileUri": "https://x.test/a.jpg", "mimeType": "image/jpeg"}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                    {"functionCall": {"name": "get_time", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
                    {"functionResponse": {"name": "get_time", "response": {"output": "12:00"}}},
                ],
            },
            {"role": "model", "parts": [{"text": "It is 21C."}]},
            {"role": "user", "parts": [{"text": "And Rome?"}]},
        ],
        "systemInstruction": {"parts": [{"text": "Be terse."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "get_weather",
                        "description": "Weather in a city",
                        "parametersJsonSchema": WEATHER.parameters,
                    }
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}},
        "generationConfig": {
            "temperature": 0.3,
            "topP": 0.8,
            "topK": 20,
            "seed": 5,
            "maxOutputTokens": 100,
            "stopSequences": ["END"],
        },
    }


async def test_gemini_failed_tool_result_is_sent_as_error(mocked):
    recorder = Recorder(RESPONSE)
    request = ChatRequest(
        model="a",
        messages=[
            user("x"),
            Message("assistant", tool_calls=[ToolCall("c", "f", "{}")]),
            Message("tool", [TextPart("boom")], tool_call_id="c", is_error=True),
        ],
    )
    await mocked("gemini", recorder).chat(request, "m")
    assert recorder.json["contents"][-1]["parts"] == [
        {"functionResponse": {"name": "f", "response": {"error": "boom"}}}
    ]


async def test_gemini_tool_result_without_an_earlier_call_is_invalid(mocked):
    request = ChatRequest(model="a", messages=[user("x"), Message("tool", [TextPart("r")], tool_call_id="nope")])
    with pytest.raises(InvalidRequest, match="no earlier assistant tool call"):
        await mocked("gemini", Recorder(RESPONSE)).chat(request, "m")


@pytest.mark.parametrize(("mode", "expected"), [("auto", "AUTO"), ("none", "NONE"), ("required", "ANY")])
async def test_gemini_tool_choice_modes(mocked, mode, expected):
    recorder = Recorder(RESPONSE)
    await mocked("gemini", recorder).chat(chat(tools=[WEATHER], tool_choice=ToolChoice(mode)), "m")
    assert recorder.json["toolConfig"] == {"functionCallingConfig": {"mode": expected}}


@pytest.mark.parametrize(
    ("fmt", "config"),
    [
        (ResponseFormat("json_object"), {"responseMimeType": "application/json"}),
        (
            ResponseFormat("json_schema", name="a", schema={"type": "object"}),
            {"responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}},
        ),
        (ResponseFormat("text"), None),
    ],
)
async def test_gemini_response_format_sets_mime_type_and_schema(mocked, fmt, config):
    recorder = Recorder(RESPONSE)
    await mocked("gemini", recorder).chat(chat(response_format=fmt), "m")
    assert recorder.json.get("generationConfig") == config


async def test_gemini_extras_are_never_forwarded(mocked):
    recorder = Recorder(RESPONSE)
    await mocked("gemini", recorder).chat(chat(extra={"presence_penalty": 1}), "models/gemini-2.5-pro")
    assert set(recorder.json) == {"contents"}
    assert recorder.requests[-1].url.path == "/v1beta/models/gemini-2.5-pro:generateContent"


async def test_gemini_chat_skips_thoughts_and_counts_them_as_output(mocked):
    response = await mocked("gemini", Recorder(RESPONSE)).chat(chat(), "m")
    assert (response.model, response.content, response.finish_reason) == ("gemini-2.5-flash", "Hello there", "stop")
    assert response.usage == Usage(input_tokens=30, output_tokens=10, cached_input_tokens=12)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("BLOCKLIST", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("MALFORMED_FUNCTION_CALL", "error"),
        ("OTHER", "stop"),
    ],
)
async def test_gemini_finish_reasons_map_to_canonical(mocked, reason, expected):
    body = msgspec.json.encode({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason}]})
    assert (await mocked("gemini", Recorder(body)).chat(chat(), "m")).finish_reason == expected


async def test_gemini_function_calls_get_generated_ids(live):
    response = await live("gemini").chat(chat(tools=[WEATHER]), "tool-gemini")
    assert response.finish_reason == "tool_calls"
    [call] = response.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and (call.name, call.arguments) == (
        "get_weather",
        '{"city":"Paris"}',
    )


async def test_gemini_blocked_prompt_is_a_content_filter_finish(mocked):
    body = b'{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":8,"totalTokenCount":8}}'
    response = await mocked("gemini", Recorder(body)).chat(chat(), "m")
    assert (response.content, response.finish_reason, response.usage.input_tokens) == ("", "content_filter", 8)


async def test_gemini_stream_translates_chunks_exactly(mocked):
    recorder = Recorder(
        _sse(
            _text_chunk("Hel"),
            _text_chunk("lo"),
            {
                "candidates": [
                    {
                        "content": {
                            "parts": [
                                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                                {"functionCall": {"id": "fc-2", "name": "get_time", "args": {}}},
                            ],
                            "role": "model",
                        },
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": 5,
                    "candidatesTokenCount": 9,
                    "thoughtsTokenCount": 2,
                    "totalTokenCount": 16,
                },
            },
        )
    )
    events = await collect(mocked("gemini", recorder), chat(), "gemini-2.5-flash")
    assert recorder.requests[-1].url.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    assert recorder.requests[-1].url.params["alt"] == "sse"
    assert events[:2] == [TextDelta("Hel"), TextDelta("lo")]
    first, second = events[2], events[3]
    assert isinstance(first, ToolCallDelta) and (first.index, first.name, first.arguments) == (
        0,
        "get_weather",
        '{"city":"Paris"}',
    )
    assert first.id is not None and first.id.startswith("call_")
    assert second == ToolCallDelta(1, "fc-2", "get_time", "{}")
    assert events[4:] == [Finish("tool_calls"), UsageEvent(Usage(input_tokens=5, output_tokens=11))]


async def test_gemini_stream_raises_when_cut_before_finish_reason(mocked):
    body = _sse(_text_chunk("Hel"), _text_chunk("lo"))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderBadResponse, match="finishReason"):
        await drain(mocked("gemini", Recorder(body)).stream(chat(), "m"), seen)
    assert seen == [TextDelta("Hel"), TextDelta("lo")]


async def test_gemini_stream_error_chunk_raises_mapped_error(mocked):
    body = _sse(_text_chunk("Hel"), {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}})
    with pytest.raises(ProviderRateLimited, match="quota"):
        await collect(mocked("gemini", Recorder(body)), chat(), "m")


async def test_gemini_embed_uses_batch_embed_contents(mocked):
    recorder = Recorder(b'{"embeddings":[{"values":[0.1,0.2]},{"values":[0.3,0.4]}]}')
    result = await mocked("gemini", recorder).embed(
        EmbeddingRequest("e", ["hello", "world"], dimensions=2), "text-embedding-004"
    )
    assert recorder.requests[-1].url.path == "/v1beta/models/text-embedding-004:batchEmbedContents"
    assert recorder.json == {
        "requests": [
            {
                "model": "models/text-embedding-004",
                "content": {"parts": [{"text": "hello"}]},
                "outputDimensionality": 2,
            },
            {
                "model": "models/text-embedding-004",
                "content": {"parts": [{"text": "world"}]},
                "outputDimensionality": 2,
            },
        ]
    }
    assert result.data == [[0.1, 0.2], [0.3, 0.4]]
    assert result.usage.source == "estimate" and result.usage.input_tokens > 0


async def test_gemini_embed_rejects_token_ids(live):
    with pytest.raises(InvalidRequest, match="token ids"):
        await live("gemini").embed(EmbeddingRequest("e", [[1, 2]]), "text-embedding-004")


async def test_gemini_embed_against_fake(live):
    result = await live("gemini").embed(EmbeddingRequest("e", ["a", "b", "c"], dimensions=3), "text-embedding-004")
    assert [len(v) for v in result.data] == [3, 3, 3] and result.data[0] != result.data[1]


async def test_gemini_thinking_tokens_from_fake_count_as_output(live):
    response = await live("gemini").chat(chat("x"), "gemini-think")
    assert response.usage.output_tokens == 2 + 7
