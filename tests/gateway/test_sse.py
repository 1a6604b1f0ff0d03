"""``gateway.api.sse``: the streamed response's ASGI app, driven with plain ASGI callables."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from gateway.api.sse import EventStream
from gateway.errors import GatewayError, InternalError, ProviderTimeout
from gateway.types import Finish, StreamEvent, TextDelta

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class Encoder:
    """A wire encoder whose bytes show each event plainly."""

    def encode(self, event: StreamEvent) -> bytes:
        return f"[{event.text}]".encode() if isinstance(event, TextDelta) else b"[finish]"

    def close(self) -> bytes:
        return b"[done]"

    def error(self, exc: GatewayError) -> bytes:
        return f"[error {type(exc).__name__}]".encode()


def to_error(exc: Exception) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, TimeoutError):
        return ProviderTimeout("stalled")
    return InternalError("broken")


class Client:
    """ASGI send and receive of one connection; ``gone`` makes ``receive`` report a disconnect."""

    def __init__(self, send_delay_s: float = 0.0) -> None:
        self.messages: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.send_delay_s = send_delay_s

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message["more_body"] and self.send_delay_s:
            await asyncio.sleep(self.send_delay_s)  # a client that reads slowly: the server's send waits
        self.messages.append(message)

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body"]


async def serve(events: AsyncIterator[StreamEvent], client: Client) -> None:
    response = EventStream(events, Encoder(), to_error, headers={"x-request-id": "r1"})
    app = response.to_asgi_response(None, None)  # type: ignore[arg-type]
    await app({"type": "http"}, client.receive, client.send)


async def test_event_stream_sends_events_ready_together_in_one_body_message() -> None:
    """Events already there go out in one write; one that must wait flushes what is ready first."""
    arrived = asyncio.Event()

    async def events() -> AsyncIterator[StreamEvent]:
        yield TextDelta("a")
        yield TextDelta("b")
        await arrived.wait()
        yield TextDelta("c")
        yield Finish("stop")

    client = Client()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, arrived.set)
    await serve(events(), client)
    assert client.messages[0]["type"] == "http.response.start"
    assert client.messages[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in client.messages[0]["headers"]
    assert (b"x-request-id", b"r1") in client.messages[0]["headers"]
    assert client.bodies == [b"[a][b]", b"[c][finish][done]"]
    assert client.messages[-1]["more_body"] is False


async def test_event_stream_ends_with_error_event_when_source_breaks_after_first_byte() -> None:
    async def events() -> AsyncIterator[StreamEvent]:
        yield TextDelta("a")
        await asyncio.sleep(0)
        raise ProviderTimeout("upstream stalled")

    client = Client()
    await serve(events(), client)
    assert b"".join(client.bodies) == b"[a][error ProviderTimeout]"
    assert b"[done]" not in b"".join(client.bodies)
    assert client.messages[-1]["more_body"] is False


async def test_event_stream_closes_source_when_client_disconnects() -> None:
    """A client that leaves ends the response normally and closes the source at once."""
    closed = asyncio.Event()
    never = asyncio.Event()

    async def events() -> AsyncIterator[StreamEvent]:
        try:
            yield TextDelta("a")
            await never.wait()
            yield TextDelta("never sent")
        finally:
            closed.set()

    client = Client()
    asyncio.get_running_loop().call_later(0.02, client.gone.set)
    async with asyncio.timeout(5):
        await serve(events(), client)
    assert closed.is_set()
    assert b"".join(client.bodies) == b"[a]"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # the response's own cancel was taken back


async def test_event_stream_hands_cancel_to_source_when_it_lands_during_a_flush() -> None:
    """A source's timeout that fires while the client is slow to take a flush still reaches the source."""

    async def events() -> AsyncIterator[StreamEvent]:
        yield TextDelta("a")
        async with asyncio.timeout(0.01):  # expires while the flush of "[a]" is still waiting on the client
            await asyncio.Event().wait()
        yield TextDelta("never sent")

    client = Client(send_delay_s=0.1)
    async with asyncio.timeout(5):
        await serve(events(), client)
    assert b"".join(client.bodies) == b"[error ProviderTimeout]"  # the flush was cut; the error ends it


async def test_event_stream_propagates_cancel_that_is_not_a_disconnect() -> None:
    never = asyncio.Event()

    async def events() -> AsyncIterator[StreamEvent]:
        yield TextDelta("a")
        await never.wait()
        yield TextDelta("never sent")

    client = Client()
    task = asyncio.ensure_future(serve(events(), client))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
