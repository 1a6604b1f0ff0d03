"""A stored answer: the complete response, or the complete list of stream events, and what it cost.

Owns the entry's shape and its bytes (msgspec MessagePack: compact and fast to decode on the hit
path), and turning an entry back into a response or an event stream. Only complete answers become
entries: a stream is stored once it has ended with ``Finish`` and usage. Does not own keys, stores
or policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.types import ChatResponse, Finish, StreamEvent, UsageEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence


class Entry(msgspec.Struct, array_like=True):
    """One cached answer. Exactly one of ``response`` and ``events`` is set."""

    created: float
    """Unix time the answer was stored (the ``age`` of a hit counts from it)."""
    provider: str
    model: str
    """The deployment that produced it (the upstream model name)."""
    seconds: float
    """How long producing it took: the time a hit saves."""
    cost_usd: float
    """What it cost at list price: the money a hit saves."""
    response: ChatResponse | None = None
    events: list[StreamEvent] | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Entry)


def encode(entry: Entry) -> bytes:
    """The stored bytes of an entry."""
    return _encoder.encode(entry)


def decode(data: bytes) -> Entry | None:
    """An entry from stored bytes; ``None`` for bytes of another version (read as a miss)."""
    try:
        entry = _decoder.decode(data)
    except msgspec.DecodeError:
        return None
    return entry if (entry.response is None) != (entry.events is None) else None


def complete(events: Sequence[StreamEvent]) -> bool:
    """Whether a recorded stream ended properly: it has a ``Finish`` and ends with usage."""
    return bool(events) and isinstance(events[-1], UsageEvent) and any(isinstance(e, Finish) for e in events)


async def replay(events: Sequence[StreamEvent]) -> AsyncIterator[StreamEvent]:
    """The stored events, in order, as the stream the caller's wire encoder reads."""
    for event in events:
        yield event
