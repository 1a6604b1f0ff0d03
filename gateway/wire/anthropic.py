"""Anthropic's Messages wire format on the client side: decode requests, encode answers, streams and errors.

Owns the schema of ``POST /v1/messages`` bodies (unknown top-level fields are rejected, as Anthropic
does), their translation to the canonical ``gateway.types``, and the bytes sent back: the ``message``
object, the named SSE events (``message_start`` ... ``message_stop``) and
``{"type": "error", "error": {...}}`` bodies. Does not own talking to Anthropic upstream
(``gateway.providers.anthropic``).

Canonical usage counts cached tokens inside ``input_tokens``; Anthropic reports them beside it,
so the encoders subtract them back out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from gateway.errors import GatewayError, InvalidRequest
from gateway.types import (
    ChatRequest,
    ChatResponse,
    Finish,
    FinishReason,
    ImagePart,
    Message,
    Part,
    StreamEvent,
    TextDelta,
    TextPart,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
)

# ---------------------------------------------------------------------------------------------
# Request schema


class _Text(msgspec.Struct, tag="text", tag_field="type"):
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class _Base64Source(msgspec.Struct, tag="base64", tag_field="type"):
    media_type: str
    data: str


class _URLSource(msgspec.Struct, tag="url", tag_field="type"):
    url: str


class _Image(msgspec.Struct, tag="image", tag_field="type"):
    source: _Base64Source | _URLSource
    cache_control: dict[str, Any] | None = None


class _Document(msgspec.Struct, tag="document", tag_field="type"):
    source: dict[str, Any]


class _ToolUse(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class _ToolResult(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[_Text | _Image] = ""
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class _Thinking(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None


class _RedactedThinking(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str


_Block = _Text | _Image | _Document | _ToolUse | _ToolResult | _Thinking | _RedactedThinking


class _Message(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[_Block]


class _ToolDef(msgspec.Struct):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: dict[str, Any] | None = None
    type: str | None = None
    strict: bool | None = None


class _ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The body of ``POST /v1/messages`` as Anthropic documents it."""

    model: str
    messages: list[_Message]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    system: str | list[_Text] | None = None
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    tools: list[_ToolDef] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None
    container: Any = None
    context_management: Any = None
    mcp_servers: Any = None
    output_format: Any = None


_EXTRA_FIELDS = (
    "metadata",
    "thinking",
    "service_tier",
    "container",
    "context_management",
    "mcp_servers",
    "output_format",
)

_decoder = msgspec.json.Decoder(MessagesRequest)
_encoder = msgspec.json.Encoder()
_TEXT_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_DELTA_MID = b',"delta":{"type":"text_delta","text":'


def decode_messages(body: bytes) -> ChatRequest:
    """Decode and validate a Messages body into the canonical request.

    Raises:
        InvalidRequest: malformed JSON, wrong types, unknown fields, or an unsupported block type.
    """
    try:
        r = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if "unknown field" in message:
            field = message.split("`")[1]
            raise InvalidRequest(f"{field}: Extra inputs are not permitted", param=field) from exc
        raise InvalidRequest(f"Invalid request body: {message}") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"There was an issue with your request body (invalid JSON or UTF-8): {exc}") from exc

    messages: list[Message] = []
    if r.system:
        messages.append(
            Message(
                "system", [TextPart(r.system)] if isinstance(r.system, str) else [TextPart(b.text) for b in r.system]
            )
        )
    for m in r.messages:
        messages.extend(_messages(m))
    choice = None
    parallel = None
    if r.tool_choice is not None:
        mode = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}[r.tool_choice.type]
        choice = ToolChoice(mode, r.tool_choice.name)  # type: ignore[arg-type]
        if r.tool_choice.disable_parallel_tool_use:
            parallel = False
    return ChatRequest(
        model=r.model,
        messages=messages,
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop=list(r.stop_sequences or ()),
        tools=[Tool(t.name, t.description, t.input_schema, t.strict) for t in r.tools or ()],
        tool_choice=choice,
        parallel_tool_calls=parallel,
        stream=bool(r.stream),
        user=(r.metadata or {}).get("user_id"),
        wire="anthropic",
        extra={name: value for name in _EXTRA_FIELDS if (value := getattr(r, name)) is not None},
    )


def _part(block: _Text | _Image) -> Part:
    if isinstance(block, _Text):
        return TextPart(block.text)
    if isinstance(block.source, _URLSource):
        return ImagePart(url=block.source.url)
    return ImagePart(media_type=block.source.media_type, data=block.source.data)


