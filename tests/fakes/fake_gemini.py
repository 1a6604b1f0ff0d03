"""Gemini's v1beta wire as the fake upstream speaks it: request reading and response rendering.

Owns the exact bytes of ``GenerateContentResponse`` objects, their ``streamGenerateContent``
framings (``alt=sse``: ``data: {...}\\r\\n\\r\\n`` with no terminator; otherwise one JSON array),
``batchEmbedContents`` answers and Google error bodies (``{"error": {"code", "message", "status"}}``).
Does not own routing, auth or recording (``tests.fakes.upstream``) nor what the model says
(``tests.fakes.scenario``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from tests.fakes.scenario import Prompt, next_id, vector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.fakes.scenario import Answer

_encode = msgspec.json.encode
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool": "STOP"}
_ERRORS: dict[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: ("UNAUTHENTICATED", "API key not valid. Please pass a valid API key."),
    403: ("PERMISSION_DENIED", "The caller does not have permission."),
    404: ("NOT_FOUND", "models/unknown is not found for API version v1beta."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: (
        "INTERNAL",
        "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
    ),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    504: ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
}
DEFAULT_DIMENSIONS = 16


def error(status: int, message: str | None = None) -> bytes:
    """A Google API error body."""
    code, default = _ERRORS.get(status, ("UNKNOWN", f"HTTP {status}"))
    return _encode({"error": {"code": status, "message": message or default, "status": code}})


def prompt(body: dict[str, Any]) -> Prompt:
    """Read a generateContent request; raises ``ValueError`` for what Gemini would reject."""
    contents = body["contents"]
    result = Prompt(messages=len(contents))
    for part in (body.get("systemInstruction") or {}).get("parts") or ():
        result.prompt_chars += len(part.get("text", ""))
    for content in contents:
        if content.get("role", "user") not in ("user", "model"):
            raise ValueError(f"Please use a valid role: user, model (got {content.get('role')!r}).")
        texts = []
        for part in content["parts"]:
            if "text" in part:
                texts.append(part["text"])
            elif "functionResponse" in part:
                response = part["functionResponse"]["response"]
                output = response.get("output", response)
                texts.append(output if isinstance(output, str) else _encode(output).decode())
        text = "".join(texts)
        result.prompt_chars += len(text)
        if content.get("role", "user") == "user":
            result.last_text = text
    result.tools = [d["name"] for tool in body.get("tools") or () for d in tool.get("functionDeclarations") or ()]
    calling = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    if calling.get("mode") == "ANY" and result.tools:
        result.forced_tool = (calling.get("allowedFunctionNames") or result.tools)[0]
    result.max_tokens = (body.get("generationConfig") or {}).get("maxOutputTokens")
    return result


def response(answer: Answer, model: str) -> bytes:
    """A whole ``GenerateContentResponse``."""
    parts: list[dict[str, Any]] = [{"text": answer.text}] if answer.text else []
    if answer.tool:
        parts.append({"functionCall": {"name": answer.tool.name, "args": msgspec.json.decode(answer.tool.arguments)}})
    return _encode(_chunk(answer, model, f"{next_id()}", parts, final=True))


def events(answer: Answer, model: str, *, sse: bool) -> Iterator[bytes]:
    """The streamed chunks, as SSE events or as pieces of one JSON array (cut or broken per ``answer.mode``)."""
    rid = next_id()
    chunks: list[bytes] = []
    if answer.tool:
        call = {"functionCall": {"name": answer.tool.name, "args": msgspec.json.decode(answer.tool.arguments)}}
        chunks.append(_encode(_chunk(answer, model, rid, [call], final=True)))
    else:
        last = len(answer.pieces) - 1
        for i, piece in enumerate(answer.pieces):
            if answer.mode == "cut" and i == 2:
                break
            if answer.mode == "stream_error" and i == 1:
                chunks.append(error(503))
                break
            chunks.append(_encode(_chunk(answer, model, rid, [{"text": piece}], final=i == last)))
        if not answer.pieces:
            chunks.append(_encode(_chunk(answer, model, rid, [], final=True)))
    if answer.mode == "bad_json":
        chunks = [b"{this is not json"]
    if sse:
        for chunk in chunks:
            yield b"data: " + chunk + b"\r\n\r\n"
    else:
        yield b"[" + b",\r\n".join(chunks) + b"]"


def embeddings(body: dict[str, Any]) -> bytes:
    """A ``batchEmbedContents`` answer."""
    out = []
    for request in body["requests"]:
        text = "".join(p.get("text", "") for p in request["content"]["parts"])
        out.append({"values": vector(text, int(request.get("outputDimensionality") or DEFAULT_DIMENSIONS))})
    return _encode({"embeddings": out})


def _chunk(answer: Answer, model: str, rid: str, parts: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if final:
        candidate["finishReason"] = _FINISH[answer.finish]
    candidate["index"] = 0
    usage: dict[str, Any] = {"promptTokenCount": answer.input_tokens}
    if final:
        usage["candidatesTokenCount"] = answer.output_tokens
        if answer.thoughts_tokens:
            usage["thoughtsTokenCount"] = answer.thoughts_tokens
    if answer.cached_tokens:
        usage["cachedContentTokenCount"] = answer.cached_tokens
    usage["totalTokenCount"] = answer.input_tokens + (answer.output_tokens + answer.thoughts_tokens if final else 0)
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": answer.input_tokens}]
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": model, "responseId": rid}
