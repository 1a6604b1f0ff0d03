"""Anthropic's Messages wire as the fake upstream speaks it: request reading and response rendering.

Owns the exact bytes of ``message`` objects, the named SSE events (``event: message_start`` ...
``ping`` ... ``event: message_stop``), in-stream ``error`` events and Anthropic error bodies
(``{"type": "error", "error": {"type", "message"}}``). Does not own routing, auth or recording
(``tests.fakes.upstream``) nor what the model says (``tests.fakes.scenario``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from tests.fakes.scenario import Prompt, next_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.fakes.scenario import Answer

_encode = msgspec.json.encode
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool": "tool_use"}
_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "The fake was asked to fail with 400."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the specified resource."),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    529: ("overloaded_error", "Overloaded"),
}


def error(status: int, message: str | None = None) -> bytes:
    """An Anthropic error body."""
    kind, default = _ERRORS.get(status, ("api_error", f"HTTP {status}"))
    return _encode(
        {"type": "error", "error": {"type": kind, "message": message or default}, "request_id": f"req_{next_id()}"}
    )


def prompt(body: dict[str, Any]) -> Prompt:
    """Read a Messages request; raises ``ValueError`` for what Anthropic would reject as invalid."""
    if not isinstance(body.get("max_tokens"), int):
        raise ValueError("max_tokens: Field required")
    messages = body["messages"]
    result = Prompt(messages=len(messages), max_tokens=body["max_tokens"])
    system = body.get("system")
    result.prompt_chars += len(system) if isinstance(system, str) else sum(len(b["text"]) for b in system or ())
    for m in messages:
        if m["role"] not in ("user", "assistant"):
            raise ValueError(f"messages: Unexpected role {m['role']!r}")
        text = _text(m["content"])
        result.prompt_chars += len(text)
        if m["role"] == "user":
            result.last_text = text
    result.tools = [t["name"] for t in body.get("tools") or ()]
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        result.forced_tool = choice["name"]
    elif choice.get("type") == "any" and result.tools:
        result.forced_tool = result.tools[0]
    return result


def message(answer: Answer, model: str, *, preamble: str | None) -> bytes:
    """A whole ``message`` object; ``preamble`` is text said before a tool call."""
    content: list[dict[str, Any]] = []
    if answer.text or preamble:
        content.append({"type": "text", "text": answer.text or preamble})
    if answer.tool:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{answer.tool.id}",
                "name": answer.tool.name,
                "input": msgspec.json.decode(answer.tool.arguments),
            }
        )
    return _encode(
        {
            "id": f"msg_{next_id()}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": _STOP[answer.finish],
            "stop_sequence": None,
            "usage": _usage(answer, answer.output_tokens),
        }
    )


def events(answer: Answer, model: str, *, preamble: str | None) -> Iterator[bytes]:
    """The named SSE events of a streamed message (cut short or broken as ``answer.mode`` says)."""
    start: dict[str, Any] = {
        "id": f"msg_{next_id()}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(answer, 1),
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    if answer.mode == "bad_json":
        yield b"event: content_block_delta\ndata: {this is not json\n\n"
        return
    index = 0
    pieces = answer.pieces or ((preamble,) if preamble else ())
    if pieces:
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
        yield _event("ping", {"type": "ping"})
        for i, piece in enumerate(pieces):
            if answer.mode == "cut" and i == 2:
                return
            if answer.mode == "stream_error" and i == 1:
                yield _event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
                return
            yield _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
            )
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    if answer.tool:
        t = answer.tool
        yield _event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": f"toolu_{t.id}", "name": t.name, "input": {}},
            },
        )
        if not pieces:
            yield _event("ping", {"type": "ping"})
        for piece in ("", *t.pieces):
            yield _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                },
            )
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP[answer.finish], "stop_sequence": None},
            "usage": {"output_tokens": answer.output_tokens},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(data) + b"\n\n"


def _usage(answer: Answer, output_tokens: int) -> dict[str, Any]:
    uncached = answer.input_tokens - answer.cached_tokens - answer.cache_write_tokens
    return {
        "input_tokens": uncached,
        "cache_creation_input_tokens": answer.cache_write_tokens,
        "cache_read_input_tokens": answer.cached_tokens,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for block in content:
        if block["type"] == "text":
            texts.append(block["text"])
        elif block["type"] == "tool_result":
            texts.append(_text(block.get("content") or ""))
    return "".join(texts)
