"""The official openai SDK against the real gateway, reaching every kind of upstream."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from tests.gateway.e2e.openai_schema import validate

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _sse_chunks(gateway, payload: dict) -> list[dict]:
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        json=payload,
        timeout=10,
        headers={"authorization": f"Bearer {gateway.key}"},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    return [msgspec.json.decode(ln.removeprefix("data: ")) for ln in lines[:-1]]


@pytest.mark.parametrize("model", ["gpt-test", "claude-test", "gemini-test"])
def test_chat_completion_reaches_each_provider_and_answers_in_openai_format(gateway, model):
    client = gateway.openai()
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "ping 1"}],
        max_tokens=50,
        temperature=0,
        seed=7,
        stop=["\n\n"],
    )
    validate("CreateChatCompletionResponse", raw.http_response.json())
    completion = raw.parse()
    assert completion.choices[0].message.content == "echo: ping 1"
    assert completion.choices[0].finish_reason == "stop"
    assert (
        completion.usage is not None and completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    )
    assert raw.headers["x-crossway-provider"] == model.removesuffix("-test").replace("gpt", "openai").replace(
        "claude", "anthropic"
    )
    assert raw.headers["x-request-id"]


@pytest.mark.parametrize("model", ["gpt-test", "claude-test", "gemini-test"])
def test_chat_stream_chunks_validate_and_end_with_usage(gateway, model):
    chunks = _sse_chunks(
        gateway,
        {
            "model": model,
            "messages": [{"role": "user", "content": "ping 2"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "echo: ping 2"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_chat_stream_through_sdk_collects_text(gateway):
    stream = gateway.openai().chat.completions.create(
        model="claude-test", messages=[{"role": "user", "content": "ping 3"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: ping 3"


@pytest.mark.parametrize("target", ["openai/tool-gpt", "anthropic/tool-claude", "gemini/tool-gemini"])
def test_tool_calls_are_translated_streamed_and_not(gateway, target):
    client = gateway.openai()
    messages = [{"role": "user", "content": "weather in Paris?"}]
    completion = client.chat.completions.create(model=target, messages=messages, tools=[WEATHER_TOOL])
    call = completion.choices[0].message.tool_calls[0]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and msgspec.json.decode(call.function.arguments) == {"city": "Paris"}

    stream = client.chat.completions.create(model=target, messages=messages, tools=[WEATHER_TOOL], stream=True)
    names, args, finish = [], "", None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or ():
            names += [tc.function.name] if tc.function and tc.function.name else []
            args += tc.function.arguments or "" if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and msgspec.json.decode(args) == {"city": "Paris"} and finish == "tool_calls"

    followup = [
        *messages,
        completion.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    answer = client.chat.completions.create(model=target.replace("tool-", ""), messages=followup, tools=[WEATHER_TOOL])
    assert answer.choices[0].message.content == "echo: sunny"


def test_openai_client_to_anthropic_upstream_translates_request(gateway):
    gateway.openai().chat.completions.create(
        model="claude-test",
        max_completion_tokens=33,
        stop=["STOP"],
        temperature=0.2,
        messages=[{"role": "system", "content": "rules"}, {"role": "user", "content": "marker-a1"}],
    )
    sent = next(r for r in reversed(gateway.upstream.requests) if "marker-a1" in str(r.body))
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-fake"
    assert sent.body["system"] in ("rules", [{"type": "text", "text": "rules"}])
    assert sent.body["max_tokens"] == 33 and sent.body["stop_sequences"] == ["STOP"]
    assert sent.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "marker-a1"}]}] or sent.body[
        "messages"
    ] == [{"role": "user", "content": "marker-a1"}]


def test_openai_upstream_streams_always_request_usage(gateway):
    list(
        gateway.openai().chat.completions.create(
            model="gpt-test", stream=True, messages=[{"role": "user", "content": "marker-u1"}]
        )
    )
    sent = next(r for r in reversed(gateway.upstream.requests) if "marker-u1" in str(r.body))
    assert sent.body["stream_options"] == {"include_usage": True}


def test_embeddings_in_float_and_base64(gateway):
    client = gateway.openai()
    result = client.embeddings.create(model="embed-test", input=["a", "bb"])  # the SDK asks for base64
    assert [d.index for d in result.data] == [0, 1] and len(result.data[0].embedding) > 0
    raw = httpx.post(
        f"{gateway.url}/v1/embeddings",
        json={"model": "embed-test", "input": "a"},
        headers={"authorization": f"Bearer {gateway.key}"},
    )
    validate("CreateEmbeddingResponse", raw.json())
    assert raw.json()["data"][0]["embedding"] == pytest.approx(
        result.data[0].embedding, rel=1e-6
    )  # float32 on the wire


def test_models_lists_configured_aliases_only(gateway):
    raw = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {gateway.key}"})
    validate("ListModelsResponse", raw.json())
    ids = [m.id for m in gateway.openai().models.list()]
    assert "gpt-test" in ids and "claude-test" in ids and "nowhere-test" not in ids
    assert gateway.openai().models.retrieve("gemini-test").owned_by == "gemini"


@pytest.mark.parametrize("model", ["openai/json", "anthropic/json", "gemini/json"])
def test_response_format_json_schema_reaches_each_provider(gateway, model):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    completion = gateway.openai().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "q"}],
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
    )
    assert msgspec.json.decode(completion.choices[0].message.content) == {"answer": "echo: q"}
    assert completion.choices[0].finish_reason == "stop"
    sent = gateway.upstream.requests[-1].body
    if model.startswith("anthropic"):
        assert sent["tool_choice"] == {"type": "tool", "name": "json_response"}
        assert sent["tools"][0]["input_schema"] == schema
    elif model.startswith("gemini"):
        assert sent["generationConfig"]["responseMimeType"] == "application/json"
    else:
        assert sent["response_format"]["json_schema"]["schema"] == schema
