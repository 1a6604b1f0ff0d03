"""Shared setup for adapter tests: the fake vendors on loopback, and adapters over canned bytes."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest

from gateway.policy import ProviderConfig
from gateway.providers import build_providers
from gateway.types import ChatRequest, Message, StreamEvent, TextPart
from tests.fakes.upstream import FakeKeys, FakeUpstream

if TYPE_CHECKING:
    from gateway.providers.base import Provider

KEYS = FakeKeys()
KINDS = ("openai", "anthropic", "gemini")
MOCK_URL = "https://vendor.example.test"


def key_for(kind: str) -> str:
    return str(getattr(KEYS, kind))


def make_config(kind: str, url: str, *, api_key: str | None = "", **overrides: Any) -> ProviderConfig:
    """A config for ``kind`` at the server ``url`` (``/v1`` is added for OpenAI); the fake's key by default."""
    values: dict[str, Any] = {
        "name": kind,
        "kind": kind,
        "base_url": f"{url}/v1" if kind == "openai" else url,
        "api_key": key_for(kind) if api_key == "" else api_key,
        "timeout_s": 5.0,
        "connect_timeout_s": 1.0,
    }
    values.update(overrides)
    return ProviderConfig(**values)


def user(text: str) -> Message:
    return Message("user", [TextPart(text)])


def chat(text: str = "hello there", **fields: Any) -> ChatRequest:
    return ChatRequest(model="alias", messages=[user(text)], **fields)


async def collect(provider: Provider, request: ChatRequest, model: str) -> list[StreamEvent]:
    return [event async for event in provider.stream(request, model)]


async def drain(stream: AsyncIterator[StreamEvent], into: list[StreamEvent]) -> None:
    """Consume ``stream`` into ``into``, so that events seen before a failure stay inspectable."""
    async for event in stream:
        into.append(event)


def sse(*frames: str) -> bytes:
    """SSE body from frames written without their blank-line terminators."""
    return "".join(f"{frame}\n\n" for frame in frames).encode()


def data(doc: Any) -> str:
    return "data: " + msgspec.json.encode(doc).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokenStream(httpx.AsyncByteStream):
    """A response body that yields ``chunks`` and then fails as a dropped connection does."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


@pytest.fixture
def live(upstream: FakeUpstream, client: httpx.AsyncClient) -> Callable[..., Provider]:
    """``live(kind, **config_overrides)``: an adapter talking to the fake vendors over loopback."""

    def make(kind: str, **overrides: Any) -> Provider:
        return build_providers({kind: make_config(kind, upstream.url, **overrides)}, client)[kind]

    return make


Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
async def mocked() -> AsyncIterator[Callable[..., Provider]]:
    """``mocked(kind, handler, **config_overrides)``: an adapter whose client answers with ``handler``."""
    clients: list[httpx.AsyncClient] = []

    def make(kind: str, handler: Handler, **overrides: Any) -> Provider:
        c = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        clients.append(c)
        return build_providers({kind: make_config(kind, MOCK_URL, **overrides)}, c)[kind]

    yield make
    for c in clients:
        await c.aclose()


class Recorder:
    """A MockTransport handler that answers with fixed bytes and keeps the requests it saw."""

    def __init__(self, body: bytes | httpx.AsyncByteStream = b"{}", status: int = 200, **headers: str) -> None:
        self.body, self.status, self.headers = body, status, headers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if isinstance(self.body, bytes):
            return httpx.Response(self.status, content=self.body, headers=self.headers)
        return httpx.Response(self.status, stream=self.body, headers=self.headers)

    @property
    def json(self) -> Any:
        """The JSON body of the last request."""
        return msgspec.json.decode(self.requests[-1].content)
