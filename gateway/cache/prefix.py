"""Prefix hashing: chained hashes over the leading blocks of a prompt, to keep upstream KV caches warm.

A prompt is cut into blocks in the order every vendor caches them: the tool definitions, the system
prompt, then each turn. Block ``i``'s hash chains block ``i-1``'s hash with block ``i``'s canonical
bytes (as the engine's KV blocks chain their parent's hash), so two prompts share a block hash
exactly when they share everything up to and including that block.

Owns the blocks and hashes and OpenAI's ``prompt_cache_key`` (tenant + the stable tools-and-system
prefix). ``request_prefix`` computes a request's stable prefix once and keeps it on the request: its
hash is also the key for prefix affinity to an engine replica (``gateway.pipeline.workload``). Does not
own the Anthropic ``cache_control`` markup (``gateway.providers.anthropic`` places it, sized with
these blocks) nor choosing replicas (``gateway.router``, by rendezvous hashing on that key).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import msgspec

from gateway.types import PrefixBlock

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.types import ChatRequest

_encoder = msgspec.json.Encoder(order="sorted")
CHARS_PER_TOKEN = 4
"""A rough, tokenizer-free size estimate: deciding whether a prefix is worth caching needs no more."""
PROMPT_CACHE_MIN_CHARS = 1024 * CHARS_PER_TOKEN
"""Shorter prefixes are not worth a provider cache hint: OpenAI caches prompts from 1024 tokens on, and
Anthropic's smallest cacheable prefix is 1024 tokens (more on some models: a shorter one is simply
not cached, without an error)."""


__all__ = ["PrefixBlock", "prefix_blocks", "prompt_cache_key", "request_prefix", "stable_prefix"]


def prefix_blocks(request: ChatRequest, *, stable_only: bool = False) -> list[PrefixBlock]:
    """The prompt's blocks in cache order, each with its chained hash and cumulative size.

    Leading system messages form one ``system`` block; later system messages count as turns.
    ``stable_only`` stops before the first turn (the tools-and-system blocks, without hashing the turns).
    """
    parts: list[tuple[str, bytes, int]] = []
    if request.tools:
        raw = _encoder.encode(request.tools)
        parts.append(("tools", raw, len(raw)))
    messages = request.messages
    start = 0
    while start < len(messages) and messages[start].role == "system":
        start += 1
    if start:
        texts = [m.text() for m in messages[:start]]
        parts.append(("system", _encoder.encode(texts), sum(map(len, texts))))
    for m in () if stable_only else messages[start:]:
        raw = _encoder.encode(m)
        parts.append((m.role, raw, len(m.text()) + sum(len(c.arguments) for c in m.tool_calls)))
    blocks: list[PrefixBlock] = []
    parent = b""
    total = 0
    for kind, raw, chars in parts:
        digest = hashlib.sha256(parent + kind.encode() + b"\0" + raw).digest()
        total += chars
        blocks.append(PrefixBlock(kind, digest.hex(), total))
        parent = digest
    return blocks


def stable_prefix(blocks: Sequence[PrefixBlock]) -> PrefixBlock | None:
    """The tools-and-system prefix (the part a conversation keeps from turn to turn), if any."""
    stable = None
    for block in blocks:
        if block.kind not in ("tools", "system"):
            break
        stable = block
    return stable


def request_prefix(request: ChatRequest) -> PrefixBlock | None:
    """The request's tools-and-system prefix, hashed on the first call and kept on the request after.

    The pipeline calls it once per request (``gateway.pipeline.workload``); provider adapters read the
    same block through ``prompt_cache_key``. A request without tools or a system prompt has none, and
    finding that takes no hashing. The request's tools and messages must not change after the first call.
    """
    if request.stable_prefix is None:
        request.stable_prefix = stable_prefix(prefix_blocks(request, stable_only=True))
    return request.stable_prefix


def prompt_cache_key(request: ChatRequest, min_chars: int = PROMPT_CACHE_MIN_CHARS) -> str | None:
    """OpenAI's ``prompt_cache_key``: requests of one tenant with the same tools and system prompt agree.

    OpenAI routes requests with the same key and prefix to the same cache; scoping it by tenant keeps
    one tenant's traffic from crowding another's. ``None`` when the stable prefix is missing or shorter
    than ``min_chars`` (then the field is left out, so OpenAI-compatible servers never see it needlessly).
    """
    stable = request_prefix(request)
    if stable is None or stable.chars < min_chars:
        return None
    digest = hashlib.sha256(f"{request.tenant or ''}\0{stable.hash}".encode()).hexdigest()
    return f"cw-{digest[:32]}"
