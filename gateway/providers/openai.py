"""Adapter for OpenAI's Chat Completions and Embeddings APIs, and every server that copies them.

Owns the translation between canonical ``gateway.types`` and the OpenAI wire for
``POST {base_url}/chat/completions`` (JSON and SSE) and ``POST {base_url}/embeddings``; the base URL
already ends in ``/v1``. Works unchanged for OpenAI-compatible servers (vLLM, Together, Groq...).
Does not own HTTP plumbing (``gateway.providers._http``), the status-to-error table
(``gateway.providers.base``), nor the gateway's own OpenAI-compatible surface (``gateway.wire``).

Notes on the mapping:

* ``max_tokens`` is sent as ``max_completion_tokens`` (the field reasoning models require).
* A ``finish_reason`` of ``stop`` that comes with tool calls (OpenAI does that when ``tool_choice``
  forces a function) is reported as ``tool_calls``; ``function_call`` also maps to ``tool_calls``.
* Streams always ask for ``stream_options.include_usage``. ``Finish`` and ``UsageEvent`` are emitted
  only when ``data: [DONE]`` arrives, so a stream cut anywhere before it never looks complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.cache.prefix import prompt_cache_key
from gateway.errors import InvalidRequest
from gateway.providers._http import Upstream
from gateway.providers.base import iter_sse
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

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx

    from gateway.errors import UpstreamError
    from gateway.policy import ProviderConfig
    from gateway.types import (
        ChatRequest,
        EmbeddingRequest,
        FinishReason,
        Message,
        StreamEvent,
        Tool,
    )

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


# --- vendor response shapes (only the fields we read) -------------------------------------------


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Completion(msgspec.Struct):
    """A ``chat.completion`` object or one ``chat.completion.chunk``."""

    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


class _Embedding(msgspec.Struct):
    index: int
    embedding: list[float]


class _EmbeddingList(msgspec.Struct):
    data: list[_Embedding]
    model: str | None = None
    usage: _Usage | None = None


class OpenAIProvider:
    """A ``Provider`` for OpenAI and OpenAI-compatible servers.

    Stateless between calls and safe to share; uses only the client it is given.
    """

    config: ProviderConfig

    def __init__(self, config: ProviderConfig, client: httpx.AsyncClient) -> None:
        """Build the adapter.

        Args:
            config: provider settings; ``base_url`` includes ``/v1``.
            client: the gateway's shared pooled client (never closed here).
        """
        self.config = config
        auth = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._up = Upstream(config, client, auth)
        self._chat_url = f"{config.base_url}/chat/completions"
        self._embed_url = f"{config.base_url}/embeddings"

    async def chat(self, request: ChatRequest, model: str) -> ChatResponse:
        """One non-streamed completion from upstream ``model``.

        Raises:
            UpstreamError: transport failure, vendor error status or an unusable answer.
            InvalidRequest: the vendor rejected the request (400/422).
        """
        doc = await self._up.post(self._chat_url, build_body(request, model, stream=False), _Completion)
        if doc.error is not None:
            raise self._body_error(doc.error)
        choice = doc.choices[0] if doc.choices else None
        if choice is None or choice.message is None:
            raise self._up.bad_response("upstream answer has no choices")
        message = choice.message
        calls = [
            ToolCall(id=c.id or "", name=c.function.name or "", arguments=c.function.arguments or "")
            for c in message.tool_calls or ()
            if c.function is not None
        ]
        return ChatResponse(
            model=doc.model or model,
            content=message.content or message.refusal or "",
            tool_calls=calls,
            finish_reason=_finish(choice.finish_reason, bool(calls)),
            usage=_usage(doc.usage),
        )

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        """A streamed completion: deltas, then ``Finish`` and ``UsageEvent`` once ``[DONE]`` arrives.

        Raises:
            UpstreamError: as ``chat``; also ``ProviderBadResponse`` when the stream ends (or is cut)
                before a finish reason and ``[DONE]``, and the mapped error of an in-stream ``error``.
        """
        reason: str | None = None
        usage: Usage | None = None
        saw_tools = done = False
        async with self._up.open_stream(self._chat_url, build_body(request, model, stream=True)) as response:
            with self._up.reading():
                async for sse in iter_sse(response):
                    if done:
                        continue  # NOTE: read on to the body's end so the connection goes back to the pool
                    if sse.data == "[DONE]":
                        if reason is None:
                            raise self._up.bad_response("stream ended without a finish_reason")
                        yield Finish(_finish(reason, saw_tools))
                        if usage is not None:
                            yield UsageEvent(usage)
                        done = True
                        continue
                    chunk = self._up.decode(sse.data, _Completion)
                    if chunk.error is not None:
                        raise self._body_error(chunk.error)
                    if chunk.usage is not None:
                        usage = _usage(chunk.usage)
                    for choice in chunk.choices or ():
                        if choice.index != 0:
                            continue
                        delta = choice.delta
                        if delta is not None:
                            if delta.content:
                                yield TextDelta(delta.content)
                            for position, call in enumerate(delta.tool_calls or ()):
                                fn = call.function or _Function()
                                if call.id is None and fn.name is None and not fn.arguments:
                                    continue
                                saw_tools = True
                                index = call.index if call.index is not None else position
                                yield ToolCallDelta(index=index, id=call.id, name=fn.name, arguments=fn.arguments or "")
                        if choice.finish_reason:
                            reason = choice.finish_reason
        if done:
            return
        raise self._up.bad_response(
            "stream ended before data: [DONE]" if reason else "stream ended without a finish_reason"
        )

    async def embed(self, request: EmbeddingRequest, model: str) -> EmbeddingResponse:
        """Float embeddings from upstream ``model``, in input order.

        Raises:
            UpstreamError: transport failure, vendor error status or an unusable answer.
            InvalidRequest: the vendor rejected the request (400/422).
        """
        body: dict[str, Any] = {"model": model, "input": request.input, "encoding_format": "float"}
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        if request.user is not None:
            body["user"] = request.user
        doc = await self._up.post(self._embed_url, body, _EmbeddingList)
        vectors = [item.embedding for item in sorted(doc.data, key=lambda item: item.index)]
        if len(vectors) != len(request.input):
            raise self._up.bad_response(f"upstream returned {len(vectors)} vectors for {len(request.input)} inputs")
        usage = Usage(input_tokens=doc.usage.prompt_tokens or 0) if doc.usage else Usage()
        return EmbeddingResponse(model=doc.model or model, data=vectors, usage=usage)

    def _body_error(self, error: Any) -> UpstreamError | InvalidRequest:
        """The gateway error for an ``{"error": ...}`` object inside a 200 body or an SSE chunk."""
        if not isinstance(error, dict):
            return self._up.status_error(500, str(error))
        kind = f"{error.get('type') or ''} {error.get('code') or ''}"
        status = 429 if "rate_limit" in kind else 400 if "invalid_request" in kind else 500
        return self._up.status_error(status, str(error.get("message") or kind.strip()))


def build_body(request: ChatRequest, model: str, *, stream: bool) -> dict[str, Any]:
    """The OpenAI Chat Completions body for a canonical request.

    Args:
        request: the canonical request.
        model: the upstream model name.
        stream: ask for SSE (with usage in the last chunk).

    Raises:
        InvalidRequest: a tool message has no ``tool_call_id``.
    """
    body: dict[str, Any] = {"model": model, "messages": [_message(m) for m in request.messages]}
    if request.max_tokens is not None:
        body["max_completion_tokens"] = request.max_tokens
    for key in ("temperature", "top_p", "seed", "user"):
        value = getattr(request, key)
        if value is not None:
            body[key] = value
    if request.stop:
        body["stop"] = request.stop
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
    if request.tool_choice is not None:
        choice = request.tool_choice
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}} if choice.mode == "tool" else choice.mode
        )
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    fmt = request.response_format
    if fmt is not None:
        if fmt.type == "json_schema":
            schema: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema or {}}
            if fmt.strict is not None:
                schema["strict"] = fmt.strict
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        else:
            body["response_format"] = {"type": fmt.type}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.wire == "openai":
        for key, value in request.extra.items():
            body.setdefault(key, value)  # canonical fields win over passthrough extras
    if (cache_key := prompt_cache_key(request)) is not None:
        body.setdefault("prompt_cache_key", cache_key)  # a caller's own key wins
    return body


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    if all(isinstance(p, TextPart) for p in m.content):
        text = m.text()
        out["content"] = text if text or not m.tool_calls else None
    else:
        out["content"] = [_part(p) for p in m.content]
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        if m.tool_call_id is None:
            raise InvalidRequest("a tool message needs a tool_call_id", param="messages")
        out["tool_call_id"] = m.tool_call_id
    return out


def _part(p: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text}
    url = p.url if p.url is not None else f"data:{p.media_type or 'image/png'};base64,{p.data or ''}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool(tool: Tool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        fn["description"] = tool.description
    fn["parameters"] = tool.parameters
    if tool.strict is not None:
        fn["strict"] = tool.strict
    return {"type": "function", "function": fn}


def _finish(reason: str | None, has_tool_calls: bool) -> FinishReason:
    mapped = _FINISH.get(reason or "stop", "stop")
    return "tool_calls" if has_tool_calls and mapped == "stop" else mapped


def _usage(u: _Usage | None) -> Usage:
    if u is None:
        return Usage()
    details = u.prompt_tokens_details
    return Usage(
        input_tokens=u.prompt_tokens or 0,
        output_tokens=u.completion_tokens or 0,
        cached_input_tokens=(details.cached_tokens or 0) if details else 0,
    )
