"""What every provider adapter is, and the pieces they share.

Owns the ``Provider`` protocol, the mapping of transport failures and vendor HTTP statuses into
``gateway.errors`` (the only place that happens), and a server-sent-events reader. Does not own any
vendor's format: each adapter module (``openai``, ``anthropic``, ``gemini``) owns its own.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, NamedTuple, Protocol

import httpx

from gateway.errors import (
    InvalidRequest,
    ProviderBadResponse,
    ProviderRateLimited,
    ProviderTimeout,
    ProviderUnavailable,
    UpstreamError,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from gateway.policy import ProviderConfig
    from gateway.types import ChatRequest, ChatResponse, EmbeddingRequest, EmbeddingResponse, StreamEvent


class Provider(Protocol):
    """A vendor API reached over the shared pooled ``httpx.AsyncClient``.

    Adapters hold no per-request state and may be called concurrently. They never log or return
    their API key. Every failure leaves them as a ``gateway.errors.GatewayError``.
    """

    config: ProviderConfig

    async def chat(self, request: ChatRequest, model: str) -> ChatResponse:
        """One non-streamed completion from upstream ``model``."""
        ...

    def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        """A streamed completion. The iterator owns the upstream connection; closing it closes that."""
        ...

    async def embed(self, request: EmbeddingRequest, model: str) -> EmbeddingResponse:
        """Embeddings from upstream ``model``; raises ``InvalidRequest`` where the vendor has none."""
        ...


class SSEvent(NamedTuple):
    """One server-sent event."""

    event: str | None
    data: str


async def iter_sse(response: httpx.Response) -> AsyncIterator[SSEvent]:
    """Parse a ``text/event-stream`` body into events (WHATWG rules: blank line ends an event).

    NOTE: works on raw bytes, splitting whole events at blank lines, rather than line by line through
    ``aiter_lines``: a chunk from an LLM API usually holds exactly one event, so this is one split and
    a few partitions per event instead of a text decoder and a line buffer per line.
    """
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        if b"\r" in buffer:  # normalise line ends; a trailing \r may be half of \r\n, so it waits
            tail = b"\r" if buffer.endswith(b"\r") else b""
            buffer = buffer[: len(buffer) - len(tail)].replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
        *blocks, buffer = buffer.split(b"\n\n")
        for block in blocks:
            if (sse := _event(block)) is not None:
                yield sse
    if buffer.strip() and (sse := _event(buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))) is not None:
        yield sse


def _event(block: bytes) -> SSEvent | None:
    event: str | None = None
    data: list[str] = []
    for line in block.decode("utf-8", "replace").split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    return SSEvent(event, "\n".join(data)) if data else None


@contextlib.contextmanager
def transport_errors(provider: str) -> Iterator[None]:
    """Map httpx transport exceptions raised inside the block into the gateway's error tree."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise ProviderTimeout(f"{provider}: upstream timed out ({type(exc).__name__})") from exc
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        raise ProviderUnavailable(f"{provider}: upstream connection failed ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:
        raise ProviderUnavailable(f"{provider}: upstream transport error ({type(exc).__name__})") from exc


def status_error(
    provider: str, status: int, message: str, retry_after: str | None = None
) -> UpstreamError | InvalidRequest:
    """The gateway error for a vendor's non-2xx status. ``message`` is the vendor's own error text.

    400/422 are the caller's fault and pass through as ``InvalidRequest``; 401/403/404 mean our
    configuration is wrong and become a 502 that does not echo credentials.
    """
    text = f"{provider}: {message}" if message else f"{provider}: upstream returned HTTP {status}"
    if status in (400, 422):
        return InvalidRequest(text)
    if status == 408:
        return ProviderTimeout(text)
    if status == 429:
        return ProviderRateLimited(text, retry_after=_seconds(retry_after))
    if status in (401, 403):
        return ProviderBadResponse(f"{provider}: upstream rejected the gateway's credentials (HTTP {status})")
    if status == 404:
        return ProviderBadResponse(f"{provider}: upstream does not know this model or path (HTTP 404): {message}")
    if status in (500, 502, 503, 504, 529):
        return ProviderUnavailable(text)
    return ProviderBadResponse(text)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
