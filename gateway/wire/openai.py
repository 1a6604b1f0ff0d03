"""OpenAI's wire format on the client side: decode requests, encode answers, streams and errors.

Owns the schema of ``POST /v1/chat/completions`` and ``POST /v1/embeddings`` bodies as OpenAI
publishes them (unknown top-level fields are rejected, as OpenAI does), their translation to the
canonical ``gateway.types``, and the bytes sent back: ``chat.completion`` JSON, ``chat.completion.chunk``
SSE lines and ``{"error": {...}}`` bodies. Does not own talking to OpenAI upstream
(``gateway.providers.openai``).
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Annotated, Any, Literal, cast

import msgspec

from gateway.errors import GatewayError, InvalidRequest
from gateway.types import (
    ChatRequest,
    ChatResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    Finish,
    ImagePart,
    Message,
    Part,
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

# ---------------------------------------------------------------------------------------------
# Request schema (what the vendor accepts; decoding enforces types and ranges)


class _Text(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class _ImageURL(msgspec.Struct):
    url: str
    detail: str | None = None


class _Image(msgspec.Struct, tag="image_url", tag_field="type"):
    image_url: _ImageURL


class _Audio(msgspec.Struct, tag="input_audio", tag_field="type"):
    input_audio: dict[str, Any]


class _File(msgspec.Struct, tag="file", tag_field="type"):
    file: dict[str, Any]


class _Refusal(msgspec.Struct, tag="refusal", tag_field="type"):
    refusal: str


class _Function(msgspec.Struct):
    name: str
    arguments: str


class _ToolCall(msgspec.Struct):
    id: str
    function: _Function
    type: Literal["function"] = "function"


class _System(msgspec.Struct, tag="system", tag_field="role"):
    content: str | list[_Text]
    name: str | None = None


class _Developer(msgspec.Struct, tag="developer", tag_field="role"):
    content: str | list[_Text]
    name: str | None = None


class _User(msgspec.Struct, tag="user", tag_field="role"):
    content: str | list[_Text | _Image | _Audio | _File]
    name: str | None = None


class _Assistant(msgspec.Struct, tag="assistant", tag_field="role"):
    content: str | list[_Text | _Refusal] | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None
    function_call: _Function | None = None
    name: str | None = None
    audio: dict[str, Any] | None = None


class _ToolMsg(msgspec.Struct, tag="tool", tag_field="role"):
    content: str | list[_Text]
    tool_call_id: str


class _FunctionMsg(msgspec.Struct, tag="function", tag_field="role"):
    content: str | None
    name: str


_Message = _System | _Developer | _User | _Assistant | _ToolMsg | _FunctionMsg


class _FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _ToolDef(msgspec.Struct):
    function: _FunctionDef
    type: Literal["function"] = "function"


class _NamedFunction(msgspec.Struct):
    name: str


class _NamedToolChoice(msgspec.Struct):
    function: _NamedFunction
    type: Literal["function"] = "function"


class _JSONSchema(msgspec.Struct):
    name: str
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class _FormatText(msgspec.Struct, tag="text", tag_field="type"):
    pass


class _FormatJSON(msgspec.Struct, tag="json_object", tag_field="type"):
    pass


class _FormatSchema(msgspec.Struct, tag="json_schema", tag_field="type"):
    json_schema: _JSONSchema


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


_Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
_Unit = Annotated[float, msgspec.Meta(ge=0, le=1)]
_Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
_Positive = Annotated[int, msgspec.Meta(ge=1)]


class ChatCompletionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The body of ``POST /v1/chat/completions`` as OpenAI documents it."""

    model: str
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    audio: dict[str, Any] | None = None
    frequency_penalty: _Penalty | None = None
    function_call: str | _NamedFunction | None = None
    functions: list[_FunctionDef] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    max_completion_tokens: _Positive | None = None
    max_tokens: _Positive | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None
    moderation: Any = None
    n: _Positive | None = None
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    presence_penalty: _Penalty | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None
    prompt_cache_retention: str | None = None
    reasoning_effort: str | None = None
    response_format: _FormatText | _FormatJSON | _FormatSchema | None = None
    safety_identifier: str | None = None
    seed: int | None = None
    service_tier: str | None = None
    stop: str | Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    temperature: _Temperature | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedToolChoice | None = None
    tools: list[_ToolDef] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    top_p: _Unit | None = None
    user: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None


