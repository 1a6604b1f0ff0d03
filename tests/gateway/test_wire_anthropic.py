import msgspec
import pytest

from gateway.errors import InvalidRequest, ProviderTimeout
from gateway.types import ChatResponse, Finish, TextDelta, ToolCall, ToolCallDelta, Usage, UsageEvent
from gateway.wire import anthropic as wire


def test_decode_messages_splits_tool_results_and_keeps_system_first():
    req = wire.decode_messages(
        msgspec.json.encode(
            {
                "model": "claude",
                "max_tokens": 10,
                "system": [{"type": "text", "text": "sys"}],
                "messages": [
                    {"role": "user", "content": "weather?"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "checking"},
                            {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "P"}},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                            {"type": "text", "text": "thanks"},
                        ],
                    },
                ],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                "stop_sequences": ["X"],
                "top_k": 5,
                "metadata": {"user_id": "u1"},
            }
        )
    )
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "user"]
    assert req.messages[2].tool_calls == [ToolCall("t1", "w", '{"c":"P"}')]
    assert req.messages[3].tool_call_id == "t1" and req.messages[3].text() == "sunny"
    assert req.tool_choice is not None and req.tool_choice.mode == "required"
    assert req.parallel_tool_calls is False
    assert (req.stop, req.top_k, req.user, req.max_tokens) == (["X"], 5, "u1", 10)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"model": "c", "messages": []}', "max_tokens"),
        (b'{"model": "c", "max_tokens": 5, "messages": [], "bogus": 1}', "bogus: Extra inputs are not permitted"),
        (b'{"model": "c", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}', "role"),
        (b'{"model": ', "issue with your request body"),
        (b"[1, 2]", "Expected `object`, got `array`"),
    ],
)
def test_decode_messages_rejects_bad_input(raw, fragment):
    with pytest.raises(InvalidRequest) as info:
        wire.decode_messages(raw)
    assert fragment in info.value.message


def test_encode_response_reports_cached_tokens_beside_input():
    resp = ChatResponse(
        "m",
        "hi",
        [ToolCall("t", "f", '{"a": 1}')],
        "tool_calls",
        Usage(100, 5, cached_input_tokens=60, cache_write_tokens=10),
    )
    out = msgspec.json.decode(wire.encode_response(resp, "msg_1"))
    assert out["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
    ]
    assert out["stop_reason"] == "tool_use"
    assert out["usage"] == {
        "input_tokens": 30,
        "output_tokens": 5,
        "cache_creation_input_tokens": 10,
        "cache_read_input_tokens": 60,
    }


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), msgspec.json.decode(data.removeprefix("data: "))))
    return out


def test_stream_encoder_emits_named_events_in_order():
    enc = wire.StreamEncoder("msg_1", "m")
    raw = (
        b"".join(
            enc.encode(e)
            for e in [
                TextDelta("a"),
                TextDelta("b"),
                ToolCallDelta(0, "t", "f"),
                ToolCallDelta(0, arguments='{"x":'),
                ToolCallDelta(0, arguments="1}"),
                Finish("tool_calls"),
                UsageEvent(Usage(7, 3)),
            ]
        )
        + enc.close()
    )
    events = _events(raw)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[6][1]["content_block"] == {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert events[6][1]["index"] == 1
    assert events[10][1]["delta"]["stop_reason"] == "tool_use"
    assert events[10][1]["usage"]["output_tokens"] == 3


def test_stream_encoder_close_finishes_a_stream_without_usage():
    enc = wire.StreamEncoder("msg_1", "m")
    raw = enc.encode(TextDelta("a")) + enc.encode(Finish("length")) + enc.close()
    events = _events(raw)
    assert events[-2][0] == "message_delta" and events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-1][0] == "message_stop"
    assert enc.close() == b""  # idempotent


def test_error_render_uses_anthropic_types():
    assert msgspec.json.decode(wire.render_error(ProviderTimeout("slow"))) == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "slow"},
    }
    assert _events(wire.StreamEncoder("m", "m").error(InvalidRequest("bad")))[0][0] == "error"
