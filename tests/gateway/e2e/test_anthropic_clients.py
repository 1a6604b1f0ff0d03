"""The official anthropic SDK against the real gateway, reaching every kind of upstream."""

from __future__ import annotations

import pytest

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize("model", ["claude-test", "gpt-test", "gemini-test"])
def test_messages_reach_each_provider_and_answer_in_anthropic_format(gateway, model):
    message = gateway.anthropic().messages.create(
        model=model, max_tokens=64, system="Be terse.", messages=[{"role": "user", "content": "hello 1"}]
    )
    assert message.type == "message" and message.role == "assistant"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "echo: hello 1"
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


@pytest.mark.parametrize("model", ["claude-test", "gpt-test", "gemini-test"])
def test_message_stream_events_accumulate_to_the_same_message(gateway, model):
    with gateway.anthropic().messages.stream(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "hello 2"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].text == "echo: hello 2" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("model", ["anthropic/tool-claude", "openai/tool-gpt", "gemini/tool-gemini"])
def test_tool_use_round_trip_from_anthropic_client(gateway, model):
    client = gateway.anthropic()
    messages = [{"role": "user", "content": "weather in Paris?"}]
    first = client.messages.create(model=model, max_tokens=64, tools=[WEATHER_TOOL], messages=messages)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Paris"}

    with client.messages.stream(model=model, max_tokens=64, tools=[WEATHER_TOOL], messages=messages) as stream:
        streamed = stream.get_final_message()
    streamed_use = next(b for b in streamed.content if b.type == "tool_use")
    assert streamed_use.input == {"city": "Paris"} and streamed.stop_reason == "tool_use"

    followup = [
        *messages,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rainy"}]},
    ]
    answer = client.messages.create(
        model=model.replace("tool-", ""), max_tokens=64, tools=[WEATHER_TOOL], messages=followup
    )
    assert answer.content[0].text == "echo: rainy"


def test_anthropic_client_to_openai_upstream_translates_request(gateway):
    gateway.anthropic().messages.create(
        model="gpt-test",
        max_tokens=21,
        system="sys-rules",
        stop_sequences=["HALT"],
        extra_body={"temperature": 0.5},
        messages=[{"role": "user", "content": "marker-b1"}],
    )
    sent = next(r for r in reversed(gateway.upstream.requests) if "marker-b1" in str(r.body))
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-fake-openai"
    assert sent.body["messages"][0] == {"role": "system", "content": "sys-rules"}
    assert (
        sent.body["max_completion_tokens"] == 21 and sent.body["stop"] == ["HALT"] and sent.body["temperature"] == 0.5
    )


def test_gemini_upstream_receives_generate_content(gateway):
    gateway.anthropic().messages.create(
        model="gemini-test", max_tokens=9, system="g-sys", messages=[{"role": "user", "content": "marker-c1"}]
    )
    sent = next(r for r in reversed(gateway.upstream.requests) if "marker-c1" in str(r.body))
    assert sent.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert sent.headers["x-goog-api-key"] == "gm-fake"
    assert sent.body["systemInstruction"] == {"parts": [{"text": "g-sys"}]}
    assert sent.body["contents"] == [{"role": "user", "parts": [{"text": "marker-c1"}]}]
    assert sent.body["generationConfig"]["maxOutputTokens"] == 9