# Fields with no canonical meaning: forwarded as-is to OpenAI-wire upstreams only.
_EXTRA_FIELDS = (
    "audio", "frequency_penalty", "logit_bias", "logprobs", "metadata", "modalities", "moderation",
    "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    "reasoning_effort", "safety_identifier", "service_tier", "store", "top_logprobs", "verbosity",
    "web_search_options",
)  # fmt: skip


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The body of ``POST /v1/embeddings``."""

    model: str
    input: str | list[str | int | list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: _Positive | None = None
    user: str | None = None


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_embed_decoder = msgspec.json.Decoder(EmbeddingsRequest)
_encoder = msgspec.json.Encoder()
_ROLE_DELTA = b'{"role":"assistant","content":"","refusal":null}'


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = message.rpartition("at `$.")[2].rstrip("`") if "at `$." in message else None
        if "unknown field" in message:
            field = message.split("`")[1]
            raise InvalidRequest(f"Unrecognized request argument supplied: {field}", param=field) from exc
        raise InvalidRequest(f"Invalid request body: {message}", param=param) from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request (invalid JSON or UTF-8): {exc}"
        ) from exc


def decode_chat(body: bytes) -> ChatRequest:
    """Decode and validate a chat completion body into the canonical request.

    Raises:
        InvalidRequest: malformed JSON, wrong types, unknown fields, or values the gateway cannot honour.
    """
    r: ChatCompletionRequest = _decode(_chat_decoder, body)
    if r.n is not None and r.n != 1:
        raise InvalidRequest("Only n=1 is supported.", param="n")
    tools = [_tool(t.function) for t in r.tools or ()] or [_tool(f) for f in r.functions or ()]
    choice = r.tool_choice if r.tool_choice is not None else r.function_call
    stop = [r.stop] if isinstance(r.stop, str) else list(r.stop or ())
    extra = {name: value for name in _EXTRA_FIELDS if (value := getattr(r, name)) is not None}
    return ChatRequest(
        model=r.model,
        messages=[_message(m) for m in r.messages],
        max_tokens=r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        stop=stop,
        seed=r.seed,
        tools=tools,
        tool_choice=_tool_choice(choice),
        parallel_tool_calls=r.parallel_tool_calls,
        response_format=_response_format(r.response_format),
        stream=bool(r.stream),
        user=r.user,
        stream_usage=bool(r.stream_options and r.stream_options.include_usage),
        wire="openai",
        extra=extra,
    )


def _text(content: str | list[_Text] | list[_Text | _Refusal] | None) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    return [TextPart(p.text if isinstance(p, _Text) else p.refusal) for p in content]


def _message(m: _Message) -> Message:
    if isinstance(m, _System | _Developer):
        return Message("system", _text(m.content))
    if isinstance(m, _User):
        if isinstance(m.content, str):
            return Message("user", [TextPart(m.content)])
        parts: list[Part] = []
        for p in m.content:
            if isinstance(p, _Text):
                parts.append(TextPart(p.text))
            elif isinstance(p, _Image):
                parts.append(_image(p.image_url.url))
            else:
                raise InvalidRequest(
                    f"Content part type `{type(p).__struct_config__.tag}` is not supported.", param="messages"
                )
        return Message("user", parts)
    if isinstance(m, _Assistant):
        calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()]
        if m.function_call is not None:
            calls.append(ToolCall(f"call_{m.function_call.name}", m.function_call.name, m.function_call.arguments))
        return Message("assistant", _text(m.content), tool_calls=calls)
    if isinstance(m, _ToolMsg):
        return Message("tool", _text(m.content), tool_call_id=m.tool_call_id)
    return Message("tool", _text(m.content), tool_call_id=f"call_{m.name}")


def _image(url: str) -> ImagePart:
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        media_type = header[5:].split(";")[0] or "image/png"
        return ImagePart(media_type=media_type, data=data)
    return ImagePart(url=url)


def _tool(f: _FunctionDef) -> Tool:
    params = f.parameters if f.parameters is not None else {"type": "object", "properties": {}}
    return Tool(f.name, f.description, params, f.strict)


def _tool_choice(choice: str | _NamedToolChoice | _NamedFunction | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, _NamedToolChoice):
        return ToolChoice("tool", choice.function.name)
    if isinstance(choice, _NamedFunction):
        return ToolChoice("tool", choice.name)
    if choice not in ("none", "auto", "required"):
        raise InvalidRequest(f"Invalid value for tool_choice: {choice!r}.", param="tool_choice")
    return ToolChoice(choice)  # type: ignore[arg-type]


def _response_format(f: _FormatText | _FormatJSON | _FormatSchema | None) -> ResponseFormat | None:
    if f is None or isinstance(f, _FormatText):
        return None
    if isinstance(f, _FormatJSON):
        return ResponseFormat("json_object")
    return ResponseFormat("json_schema", f.json_schema.name, f.json_schema.schema, f.json_schema.strict)


def decode_embeddings(body: bytes) -> tuple[EmbeddingRequest, Literal["float", "base64"]]:
    """Decode an embeddings body; returns the canonical request and the encoding the caller wants."""
    r: EmbeddingsRequest = _decode(_embed_decoder, body)
    inputs: list[str] | list[list[int]]
    if isinstance(r.input, str):
        inputs = [r.input]
    elif all(isinstance(i, int) for i in r.input):
        inputs = [cast("list[int]", r.input)] if r.input else []
    elif all(isinstance(i, str) for i in r.input) or all(isinstance(i, list) for i in r.input):
        inputs = cast("list[str] | list[list[int]]", r.input)
    else:
        raise InvalidRequest("'input' must be a string, an array of strings, or token arrays.", param="input")
    if not inputs or any(len(i) == 0 for i in inputs):
        raise InvalidRequest("'input' must not be empty.", param="input")
    return EmbeddingRequest(r.model, inputs, r.dimensions, r.user), r.encoding_format


# ---------------------------------------------------------------------------------------------
# Encoding answers


def _usage(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_input_tokens},
    }


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def encode_response(resp: ChatResponse, response_id: str, created: int | None = None) -> bytes:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": resp.content or None, "refusal": None}
    if resp.tool_calls:
        message["tool_calls"] = _tool_calls(resp.tool_calls)
    elif message["content"] is None:
        message["content"] = ""
    return _encoder.encode(
        {
            "id": response_id,
            "object": "chat.completion",
            "created": created if created is not None else int(time.time()),
            "model": resp.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "stop" if resp.finish_reason == "error" else resp.finish_reason,
                }
            ],
            "usage": _usage(resp.usage),
            "system_fingerprint": None,
        }
    )


class StreamEncoder:
    """Turns canonical stream events into ``chat.completion.chunk`` SSE lines. One per response.

    NOTE: every chunk of a response shares its head (id, created, model) and its tail, so both are
    encoded once here and each event encodes only its own delta: most events are one text delta,
    and building and encoding the whole chunk object per delta was most of this class's cost.
    """

    def __init__(self, response_id: str, model: str, include_usage: bool, created: int | None = None) -> None:
        self._head = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created if created is not None else int(time.time()),
            "model": model,
            "system_fingerprint": None,
        }
        self._include_usage = include_usage
        self._started = False
        # b'data: {"id":...,"system_fingerprint":null,"choices":[{"index":0,"delta":' DELTA TAIL
        head = _encoder.encode(self._head)[:-1]
        self._open = b"data: " + head + b',"choices":[{"index":0,"delta":'
        self._end = b"}]" + (b',"usage":null' if include_usage else b"") + b"}\n\n"
        self._tail = b',"logprobs":null,"finish_reason":null' + self._end

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        finish = b"null" if finish_reason is None else _encoder.encode(finish_reason)
        return self._open + _encoder.encode(delta) + b',"logprobs":null,"finish_reason":' + finish + self._end

    def encode(self, event: StreamEvent) -> bytes:
        """The SSE bytes for one event (possibly empty)."""
        out = b""
        if not self._started:
            self._started = True
            out = self._open + _ROLE_DELTA + self._tail
        if isinstance(event, TextDelta):
            return out + self._open + b'{"content":' + _encoder.encode(event.text) + b"}" + self._tail
        if isinstance(event, ToolCallDelta):
            call: dict[str, Any] = {"index": event.index, "function": {"arguments": event.arguments}}
            if event.id is not None:
                call["id"] = event.id
                call["type"] = "function"
            if event.name is not None:
                call["function"]["name"] = event.name
            return out + self._chunk({"tool_calls": [call]})
        if isinstance(event, Finish):
            reason = "stop" if event.reason == "error" else event.reason
            return out + self._chunk({}, reason)
        if isinstance(event, UsageEvent) and self._include_usage:
            return (
                out + b"data: " + _encoder.encode({**self._head, "choices": [], "usage": _usage(event.usage)}) + b"\n\n"
            )
        return out

    def close(self) -> bytes:
        """The terminator after the last event."""
        return b"data: [DONE]\n\n"

    def error(self, exc: GatewayError) -> bytes:
        """An error after the first byte: an ``error`` object the SDKs raise on; no ``[DONE]`` follows."""
        return b"data: " + _encoder.encode(_error_body(exc)) + b"\n\n"


def _error_body(exc: GatewayError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.error_type, "param": exc.param, "code": exc.code}}


def render_error(exc: GatewayError) -> bytes:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return _encoder.encode(_error_body(exc))


def encode_embeddings(resp: EmbeddingResponse, encoding: Literal["float", "base64"]) -> bytes:
    """A ``list`` of ``embedding`` objects; base64 is little-endian float32, as OpenAI sends it."""
    data = []
    for i, vector in enumerate(resp.data):
        value: list[float] | str = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return _encoder.encode(
        {
            "object": "list",
            "data": data,
            "model": resp.model,
            "usage": {"prompt_tokens": resp.usage.input_tokens, "total_tokens": resp.usage.input_tokens},
        }
    )


def encode_models(models: list[tuple[str, str]], created: int) -> bytes:
    """``GET /v1/models``: ``(id, owned_by)`` pairs."""
    return _encoder.encode(
        {"object": "list", "data": [encode_model(m, owner, created, raw=True) for m, owner in models]}
    )


def encode_model(model: str, owner: str, created: int, *, raw: bool = False) -> Any:
    """One ``model`` object (bytes, or the dict when ``raw``)."""
    obj = {"id": model, "object": "model", "created": created, "owned_by": owner}
    return obj if raw else _encoder.encode(obj)
