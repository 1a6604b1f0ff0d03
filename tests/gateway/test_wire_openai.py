import base64
import struct

import msgspec
import pytest

from gateway.errors import InvalidRequest, ProviderUnavailable
from gateway.types import (
    ChatResponse,
    EmbeddingResponse,
    Finish,
    ImagePart,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    Usage,
    UsageEvent,
)
from gateway.wire import openai as wire
from tests.gateway.e2e.openai_schema import validate


def body(**fields):
    return msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_decode_chat_maps_messages_tools_and_parameters():
    req = wire.decode_chat(
        msgspec.json.encode(
            {
                "model": "gpt",
                "messages": [
                    {"role": "developer", "content": "be brief"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "42"},
                ],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "max_completion_tokens": 7,
                "max_tokens": 99,
                "stop": "END",
                "seed": 3,
                "temperature": 0.5,
                "top_p": 0.9,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
                "stream": True,
                "stream_options": {"include_usage": True},
                "presence_penalty": 0.5,
            }
        )
    )
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1].content == [TextPart("look"), ImagePart(media_type="image/png", data="AAAA")]
    assert req.messages[2].tool_calls == [ToolCall("c1", "f", "{}")]
    assert req.messages[3].tool_call_id == "c1"
    assert req.tools[0].name == "f"
    assert req.tool_choice is not None and (req.tool_choice.mode, req.tool_choice.name) == ("tool", "f")
    assert req.max_tokens == 7  # max_completion_tokens wins over the deprecated max_tokens
    assert (req.stop, req.seed, req.temperature, req.top_p) == (["END"], 3, 0.5, 0.9)
    assert req.response_format is not None and req.response_format.schema == {"type": "object"}
    assert req.stream and req.stream_usage
    assert req.extra == {"presence_penalty": 0.5}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{not json", "could not parse the JSON"),
        (body(temperature="hot"), "Expected `float"),
        (body(temperature=3), "<= 2"),
        (body(frobnicate=True), "Unrecognized request argument supplied: frobnicate"),
        (body(n=2), "Only n=1"),
        (msgspec.json.encode({"model": "m", "messages": []}), "length >= 1"),
        (msgspec.json.encode({"messages": [{"role": "user", "content": "x"}]}), "missing required field `model`"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}', "invalid"),
        (body(tool_choice="sometimes"), "tool_choice"),
    ],
)
def test_decode_chat_rejects_bad_input_with_a_clear_message(raw, fragment):
    with pytest.raises(InvalidRequest) as info:
        wire.decode_chat(raw)
    assert fragment.lower() in info.value.message.lower()
    assert info.value.status_code == 400


def test_encode_response_matches_openai_schema():
    resp = ChatResponse("gpt-x", "hello", [ToolCall("c", "f", "{}")], "tool_calls", Usage(10, 2, cached_input_tokens=4))
    out = msgspec.json.decode(wire.encode_response(resp, "chatcmpl-1", created=5))
    validate("CreateChatCompletionResponse", out)
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def test_stream_encoder_emits_role_chunk_then_deltas_finish_usage_and_done():
    enc = wire.StreamEncoder("chatcmpl-1", "gpt-x", include_usage=True, created=5)
    raw = (
        b"".join(
            enc.encode(e)
            for e in [
                TextDelta("he"),
                ToolCallDelta(0, "c", "f", ""),
                ToolCallDelta(0, arguments="{}"),
                Finish("tool_calls"),
                UsageEvent(Usage(3, 4)),
            ]
        )
        + enc.close()
    )
    lines = [ln for ln in raw.decode().split("\n\n") if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [msgspec.json.decode(ln.removeprefix("data: ")) for ln in lines[:-1]]
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert chunks[1]["choices"][0]["delta"] == {"content": "he"}
    assert chunks[2]["choices"][0]["delta"]["tool_calls"][0] == {
        "index": 0,
        "id": "c",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert chunks[4]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["total_tokens"] == 7


def test_stream_encoder_omits_usage_chunk_unless_asked():
    enc = wire.StreamEncoder("id", "m", include_usage=False)
    assert enc.encode(UsageEvent(Usage(1, 1))).count(b"data: ") == 1  # only the opening role chunk
    assert b"usage" not in enc.encode(TextDelta("x"))


def test_stream_error_is_an_error_object_without_done():
    out = wire.StreamEncoder("id", "m", include_usage=False).error(ProviderUnavailable("upstream went away"))
    assert out.startswith(b"data: {") and b"[DONE]" not in out
    assert msgspec.json.decode(out[6:])["error"]["message"] == "upstream went away"


def test_encode_embeddings_base64_is_little_endian_float32():
    out = msgspec.json.decode(wire.encode_embeddings(EmbeddingResponse("e", [[1.0, -2.5]], Usage(3)), "base64"))
    validate("CreateEmbeddingResponse", {**out, "data": [{**d, "embedding": [0.0]} for d in out["data"]]})
    assert struct.unpack("<2f", base64.b64decode(out["data"][0]["embedding"])) == (1.0, -2.5)


def test_decode_embeddings_accepts_strings_and_token_arrays():
    assert wire.decode_embeddings(b'{"model":"e","input":"a"}')[0].input == ["a"]
    assert wire.decode_embeddings(b'{"model":"e","input":[1,2]}')[0].input == [[1, 2]]
    with pytest.raises(InvalidRequest):
        wire.decode_embeddings(b'{"model":"e","input":["a",[1]]}')
    with pytest.raises(InvalidRequest):
        wire.decode_embeddings(b'{"model":"e","input":""}')
