"""The exact-match cache key: SHA-256 over a canonical serialization of what determines an answer.

Owns which ``ChatRequest`` fields go into the key (``KEYED``) and which are left out on purpose,
each with its reason (``EXCLUDED``); a test fails when a new field is in neither. Owns the
canonical form too: JSON with sorted keys and no whitespace, tool-call arguments (JSON text inside
a string) re-encoded the same way, and pass-through extras minus the ones that never change an
answer (``NEUTRAL_EXTRAS``). Does not own whether a request may be cached (``gateway.cache.rules``)
nor where entries live (``gateway.cache.store``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal, NewType

import msgspec

if TYPE_CHECKING:
    from gateway.types import ChatRequest

CacheKey = NewType("CacheKey", str)
"""``<scope>:<sha256 hex>``; the scope (a tenant, or ``*`` when shared) leads so a tenant can be purged."""

Kind = Literal["json", "stream"]
"""Streamed and non-streamed answers are separate entries: each replays in its own shape."""

SHARED_SCOPE = "*"
VERSION = b"crossway-cache-v1"
"""Bumped when the canonical form changes, so old entries are never read under new meaning."""

KEYED: frozenset[str] = frozenset(
    {
        "model",  # replaced by the alias or the resolved deployment, as the policy's ``key_by`` says
        "messages",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "seed",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "stream",  # as the entry's kind
        "extra",  # minus NEUTRAL_EXTRAS: penalties, logit_bias, reasoning_effort... change the answer
    }
)
"""``ChatRequest`` fields that go into the key."""

EXCLUDED: dict[str, str] = {
    "stream_usage": "only whether the usage chunk is encoded; every entry stores usage",
    "user": "an end-user id for the vendor's abuse monitoring; it does not change the answer",
    "wire": "a hit is re-encoded in the caller's wire format; wire-specific extras are keyed",
    "tenant": "the key's scope, unless the policy shares the cache across tenants",
    "stable_prefix": "derived from the tools and messages, which are keyed",
}
"""``ChatRequest`` fields left out of the key, with the reason."""

NEUTRAL_EXTRAS: frozenset[str] = frozenset(
    {
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
    }
)
"""Pass-through fields that steer billing, logging or the vendor's own cache, never the answer."""

_encoder = msgspec.json.Encoder(order="sorted")


def canonical(request: ChatRequest, model: str) -> bytes:
    """The canonical bytes of a request's keyed fields, with ``model`` standing for the requested one.

    Two requests that differ only in dict order, JSON whitespace inside tool-call arguments, or an
    excluded field give the same bytes.
    """
    doc: dict[str, Any] = {name: getattr(request, name) for name in KEYED if name not in ("extra", "messages")}
    doc["model"] = model
    doc["messages"] = [_message(m) for m in msgspec.to_builtins(request.messages)]
    doc["extra"] = {k: v for k, v in request.extra.items() if k not in NEUTRAL_EXTRAS}
    return _encoder.encode(doc)


def cache_key(request: ChatRequest, model: str, scope: str) -> CacheKey:
    """The key of ``request`` under ``scope`` (a tenant, or ``SHARED_SCOPE``).

    Args:
        request: the canonical request (its ``stream`` flag picks the entry's kind).
        model: the alias the caller asked for, or the deployment (``provider/model``) serving it.
        scope: where the entry is visible; it is hashed too, so scopes never collide.
    """
    digest = hashlib.sha256(VERSION)
    for part in (scope.encode(), b"\0", canonical(request, model)):
        digest.update(part)
    return CacheKey(f"{scope}:{digest.hexdigest()}")


def scope_of(key: str) -> str:
    """The scope a key belongs to (everything before its last colon)."""
    return key.rpartition(":")[0]


def _message(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if calls:
        m["tool_calls"] = [{**c, "arguments": _json_text(c["arguments"])} for c in calls]
    return m


def _json_text(text: str) -> Any:
    """JSON text as its value (so whitespace and key order vanish); text that is not JSON stays text."""
    try:
        return {"json": msgspec.json.decode(text)}
    except msgspec.DecodeError:
        return {"text": text}
