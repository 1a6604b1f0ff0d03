"""The HTTP side of a streamed answer: one lean ASGI response that writes SSE bytes as events come.

Owns sending the response head, one ASGI body message per encoded event, the terminator or the
error event after the first byte (never a clean close that looks complete), and noticing a client
that went away, which closes the event source at once so the upstream call stops too. Does not own
any wire format's bytes (each wire's ``StreamEncoder``) nor what a stream does upstream and in the
ledger (``gateway.pipeline``).

NOTE: this replaces Litestar's ``Stream`` on the streaming routes. That one runs every response in
an anyio task group (a cancel scope, a second task for the disconnect listener, a wrapper per
chunk); on a stream of a dozen small events it cost more gateway CPU than encoding them. Here the
disconnect listener is one plain asyncio task and the loop sends straight to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from litestar.response import Stream

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from litestar import Litestar, Request
    from litestar.types import Receive, Scope, Send

    from gateway.types import StreamEvent

log = structlog.get_logger("gateway.api")

_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


class StreamEncoder(Protocol):
    """A wire format's stream encoder (``gateway.wire.openai.StreamEncoder`` or the Anthropic one)."""

    def encode(self, event: StreamEvent) -> bytes: ...  # noqa: D102
    def close(self) -> bytes: ...  # noqa: D102
    def error(self, exc: GatewayError) -> bytes: ...  # noqa: D102


class EventStream(Stream):
    """A ``text/event-stream`` response over canonical stream events.

    Litestar sees a ``Stream`` (so the OpenAPI document and the handler's return type stay as they
    were); ``to_asgi_response`` hands it our own ASGI app instead of Litestar's streaming one.
    """

    __slots__ = ("_encoder", "_events", "_to_error")

    def __init__(
        self,
        events: AsyncIterator[StreamEvent],
        encoder: StreamEncoder,
        to_error: Callable[[Exception], GatewayError],
        headers: dict[str, str],
    ) -> None:
        """Stream ``events`` through ``encoder``.

        Args:
            events: the pipeline's events; closed here however the response ends.
            encoder: the wire's encoder for this one response.
            to_error: turns whatever broke the stream into the gateway error sent as the last event.
            headers: response headers besides the content type.
        """
        super().__init__((), media_type="text/event-stream", headers=headers)
        self._events = events
        self._encoder = encoder
        self._to_error = to_error

    def to_asgi_response(self, app: Litestar | None, request: Request[Any, Any, Any], **kwargs: Any) -> Any:
        """The ASGI app that sends this stream (Litestar calls it with the connection's scope)."""
        head = [_CONTENT_TYPE, *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items())]
        return _SSEApp(head, self._events, self._encoder, self._to_error)


class _SSEApp:
    """One streamed response; called once."""

    __slots__ = ("_encoder", "_events", "_gone", "_head", "_to_error")

    def __init__(
        self,
        head: list[tuple[bytes, bytes]],
        events: AsyncIterator[StreamEvent],
        encoder: StreamEncoder,
        to_error: Callable[[Exception], GatewayError],
    ) -> None:
        self._head = head
        self._events = events
        self._encoder = encoder
        self._to_error = to_error
        self._gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - ASGI apps always run inside a task
        listener = asyncio.get_running_loop().create_task(self._listen(receive, task))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._head})
            await self._pump(send)
        except asyncio.CancelledError:
            if not self._gone:
                raise
            task.uncancel()  # our own cancel: the client left, which ends this response normally
        finally:
            listener.cancel()
            await self._events.aclose()  # type: ignore[attr-defined]  # runs the pipeline's accounting now

    async def _pump(self, send: Send) -> None:
        encoder = self._encoder
        events = self._events
        ready: list[bytes] = []  # encoded events not sent yet: they go out together
        try:
            while True:
                # NOTE: each step runs until it returns or first suspends. Events that are already
                # there (an upstream read usually carries several) are encoded into one body message;
                # only a step that must wait flushes what is ready first, so nothing is held back.
                step = events.__anext__().__await__()
                try:
                    try:
                        waiting_on = step.send(None)
                    except StopIteration as done:
                        event = done.value
                    else:
                        if ready:
                            body, ready = b"".join(ready), []
                            try:
                                await send({"type": "http.response.body", "body": body, "more_body": True})
                            except BaseException as exc:
                                await _Rest(step, None, exc)  # the step sees what broke the send, and cleans up
                                raise
                        event = await _Rest(step, waiting_on)
                except StopAsyncIteration:
                    break
                chunk = encoder.encode(event)
                if chunk:
                    ready.append(chunk)
            ready.append(encoder.close())
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client must see an error, not a clean close
            err = self._to_error(exc)
            log.error("stream_failed", status=err.status_code, error=type(err).__name__, message=err.message)
            ready.append(encoder.error(err))
        await send({"type": "http.response.body", "body": b"".join(ready), "more_body": False})

    async def _listen(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        """Cancel the response's task when the client disconnects before the stream is done."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        task.cancel()


class _Rest:
    """Awaits the rest of a step (``__anext__().__await__()``) that already ran to its first suspension.

    Whatever the task delivers meanwhile (a result, a cancellation) goes to the step exactly as if
    the task had been awaiting it all along; ``error`` is thrown in first when given.
    """

    __slots__ = ("_error", "_step", "_waiting_on")

    def __init__(self, step: Generator[Any, Any, StreamEvent], waiting_on: Any, error: BaseException | None = None):
        self._step = step
        self._waiting_on = waiting_on
        self._error = error

    def __await__(self) -> Generator[Any, Any, StreamEvent]:
        step = self._step
        try:
            value = step.throw(self._error) if self._error is not None else self._waiting_on
            while True:
                try:
                    sent = yield value
                except BaseException as exc:  # noqa: BLE001 - handed on to the step, which decides
                    value = step.throw(exc)
                else:
                    value = step.send(sent)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
