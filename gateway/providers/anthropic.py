"""Adapter for Anthropic's Messages API (``POST {base_url}/v1/messages``, JSON and named SSE events).

Owns the translation between canonical ``gateway.types`` and the Messages wire. Does not own HTTP
plumbing (``gateway.providers._http``), the status-to-error table (``gateway.providers.base``, which
also maps Anthropic's 529 ``overloaded_error``), nor the gateway's own Anthropic-compatible surface
(``gateway.wire``). Anthropic has no embeddings API: ``embed`` raises ``InvalidRequest``.

Notes on the mapping:

* System messages, wherever they appear, become the top-level ``system`` (a string for one, a list
  of text blocks for several). Consecutive tool messages become ONE user message of
  ``tool_result`` blocks, as Anthropic requires for parallel calls.
* ``max_tokens`` is required upstream: 4096 when the caller gave none.
* Structured output (``response_format`` ``json_object`` / ``json_schema``) is emulated: a tool named
  ``json_response`` whose ``input_schema`` is the schema (``{"type": "object"}`` for
  ``json_object``) is added and forced with ``tool_choice``. Its ``tool_use`` input comes back as
  the answer's *text* (streamed as ``TextDelta`` pieces of the JSON) with finish reason ``stop``,
  never as a tool call. Forced tool use cannot be combined with extended ``thinking``, and the
  schema's top level must be an object.
* Canonical input tokens include cached ones: ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens``.
* In streams, ``Finish`` and ``UsageEvent`` are emitted at ``message_stop``, so a stream cut before
  it never looks complete (it raises ``ProviderBadResponse``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.cache.prefix import PROMPT_CACHE_MIN_CHARS
from gateway.errors import InvalidRequest
from gateway.providers._http import Upstream, encode_json
from gateway.providers.base import iter_sse
from gateway.types import (
    ChatResponse,
    Finish,
    ImagePart,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    Usage,
    UsageEvent,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx

    from gateway.errors import UpstreamError
    from gateway.policy import ProviderConfig
    from gateway.types import ChatRequest, EmbeddingRequest, EmbeddingResponse, FinishReason, Message, StreamEvent

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
JSON_TOOL = "json_response"
"""Name of the forced tool that emulates ``response_format``."""

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


# --- vendor response shapes (only the fields we read) -------------------------------------------


class _Block(msgspec.Struct):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Message(msgspec.Struct):
    content: list[_Block]
    model: str | None = None
    stop_reason: str | None = None
    usage: _Usage | None = None


class _Delta(msgspec.Struct):
    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class _Error(msgspec.Struct):
    type: str = "api_error"
    message: str = ""


class _Event(msgspec.Struct):
    """The ``data`` of any streamed event (``message_start``, ``content_block_delta``, ``error``...)."""

    type: str
    message: _Message | None = None
    index: int | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: _Error | None = None


class AnthropicProvider:
    """A ``Provider`` for the Anthropic Messages API.

    Stateless between calls and safe to share; uses only the client it is given.
    """

    config: ProviderConfig

    def __init__(self, config: ProviderConfig, client: httpx.AsyncClient) -> None:
        """Build the adapter.

        Args:
            config: provider settings; ``base_url`` has no ``/v1``.
            client: the gateway's shared pooled client (never closed here).
        """
        self.config = config
        auth = {"anthropic-version": API_VERSION}
        if config.api_key:
            auth["x-api-key"] = config.api_key
        self._up = Upstream(config, client, auth)
        self._url = f"{config.base_url}/v1/messages"

    async def chat(self, request: ChatRequest, model: str) -> ChatResponse:
        """One non-streamed message from upstream ``model``.

        Raises:
            UpstreamError: transport failure, vendor error status or an unusable answer.
            InvalidRequest: the request cannot be translated, or the vendor rejected it (400/422).
        """
        doc = await self._up.post(self._url, build_body(request, model, stream=False), _Message)
        json_mode = _json_mode(request)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in doc.content:
            if block.type == "text":
                texts.append(block.text or "")
            elif block.type == "tool_use":
                arguments = encode_json(block.input if block.input is not None else {}).decode()
                if json_mode and block.name == JSON_TOOL:
                    texts.append(arguments)
                else:
                    calls.append(ToolCall(id=block.id or "", name=block.name or "", arguments=arguments))
        return ChatResponse(
            model=doc.model or model,
            content="".join(texts),
            tool_calls=calls,
            finish_reason=_finish(doc.stop_reason, json_mode and not calls),
            usage=_usage(doc.usage, None),
        )

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        """A streamed message: deltas, then ``Finish`` and ``UsageEvent`` at ``message_stop``.

        Raises:
            UpstreamError: as ``chat``; also ``ProviderBadResponse`` when the stream ends (or is cut)
                before ``message_stop``, and the mapped error of an ``error`` event.
        """
        json_mode = _json_mode(request)
        tools: dict[int, int] = {}  # content block index -> 0-based tool call index
        json_blocks: set[int] = set()
        start_usage: _Usage | None = None
        delta_usage: _Usage | None = None
        reason: str | None = None
        done = False
        async with self._up.open_stream(self._url, build_body(request, model, stream=True)) as response:
            with self._up.reading():
                async for sse in iter_sse(response):
                    if done:
                        continue  # NOTE: read on to the body's end so the connection goes back to the pool
                    event = self._up.decode(sse.data, _Event)
                    kind = event.type
                    if kind == "content_block_delta" and event.delta is not None and event.index is not None:
                        delta = event.delta
                        if delta.type == "text_delta" and delta.text:
                            yield TextDelta(delta.text)
                        elif delta.type == "input_json_delta" and delta.partial_json:
                            if event.index in json_blocks:
                                yield TextDelta(delta.partial_json)
                            elif event.index in tools:
                                yield ToolCallDelta(index=tools[event.index], arguments=delta.partial_json)
                    elif kind == "content_block_start" and event.content_block is not None and event.index is not None:
                        block = event.content_block
                        if block.type == "text" and block.text:
                            yield TextDelta(block.text)
                        elif block.type == "tool_use" and json_mode and block.name == JSON_TOOL:
                            json_blocks.add(event.index)
                        elif block.type == "tool_use":
                            tools[event.index] = len(tools)
                            yield ToolCallDelta(index=tools[event.index], id=block.id, name=block.name)
                    elif kind == "message_start" and event.message is not None:
                        start_usage = event.message.usage
                    elif kind == "message_delta":
                        if event.delta is not None and event.delta.stop_reason:
                            reason = event.delta.stop_reason
                        if event.usage is not None:
                            delta_usage = event.usage
                    elif kind == "message_stop":
                        if reason is None:
                            raise self._up.bad_response("stream reached message_stop without a stop_reason")
                        yield Finish(_finish(reason, json_mode and not tools))
                        yield UsageEvent(_usage(start_usage, delta_usage))
                        done = True
                    elif kind == "error":
                        error = event.error or _Error()
                        raise self._error(error)
        if not done:
            raise self._up.bad_response("stream ended before message_stop")

    async def embed(self, request: EmbeddingRequest, model: str) -> EmbeddingResponse:
        """Anthropic has no embeddings API.

        Raises:
            InvalidRequest: always.
        """
        raise InvalidRequest(f"{self.config.name}: Anthropic offers no embeddings API", param="model")

    def _error(self, error: _Error) -> UpstreamError | InvalidRequest:
        return self._up.status_error(_ERROR_STATUS.get(error.type, 500), error.message or error.type)


def build_body(request: ChatRequest, model: str, *, stream: bool) -> dict[str, Any]:
    """The Messages API body for a canonical request.

    Args:
        request: the canonical request.
        model: the upstream model name.
        stream: ask for SSE.

    Raises:
        InvalidRequest: a tool message has no ``tool_call_id``, or tool call arguments are not a JSON object.
    """
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # blocks of the open tool_result user message
    for m in request.messages:
        if m.role == "system":
            if text := m.text():
                system.append(text)
        elif m.role == "tool":
            if results is None:
                results = []
                messages.append({"role": "user", "content": results})
            results.append(_tool_result(m))
        else:
            results = None
            content = [_part(p) for p in m.content if not isinstance(p, TextPart) or p.text]
            content += [_tool_use(c.id, c.name, c.arguments) for c in m.tool_calls if m.role == "assistant"]
            messages.append({"role": m.role, "content": content})

    max_tokens = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if system:
        body["system"] = system[0] if len(system) == 1 else [{"type": "text", "text": t} for t in system]
    body["messages"] = messages
    for key in ("temperature", "top_p", "top_k"):
        value = getattr(request, key)
        if value is not None:
            body[key] = value
    if request.stop:
        body["stop_sequences"] = request.stop

    tools = [_tool(t.name, t.description, t.parameters) for t in request.tools]
    choice: dict[str, Any] | None = None
    if request.tool_choice is not None:
        mode = request.tool_choice.mode
        choice = (
            {"type": "tool", "name": request.tool_choice.name}
            if mode == "tool"
            else {"type": {"required": "any"}.get(mode, mode)}
        )
    if _json_mode(request):
        fmt = request.response_format
        schema = fmt.schema if fmt is not None and fmt.type == "json_schema" and fmt.schema else {"type": "object"}
        tools.append(_tool(JSON_TOOL, "Respond with a JSON value matching this schema.", schema))
        choice = {"type": "tool", "name": JSON_TOOL}
    if tools:
        body["tools"] = tools
        if request.parallel_tool_calls is False and (choice is None or choice["type"] != "none"):
            choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None:
        body["tool_choice"] = choice
    if request.user is not None:
        body["metadata"] = {"user_id": request.user}
    _mark_cache_breakpoints(body)
    if stream:
        body["stream"] = True
    if request.wire == "anthropic":
        for key, value in request.extra.items():
            body.setdefault(key, value)  # canonical fields win over passthrough extras
    return body


def _mark_cache_breakpoints(body: dict[str, Any]) -> None:
    """Prompt caching as Anthropic documents it: ``cache_control`` at the end of long stable prefixes.

    Anthropic caches in the order tools, system, messages, up to a block marked
    ``{"type": "ephemeral"}`` (at most 4 marks). Two marks at most: the end of the system prompt (or
    of the tools when there is none), which every turn of a conversation shares, once tools and
    system reach ``PROMPT_CACHE_MIN_CHARS``; and the last block of the last message of a conversation
    (two messages or more) that long, so the next turn reads all earlier turns from the cache.
    Shorter prefixes get no mark: writing a cache costs 25 % more than plain input.
    """
    mark = {"type": "ephemeral"}
    tools: list[dict[str, Any]] = body.get("tools") or []
    system = body.get("system")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": system}] if isinstance(system, str) else list(system or [])
    stable = (len(encode_json(tools)) if tools else 0) + sum(len(b.get("text", "")) for b in blocks)
    if stable >= PROMPT_CACHE_MIN_CHARS:
        if blocks:
            blocks[-1] = {**blocks[-1], "cache_control": mark}
            body["system"] = blocks
        else:
            tools[-1] = {**tools[-1], "cache_control": mark}
    messages: list[dict[str, Any]] = body["messages"]
    if len(messages) < 2 or not messages[-1]["content"]:
        return
    if stable + len(encode_json(messages)) >= PROMPT_CACHE_MIN_CHARS:
        content = messages[-1]["content"] = list(messages[-1]["content"])
        content[-1] = {**content[-1], "cache_control": mark}


def _json_mode(request: ChatRequest) -> bool:
    fmt = request.response_format
    return fmt is not None and fmt.type in ("json_object", "json_schema")


def _part(p: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text}
    if p.url is not None and not p.url.startswith("data:"):
        return {"type": "image", "source": {"type": "url", "url": p.url}}
    if p.url is not None:  # data:<media type>;base64,<data>
        header, _, data = p.url.partition(",")
        media_type = header.removeprefix("data:").split(";")[0] or "image/png"
    else:
        media_type, data = p.media_type or "image/png", p.data or ""
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _tool_use(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"arguments of tool call {call_id!r} are not valid JSON", param="messages") from exc
    if not isinstance(value, dict):
        raise InvalidRequest(f"arguments of tool call {call_id!r} must be a JSON object", param="messages")
    return {"type": "tool_use", "id": call_id, "name": name, "input": value}


def _tool_result(m: Message) -> dict[str, Any]:
    if m.tool_call_id is None:
        raise InvalidRequest("a tool message needs a tool_call_id", param="messages")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id}
    if any(isinstance(p, ImagePart) for p in m.content):
        block["content"] = [_part(p) for p in m.content if not isinstance(p, TextPart) or p.text]
    elif text := m.text():
        block["content"] = text
    if m.is_error:
        block["is_error"] = True
    return block


def _tool(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name}
    if description is not None:
        tool["description"] = description
    tool["input_schema"] = schema
    return tool


def _finish(reason: str | None, json_answer: bool) -> FinishReason:
    mapped = _FINISH.get(reason or "end_turn", "stop")
    return "stop" if json_answer and mapped == "tool_calls" else mapped


def _usage(start: _Usage | None, delta: _Usage | None) -> Usage:
    """Canonical usage from ``message_start`` usage updated by ``message_delta`` usage (later wins)."""

    def pick(field: str) -> int:
        for source in (delta, start):
            value = getattr(source, field, None) if source is not None else None
            if value is not None:
                return int(value)
        return 0

    read, write = pick("cache_read_input_tokens"), pick("cache_creation_input_tokens")
    return Usage(
        input_tokens=pick("input_tokens") + read + write,
        output_tokens=pick("output_tokens"),
        cached_input_tokens=read,
        cache_write_tokens=write,
    )
