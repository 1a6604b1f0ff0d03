"""The canonical request, response and stream event shapes that every stage speaks.

Client wire formats (``gateway.wire``) decode into these and encode out of them; provider adapters
(``gateway.providers``) translate them to and from each vendor's API. Nothing here knows about
HTTP or any vendor. Structs are mutable msgspec Structs for speed; stages treat them as values.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import msgspec

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]
Wire = Literal["openai", "anthropic"]
UsageSource = Literal["provider", "engine", "estimate"]


class TextPart(msgspec.Struct, tag="text"):
    """Plain text content."""

    text: str


class ImagePart(msgspec.Struct, tag="image"):
    """An image given by URL or inline data."""

    url: str | None = None
    """An http(s) URL; ``None`` when the image is inline."""
    media_type: str | None = None
    """MIME type of inline data, for example ``image/png``."""
    data: str | None = None
    """Base64 data of an inline image."""


Part = TextPart | ImagePart


class ToolCall(msgspec.Struct):
    """A function call the model asked for."""

    id: str
    name: str
    arguments: str
    """JSON text of the arguments, exactly as the model produced it."""


class Message(msgspec.Struct):
    """One turn of the conversation. System prompts are messages with role ``system``."""

    role: Role
    content: list[Part] = msgspec.field(default_factory=list)
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    """Assistant turns only."""
    tool_call_id: str | None = None
    """Tool turns only: which call this is the result of."""
    is_error: bool = False
    """Tool turns only: the tool failed."""

    def text(self) -> str:
        """All text parts joined."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class Tool(msgspec.Struct):
    """A function the model may call."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolChoice(msgspec.Struct):
    """How the model must use tools: ``auto``, ``none``, ``required`` (any tool) or ``tool`` (the named one)."""

    mode: Literal["auto", "none", "required", "tool"]
    name: str | None = None


class ResponseFormat(msgspec.Struct):
    """Structured output request."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class PrefixBlock(NamedTuple):
    """One leading block of a prompt (``gateway.cache.prefix`` computes them)."""

    kind: str
    """``tools``, ``system`` or the turn's role."""
    hash: str
    """Chained SHA-256 hex of every block up to and including this one."""
    chars: int
    """Characters of every block up to and including this one (a size estimate, not a token count)."""


class ChatRequest(msgspec.Struct):
    """A chat completion request, whatever wire it came in on."""

    model: str
    messages: list[Message]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    seed: int | None = None
    tools: list[Tool] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    stream: bool = False
    stream_usage: bool = False
    """OpenAI wire: the caller asked for a final usage chunk (``stream_options.include_usage``). Adapters
    ignore it: the gateway always asks upstreams for usage."""
    user: str | None = None
    wire: Wire = "openai"
    """The caller's wire format."""
    tenant: str | None = None
    """Set by the pipeline after auth (never by a client): providers that cache per tenant use it."""
    stable_prefix: PrefixBlock | None = None
    """Set once per request by ``gateway.cache.prefix.request_prefix`` (never by a client): the tools-and-system
    prefix, shared by prefix affinity (``gateway.pipeline.workload``) and provider cache keys."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Fields of the caller's wire that have no canonical meaning (``presence_penalty``, ``metadata``...).
    Forwarded only to a provider that speaks the same wire; other providers ignore them."""


class Usage(msgspec.Struct):
    """Token counts of one call. ``input_tokens`` includes cached and cache-write tokens."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    source: UsageSource = "provider"


class ChatResponse(msgspec.Struct):
    """A complete (non-streamed) answer."""

    model: str
    content: str
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: Usage = msgspec.field(default_factory=Usage)


# Stream events. A provider stream yields these in order: any number of TextDelta and
# ToolCallDelta, then exactly one Finish, then at most one UsageEvent (some vendors send usage last).


class TextDelta(msgspec.Struct, tag="text"):
    """A piece of assistant text."""

    text: str


class ToolCallDelta(msgspec.Struct, tag="tool_call"):
    """A piece of a tool call. The first delta of a call carries ``id`` and ``name``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class Finish(msgspec.Struct, tag="finish"):
    """The model stopped."""

    reason: FinishReason


class UsageEvent(msgspec.Struct, tag="usage"):
    """Token counts for the whole stream."""

    usage: Usage


StreamEvent = TextDelta | ToolCallDelta | Finish | UsageEvent


class EmbeddingRequest(msgspec.Struct):
    """An embeddings request (OpenAI wire only)."""

    model: str
    input: list[str] | list[list[int]]
    dimensions: int | None = None
    user: str | None = None


class EmbeddingResponse(msgspec.Struct):
    """Vectors in input order."""

    model: str
    data: list[list[float]]
    usage: Usage = msgspec.field(default_factory=Usage)
