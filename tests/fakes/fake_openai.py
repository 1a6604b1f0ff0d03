"""OpenAI's wire as the fake upstream speaks it: request reading and response rendering.

Owns the exact bytes of ``chat.completion`` objects, ``chat.completion.chunk`` SSE lines
(``data: {...}\\n\\n`` ... ``data: [DONE]\\n\\n``, with the ``choices: []`` usage chunk when
``stream_options.include_usage`` is set), embeddings lists and OpenAI error bodies. Does not own
routing, auth or recording (``tests.fakes.upstream``) nor what the model says (``tests.fakes.scenario``).
"""

from __future__ import annotations

import base64
import struct
from typing import TYPE_CHECKING, Any

import msgspec

from tests.fakes.scenario import CREATED, Prompt, next_id, vector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.fakes.scenario import Answer

_encode = msgspec.json.encode
_FINISH = {"stop": "stop", "length": "length", "tool": "tool_calls"}
_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request: the fake was asked to fail with 400.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to sample from this model.", "invalid_request_error", None),
    404: ("The model does not exist or you do not have access to it.", "invalid_request_error", "model_not_found"),
    429: ("Rate limit reached for requests. Please try again in 1s.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}
DEFAULT_DIMENSIONS = 16


def error(status: int, message: str | None = None) -> bytes:
    """An OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    default, kind, code = _ERRORS.get(status, (f"HTTP {status}", "server_error", None))
    return _encode({"error": {"message": message or default, "type": kind, "param": None, "code": code}})


def unauthorized(key: str | None) -> bytes:
    """The 401 body for a missing or wrong key. Unlike OpenAI (which masks the middle), it echoes the
    whole key it got, so tests can prove the gateway never passes it on."""
    if not key:
        return error(
            401,
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    return error(
        401,
        f"Incorrect API key provided: {key}. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
    )


def prompt(body: dict[str, Any]) -> Prompt:
    """Read a chat completions request."""
    messages = body["messages"]
    result = Prompt(messages=len(messages))
    for m in messages:
        text = _text(m.get("content"))
        result.prompt_chars += len(text)
        if m["role"] in ("user", "tool"):
            result.last_text = text
    result.tools = [t["function"]["name"] for t in body.get("tools") or ()]
    choice = body.get("tool_choice")
    if choice == "required" and result.tools:
        result.forced_tool = result.tools[0]
    elif isinstance(choice, dict):
        result.forced_tool = choice["function"]["name"]
    result.max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return result


def completion(answer: Answer, model: str) -> bytes:
    """A whole ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": None if answer.tool else answer.text, "refusal": None}
    if answer.tool:
        t = answer.tool
        message["tool_calls"] = [
            {"id": f"call_{t.id}", "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
        ]
    message["annotations"] = []
    return _encode(
        {
            "id": f"chatcmpl-{next_id()}",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _FINISH[answer.finish]}],
            "usage": _usage(answer),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }
    )


def events(answer: Answer, model: str, *, include_usage: bool) -> Iterator[bytes]:
    """The SSE lines of a streamed completion (cut short or broken as ``answer.mode`` says)."""
    base = {
        "id": f"chatcmpl-{next_id()}",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        doc: dict[str, Any] = {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            doc["usage"] = None
        return b"data: " + _encode(doc) + b"\n\n"

    if answer.mode == "bad_json":
        yield b"data: {this is not json\n\n"
        return
    t = answer.tool
    if t is None:
        yield chunk({"role": "assistant", "content": "", "refusal": None})
    else:
        yield chunk(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": f"call_{t.id}",
                        "type": "function",
                        "function": {"name": t.name, "arguments": ""},
                    }
                ],
                "refusal": None,
            }
        )
    for i, piece in enumerate(answer.pieces):
        if answer.mode == "cut" and i == 2:
            return
        if answer.mode == "stream_error" and i == 1:
            yield b"data: " + error(500) + b"\n\n"
            return
        yield chunk({"content": piece})
    for piece in t.pieces if t else ():
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
    yield chunk({}, _FINISH[answer.finish])
    if include_usage:
        yield b"data: " + _encode({**base, "choices": [], "usage": _usage(answer)}) + b"\n\n"
    yield b"data: [DONE]\n\n"


def embeddings(body: dict[str, Any], model: str) -> bytes:
    """An embeddings list for ``input`` (string, strings, token ids or lists of them)."""
    raw = body["input"]
    items = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    dims = int(body.get("dimensions") or DEFAULT_DIMENSIONS)
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for index, item in enumerate(items):
        values = vector(str(item), dims)
        tokens += len(item) if isinstance(item, list) else max(1, len(item) // 4)
        embedding: Any = base64.b64encode(struct.pack(f"<{dims}f", *values)).decode() if as_base64 else values
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return _encode(
        {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )


def models() -> bytes:
    """``GET /v1/models``."""
    names = ("gpt-4o-mini", "tool-gpt", "text-embedding-3-small")
    return _encode(
        {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": CREATED, "owned_by": "fake"} for n in names],
        }
    )


def _usage(answer: Answer) -> dict[str, Any]:
    return {
        "prompt_tokens": answer.input_tokens,
        "completion_tokens": answer.output_tokens,
        "total_tokens": answer.input_tokens + answer.output_tokens,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or () if isinstance(p, dict) and p.get("type") == "text")
