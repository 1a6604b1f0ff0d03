"""Adapter for Google's Gemini API (``generateContent``, ``streamGenerateContent?alt=sse``, embeddings).

Owns the translation between canonical ``gateway.types`` and the Gemini ``v1beta`` wire under
``{base_url}/v1beta/models/{model}:...``, authenticated with ``x-goog-api-key``. Does not own HTTP
plumbing (``gateway.providers._http``) nor the status-to-error table (``gateway.providers.base``).
``request.extra`` is never forwarded: no client wire of the gateway is Gemini's.

Notes on the mapping:

* System messages become ``systemInstruction``; assistant turns have role ``model``; tool results
  are ``functionResponse`` parts of a ``user`` turn (consecutive results share one turn), named after
  the earlier assistant tool call with the same id. A result that is a JSON object is sent as the
  ``response``; anything else is wrapped as ``{"output": ...}`` (``{"error": ...}`` when
  ``is_error``).
* Tool parameters and the ``json_schema`` response format are plain JSON Schema, so they go in
  ``parametersJsonSchema`` and ``responseJsonSchema`` (the OpenAPI-subset ``parameters`` /
  ``responseSchema`` reject common keywords such as ``additionalProperties``).
* Gemini gives function calls no ids (or only sometimes): missing ones are generated as
  ``call_<hex>``. ``STOP`` with function calls is reported as ``tool_calls``.
* Gemini streams have no terminator; ``Finish`` and ``UsageEvent`` are emitted when the body ends
  cleanly after a ``finishReason`` was seen, so a cut stream never looks complete.
* Embedding responses carry no token counts; usage is an estimate (``source="estimate"``).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.errors import InvalidRequest
from gateway.providers._http import Upstream, encode_json
from gateway.providers.base import iter_sse
from gateway.tokens import count_text
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
    from gateway.types import ChatRequest, EmbeddingRequest, FinishReason, Message, StreamEvent

_FINISH: dict[str, FinishReason] = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "LANGUAGE": "content_filter",
    "MALFORMED_FUNCTION_CALL": "error",
    "UNEXPECTED_TOOL_CALL": "error",
    "TOO_MANY_TOOL_CALLS": "error",
}
_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY", "tool": "ANY"}


# --- vendor response shapes (only the fields we read) -------------------------------------------


class _FunctionCall(msgspec.Struct):
    name: str
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    id: str | None = None


class _Part(msgspec.Struct, rename="camel"):
    text: str | None = None
    thought: bool = False
    function_call: _FunctionCall | None = None


class _Content(msgspec.Struct):
    parts: list[_Part] = msgspec.field(default_factory=list)


class _Candidate(msgspec.Struct, rename="camel"):
    content: _Content | None = None
    finish_reason: str | None = None


class _UsageMetadata(msgspec.Struct, rename="camel"):
    prompt_token_count: int = 0
    candidates_token_count: int = 0
    thoughts_token_count: int = 0
    cached_content_token_count: int = 0


class _PromptFeedback(msgspec.Struct, rename="camel"):
    block_reason: str | None = None


class _Error(msgspec.Struct):
    code: int = 500
    message: str = ""


class _Response(msgspec.Struct, rename="camel"):
    """A ``GenerateContentResponse``, whole or one streamed chunk."""

    candidates: list[_Candidate] = msgspec.field(default_factory=list)
    usage_metadata: _UsageMetadata | None = None
    prompt_feedback: _PromptFeedback | None = None
    model_version: str | None = None
    error: _Error | None = None


class _Embedding(msgspec.Struct):
    values: list[float]


class _Embeddings(msgspec.Struct):
    embeddings: list[_Embedding]


class GeminiProvider:
    """A ``Provider`` for the Gemini API.

    Stateless between calls and safe to share; uses only the client it is given.
    """

    config: ProviderConfig

    def __init__(self, config: ProviderConfig, client: httpx.AsyncClient) -> None:
        """Build the adapter.

        Args:
            config: provider settings; ``base_url`` has no ``/v1beta``.
            client: the gateway's shared pooled client (never closed here).
        """
        self.config = config
        self._up = Upstream(config, client, {"x-goog-api-key": config.api_key} if config.api_key else {})
        self._base = f"{config.base_url}/v1beta/models/"

    async def chat(self, request: ChatRequest, model: str) -> ChatResponse:
        """One non-streamed answer from upstream ``model``.

        Raises:
            UpstreamError: transport failure, vendor error status or an unusable answer.
            InvalidRequest: the request cannot be translated, or the vendor rejected it (400/422).
        """
        doc = await self._up.post(self._url(model, "generateContent"), build_body(request), _Response)
        if doc.error is not None:
            raise self._error(doc.error)
        usage = _usage(doc.usage_metadata)
        if not doc.candidates:
            if doc.prompt_feedback is not None and doc.prompt_feedback.block_reason:
                return ChatResponse(
                    model=doc.model_version or model, content="", finish_reason="content_filter", usage=usage
                )
            raise self._up.bad_response("upstream answer has no candidates")
        candidate = doc.candidates[0]
        texts: list[str] = []
        calls: list[ToolCall] = []
        for part in candidate.content.parts if candidate.content else ():
            if part.text is not None and not part.thought:
                texts.append(part.text)
            if part.function_call is not None:
                calls.append(_tool_call(part.function_call))
        return ChatResponse(
            model=doc.model_version or model,
            content="".join(texts),
            tool_calls=calls,
            finish_reason=_finish(candidate.finish_reason, bool(calls)),
            usage=usage,
        )

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        """A streamed answer: deltas, then ``Finish`` and ``UsageEvent`` when the body ends cleanly.

        Raises:
            UpstreamError: as ``chat``; also ``ProviderBadResponse`` when the stream ends (or is cut)
                without a ``finishReason``, and the mapped error of an in-stream ``error`` chunk.
        """
        url = self._url(model, "streamGenerateContent") + "?alt=sse"
        finish: FinishReason | None = None
        usage: _UsageMetadata | None = None
        tools = 0
        async with self._up.open_stream(url, build_body(request)) as response:
            with self._up.reading():
                async for sse in iter_sse(response):
                    chunk = self._up.decode(sse.data, _Response)
                    if chunk.error is not None:
                        raise self._error(chunk.error)
                    if chunk.usage_metadata is not None:
                        usage = chunk.usage_metadata
                    if not chunk.candidates:
                        if chunk.prompt_feedback is not None and chunk.prompt_feedback.block_reason:
                            finish = "content_filter"
                        continue
                    candidate = chunk.candidates[0]
                    for part in candidate.content.parts if candidate.content else ():
                        if part.text and not part.thought:
                            yield TextDelta(part.text)
                        if part.function_call is not None:
                            call = _tool_call(part.function_call)
                            yield ToolCallDelta(index=tools, id=call.id, name=call.name, arguments=call.arguments)
                            tools += 1
                    if candidate.finish_reason:
                        finish = _finish(candidate.finish_reason, False)
        if finish is None:
            raise self._up.bad_response("stream ended without a finishReason")
        yield Finish("tool_calls" if tools and finish == "stop" else finish)
        if usage is not None:
            yield UsageEvent(_usage(usage))

    async def embed(self, request: EmbeddingRequest, model: str) -> EmbeddingResponse:
        """Embeddings of text inputs from upstream ``model`` via ``batchEmbedContents``.

        Raises:
            InvalidRequest: the inputs are token ids (Gemini takes text only), or the vendor rejected them.
            UpstreamError: transport failure, vendor error status or an unusable answer.
        """
        texts: list[str] = []
        for item in request.input:
            if not isinstance(item, str):
                raise InvalidRequest(f"{self.config.name}: Gemini embeds text only, not token ids", param="input")
            texts.append(item)
        name = f"models/{_bare(model)}"
        requests: list[dict[str, Any]] = []
        for text in texts:
            entry: dict[str, Any] = {"model": name, "content": {"parts": [{"text": text}]}}
            if request.dimensions is not None:
                entry["outputDimensionality"] = request.dimensions
            requests.append(entry)
        doc = await self._up.post(self._url(model, "batchEmbedContents"), {"requests": requests}, _Embeddings)
        if len(doc.embeddings) != len(texts):
            raise self._up.bad_response(f"upstream returned {len(doc.embeddings)} vectors for {len(texts)} inputs")
        usage = Usage(input_tokens=sum(count_text(t) for t in texts), source="estimate")
        return EmbeddingResponse(model=model, data=[e.values for e in doc.embeddings], usage=usage)

    def _url(self, model: str, method: str) -> str:
        return f"{self._base}{_bare(model)}:{method}"

    def _error(self, error: _Error) -> UpstreamError | InvalidRequest:
        return self._up.status_error(error.code, error.message)


def build_body(request: ChatRequest) -> dict[str, Any]:
    """The ``generateContent`` body for a canonical request (the model goes in the URL).

    Raises:
        InvalidRequest: a tool message has no ``tool_call_id`` or answers no earlier tool call, or
            tool call arguments are not a JSON object.
    """
    system = [text for m in request.messages if m.role == "system" and (text := m.text())]
    names: dict[str, str] = {}  # tool call id -> function name, from earlier assistant turns
    contents: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # parts of the open functionResponse turn
    for m in request.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            if results is None:
                results = []
                contents.append({"role": "user", "parts": results})
            results.append(_function_response(m, names))
            continue
        results = None
        parts = [_part(p) for p in m.content if not isinstance(p, TextPart) or p.text]
        if m.role == "assistant":
            for call in m.tool_calls:
                names[call.id] = call.name
                parts.append({"functionCall": {"name": call.name, "args": _args(call.id, call.arguments)}})
        contents.append({"role": "model" if m.role == "assistant" else "user", "parts": parts})

    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": t} for t in system]}
    if request.tools:
        declarations = []
        for tool in request.tools:
            declaration: dict[str, Any] = {"name": tool.name}
            if tool.description is not None:
                declaration["description"] = tool.description
            declaration["parametersJsonSchema"] = tool.parameters
            declarations.append(declaration)
        body["tools"] = [{"functionDeclarations": declarations}]
    if request.tool_choice is not None:
        calling: dict[str, Any] = {"mode": _MODES[request.tool_choice.mode]}
        if request.tool_choice.mode == "tool" and request.tool_choice.name:
            calling["allowedFunctionNames"] = [request.tool_choice.name]
        body["toolConfig"] = {"functionCallingConfig": calling}
    config: dict[str, Any] = {}
    for key, field in (("temperature", "temperature"), ("topP", "top_p"), ("topK", "top_k"), ("seed", "seed")):
        value = getattr(request, field)
        if value is not None:
            config[key] = value
    if request.max_tokens is not None:
        config["maxOutputTokens"] = request.max_tokens
    if request.stop:
        config["stopSequences"] = request.stop
    fmt = request.response_format
    if fmt is not None and fmt.type != "text":
        config["responseMimeType"] = "application/json"
        if fmt.type == "json_schema" and fmt.schema:
            config["responseJsonSchema"] = fmt.schema
    if config:
        body["generationConfig"] = config
    return body


def _bare(model: str) -> str:
    return model.removeprefix("models/")


def _part(p: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"text": p.text}
    if p.url is not None and p.url.startswith("data:"):  # data:<media type>;base64,<data>
        header, _, data = p.url.partition(",")
        return {"inlineData": {"mimeType": header.removeprefix("data:").split(";")[0] or "image/png", "data": data}}
    if p.url is not None:
        file_data = {"fileUri": p.url}
        if p.media_type:
            file_data["mimeType"] = p.media_type
        return {"fileData": file_data}
    return {"inlineData": {"mimeType": p.media_type or "image/png", "data": p.data or ""}}


def _args(call_id: str, arguments: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"arguments of tool call {call_id!r} are not valid JSON", param="messages") from exc
    if not isinstance(value, dict):
        raise InvalidRequest(f"arguments of tool call {call_id!r} must be a JSON object", param="messages")
    return value


def _function_response(m: Message, names: dict[str, str]) -> dict[str, Any]:
    if m.tool_call_id is None:
        raise InvalidRequest("a tool message needs a tool_call_id", param="messages")
    name = names.get(m.tool_call_id)
    if name is None:
        raise InvalidRequest(f"tool result {m.tool_call_id!r} answers no earlier assistant tool call", param="messages")
    text = m.text()
    try:
        value: Any = msgspec.json.decode(text)
    except msgspec.DecodeError:
        value = text
    if m.is_error:
        response = {"error": value}
    elif isinstance(value, dict):
        response = value
    else:
        response = {"output": value}
    return {"functionResponse": {"name": name, "response": response}}


def _tool_call(call: _FunctionCall) -> ToolCall:
    call_id = call.id or f"call_{secrets.token_hex(12)}"
    return ToolCall(id=call_id, name=call.name, arguments=encode_json(call.args).decode())


def _finish(reason: str | None, has_tool_calls: bool) -> FinishReason:
    mapped = _FINISH.get(reason or "STOP", "stop")
    return "tool_calls" if has_tool_calls and mapped == "stop" else mapped


def _usage(meta: _UsageMetadata | None) -> Usage:
    if meta is None:
        return Usage()
    return Usage(
        input_tokens=meta.prompt_token_count,
        output_tokens=meta.candidates_token_count + meta.thoughts_token_count,
        cached_input_tokens=meta.cached_content_token_count,
    )