def _messages(m: _Message) -> list[Message]:
    """One Anthropic message becomes tool-result messages first, then the rest of its content."""
    if isinstance(m.content, str):
        return [Message(m.role, [TextPart(m.content)])]
    out: list[Message] = []
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for block in m.content:
        if isinstance(block, _Text | _Image):
            parts.append(_part(block))
        elif isinstance(block, _ToolUse):
            calls.append(ToolCall(block.id, block.name, _encoder.encode(block.input).decode()))
        elif isinstance(block, _ToolResult):
            content: list[Part] = (
                [TextPart(block.content)] if isinstance(block.content, str) else [_part(b) for b in block.content]
            )
            out.append(Message("tool", content, tool_call_id=block.tool_use_id, is_error=bool(block.is_error)))
        elif isinstance(block, _Document):
            raise InvalidRequest("Document blocks are not supported by this gateway.", param="messages")
        # thinking blocks are the model's own scratch work: other providers cannot take them back
    if parts or calls or not out:
        out.append(Message(m.role, parts, tool_calls=calls))
    return out


# ---------------------------------------------------------------------------------------------
# Encoding answers

_STOP_REASONS: dict[FinishReason, str] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal", "error": "end_turn",
}  # fmt: skip


def _usage(u: Usage) -> dict[str, int]:
    return {
        "input_tokens": max(u.input_tokens - u.cached_input_tokens - u.cache_write_tokens, 0),
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cached_input_tokens,
    }


def _arguments(text: str) -> Any:
    try:
        value = msgspec.json.decode(text) if text else {}
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def encode_response(resp: ChatResponse, response_id: str) -> bytes:
    """A Messages API ``message`` object."""
    content: list[dict[str, Any]] = []
    if resp.content:
        content.append({"type": "text", "text": resp.content})
    content.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments(c.arguments)} for c in resp.tool_calls
    )
    return _encoder.encode(
        {
            "id": response_id,
            "type": "message",
            "role": "assistant",
            "model": resp.model,
            "content": content,
            "stop_reason": _STOP_REASONS[resp.finish_reason],
            "stop_sequence": None,
            "usage": _usage(resp.usage),
        }
    )


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"


class StreamEncoder:
    """Turns canonical stream events into Anthropic's named SSE events. One per response.

    Content blocks are opened lazily and closed when the next kind of block starts; ``Finish`` is
    held until usage arrives because ``message_delta`` carries both.
    """

    def __init__(self, response_id: str, model: str, input_tokens: int = 0) -> None:
        self._id = response_id
        self._model = model
        self._input_tokens = input_tokens
        self._started = False
        self._block = -1
        self._open: tuple[str, int] | None = None  # ("text", -1) or ("tool", tool index)
        self._finish: FinishReason | None = None
        self._done = False

    def _start(self) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        return _event("message_start", {"type": "message_start", "message": message}) + _event("ping", {"type": "ping"})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def encode(self, event: StreamEvent) -> bytes:
        """The SSE bytes for one event (possibly empty)."""
        out = b"" if self._started else self._start()
        if isinstance(event, TextDelta):
            if self._open != ("text", -1):
                out += self._close_block()
                self._block += 1
                self._open = ("text", -1)
                out += _event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": self._block,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            # NOTE: the one event of nearly every chunk, so its fixed parts are not encoded each time.
            return b"%s%s%d%s%s}}\n\n" % (
                out,
                _TEXT_DELTA_HEAD,
                self._block,
                _TEXT_DELTA_MID,
                _encoder.encode(event.text),
            )
        if isinstance(event, ToolCallDelta):
            if self._open != ("tool", event.index):
                out += self._close_block()
                self._block += 1
                self._open = ("tool", event.index)
                block = {
                    "type": "tool_use",
                    "id": event.id or f"toolu_{self._id}_{event.index}",
                    "name": event.name or "",
                    "input": {},
                }
                out += _event(
                    "content_block_start", {"type": "content_block_start", "index": self._block, "content_block": block}
                )
            if event.arguments:
                out += _event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self._block,
                        "delta": {"type": "input_json_delta", "partial_json": event.arguments},
                    },
                )
            return out
        if isinstance(event, Finish):
            self._finish = event.reason
            return out + self._close_block()
        return out + self._end(event.usage)

    def _end(self, usage: Usage | None) -> bytes:
        if self._done:
            return b""
        self._done = True
        out = (b"" if self._started else self._start()) + self._close_block()
        delta = {"stop_reason": _STOP_REASONS[self._finish or "stop"], "stop_sequence": None}
        out += _event(
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": _usage(usage) if usage else {"output_tokens": 0}},
        )
        return out + _event("message_stop", {"type": "message_stop"})

    def close(self) -> bytes:
        """Whatever is still owed after the last event: ``message_delta`` and ``message_stop``."""
        return self._end(None)

    def error(self, exc: GatewayError) -> bytes:
        """An error after the first byte: an ``error`` event the SDK raises on."""
        return _event("error", _error_body(exc))


_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
    504: "timeout_error", 529: "overloaded_error",
}  # fmt: skip


def _error_body(exc: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.status_code, "api_error"), "message": exc.message}}


def render_error(exc: GatewayError) -> bytes:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    return _encoder.encode(_error_body(exc))
