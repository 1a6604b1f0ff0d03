"""A lean HTTP/1.1 keep-alive transport under the gateway's one shared ``httpx.AsyncClient``.

Owns the upstream sockets: opening them (``asyncio.open_connection``, TLS with the system defaults
plus certifi's roots), per-origin stacks of idle keep-alive connections with O(1) checkout, the cap
on open connections (callers wait, up to the pool timeout), writing each request in one write,
parsing responses with ``httptools`` (Content-Length, chunked and read-until-close bodies), and
turning socket failures and timeouts into httpx's own exceptions, so that
``gateway.providers.base.transport_errors`` maps them as before.

Does not own: redirects, cookies, auth, content decoding and URL building (``httpx.AsyncClient``
does those above us), HTTP/2, proxies (with a custom transport httpx ignores ``HTTPS_PROXY``),
``Expect: 100-continue``, or request bodies streamed while sending (bodies are read whole first;
the gateway only sends small JSON bodies).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import certifi
import httptools  # NOTE: always installed: uvicorn[standard], a direct dependency, requires it
import httpx

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

Origin = tuple[str, str, int]

_DEFAULT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
_FRAMING = frozenset((b"content-length", b"transfer-encoding"))
_READ_SIZE = 65536


class _StaleConnectionError(Exception):
    """A reused keep-alive connection failed before any response byte: the peer had closed it."""


class _Conn:
    """One socket and the ``httptools`` parser state of the exchange on it (one at a time)."""

    __slots__ = (
        "chunks",
        "complete",
        "headers",
        "headers_done",
        "idle_since",
        "keep_alive",
        "origin",
        "parser",
        "reader",
        "reason",
        "received",
        "reused",
        "until_close",
        "writer",
    )

    def __init__(self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.origin, self.reader, self.writer = origin, reader, writer
        # NOTE: one parser per connection: llhttp resets itself after each complete message.
        self.parser = httptools.HttpResponseParser(self)
        self.reused = False
        self.idle_since = 0.0
        self.begin()

    def begin(self) -> None:
        """Reset the per-exchange state before a request is written."""
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.reason = b""
        self.received = 0
        self.headers_done = self.complete = self.until_close = self.keep_alive = False

    def usable(self, now: float, expiry: float | None) -> bool:
        """Cheap staleness check of an idle connection: peer FIN seen, transport closing, or expired."""
        if self.reader.at_eof() or self.writer.transport.is_closing():
            return False
        return expiry is None or now - self.idle_since < expiry

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"malformed HTTP response: {exc}") from exc

    def close(self) -> None:
        # NOTE: no ``await wait_closed()``: a TLS peer that never answers close_notify would hang us.
        self.writer.close()

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        self.reason += status  # may arrive in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # NOTE: httptools does not expose llhttp_finish, so a body framed by neither header is
        # recognised here and ended by us on EOF (1xx/204/304 complete before that matters).
        self.until_close = not any(name.lower() in _FRAMING for name, _ in self.headers)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:  # interim 1xx: wait for the final response
            self.headers, self.reason, self.headers_done = [], b"", False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()


class _Body(httpx.AsyncByteStream):
    """The response body, yielded as it arrives; hands the connection back when done or closed."""

    def __init__(self, pool: PooledTransport, conn: _Conn, read_timeout: float | None) -> None:
        self._pool, self._conn, self._timeout = pool, conn, read_timeout
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        try:
            while True:
                if conn.chunks:  # everything parsed so far goes out now: SSE must not wait for more
                    chunks, conn.chunks = conn.chunks, []
                    yield chunks[0] if len(chunks) == 1 else b"".join(chunks)
                if conn.complete:
                    break
                data = await self._pool.read(conn, self._timeout)
                if data:
                    conn.feed(data)
                elif conn.until_close:
                    conn.complete, conn.keep_alive = True, False
                else:
                    raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        finally:
            self._release()  # NOTE: synchronous, so it also runs when the generator is finalized

    async def aclose(self) -> None:
        self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            conn = self._conn
            self._pool.release(conn, keep=conn.complete and conn.keep_alive and not conn.chunks)


class PooledTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive connection pool; plug into ``httpx.AsyncClient(transport=...)``.

    ``limits.max_connections`` caps open connections over all origins (callers wait up to the pool
    timeout); ``limits.max_keepalive_connections`` caps idle connections kept per origin;
    ``limits.keepalive_expiry`` drops connections idle longer than that. ``connections_opened``
    counts every connection ever opened (tests and diagnostics).
    """

    def __init__(self, limits: httpx.Limits = _DEFAULT_LIMITS, ssl_context: ssl.SSLContext | None = None) -> None:
        """Create an empty pool; nothing connects until the first request."""
        self._max_open = limits.max_connections
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._ssl = ssl_context
        self._idle: dict[Origin, deque[_Conn]] = {}
        self._idle_total = 0
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self.connections_opened = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return its response with the body still to be read."""
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}")
        origin = (url.scheme, url.raw_host.decode("ascii"), url.port or (443 if url.scheme == "https" else 80))
        payload = _encode(request, await request.aread())
        conn = await self._checkout(origin, timeouts, fresh=False)
        try:
            return await self._send(conn, request, payload, timeouts)
        except _StaleConnectionError:
            pass  # NOTE: the keep-alive race: the server closed it as we reused it; the request never
            # reached it, so one retry on a new connection is safe even for a POST.
        conn = await self._checkout(origin, timeouts, fresh=True)
        return await self._send(conn, request, payload, timeouts)

    async def aclose(self) -> None:
        """Close every idle connection; busy ones close when their response is closed."""
        self._closed = True
        for stack in self._idle.values():
            while stack:
                self._discard(stack.pop())
        self._idle_total = 0

    async def read(self, conn: _Conn, limit_s: float | None) -> bytes:
        """One read from ``conn`` (b"" at EOF), timed out and mapped into httpx's exceptions."""
        try:
            if limit_s is None:
                return await conn.reader.read(_READ_SIZE)
            async with asyncio.timeout(limit_s):  # NOTE: cheaper than wait_for (no extra task)
                return await conn.reader.read(_READ_SIZE)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("timed out reading from upstream") from exc
        except OSError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc

    def release(self, conn: _Conn, *, keep: bool) -> None:
        """Return ``conn`` to its origin's idle stack, or close it."""
        if keep and not self._closed and not conn.writer.transport.is_closing():
            stack = self._idle.setdefault(conn.origin, deque())
            if self._max_idle is None or len(stack) < self._max_idle:
                conn.reused, conn.idle_since = True, time.monotonic()
                stack.append(conn)
                self._idle_total += 1
                self._wake()
                return
        self._discard(conn)

    async def _send(
        self, conn: _Conn, request: httpx.Request, payload: bytes, timeouts: dict[str, Any]
    ) -> httpx.Response:
        """Write the request and read up to the end of the response headers; releases ``conn`` on failure."""
        conn.begin()
        try:
            try:
                conn.writer.write(payload)
            except (OSError, RuntimeError) as exc:  # uvloop raises RuntimeError on a closed handle
                raise httpx.WriteError(f"{type(exc).__name__}: {exc}") from exc
            if conn.writer.transport.get_write_buffer_size():  # NOTE: drain only when the kernel pushed back
                await self._drain(conn, timeouts.get("write"))
            while not conn.headers_done:
                data = await self.read(conn, timeouts.get("read"))
                if not data:
                    raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
                conn.feed(data)
        except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
            self._discard(conn)
            if conn.reused and conn.received == 0:
                raise _StaleConnectionError from exc
            raise
        except BaseException:
            self._discard(conn)
            raise
        if request.method == "HEAD":  # no body follows whatever the headers say; llhttp cannot know
            conn.complete, conn.keep_alive = True, False
        extensions = {"http_version": b"HTTP/1.1", "reason_phrase": conn.reason}
        stream = _Body(self, conn, timeouts.get("read"))
        return httpx.Response(conn.parser.get_status_code(), headers=conn.headers, stream=stream, extensions=extensions)

    async def _drain(self, conn: _Conn, limit_s: float | None) -> None:
        try:
            async with asyncio.timeout(limit_s):
                await conn.writer.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("timed out writing to upstream") from exc
        except OSError as exc:
            raise httpx.WriteError(f"{type(exc).__name__}: {exc}") from exc

    async def _checkout(self, origin: Origin, timeouts: dict[str, Any], *, fresh: bool) -> _Conn:
        """An idle connection to ``origin`` (newest first), else a new one, else wait for capacity."""
        while True:
            stack = self._idle.get(origin)
            while stack and not fresh:
                conn = stack.pop()  # NOTE: LIFO: the newest is the least likely to be closed by the peer
                self._idle_total -= 1
                if conn.usable(time.monotonic(), self._expiry):
                    return conn
                self._discard(conn)
            if self._max_open is None or self._open < self._max_open:
                return await self._connect(origin, timeouts.get("connect"))
            if self._idle_total:  # at the cap with idle connections elsewhere: close the oldest of one
                other = next(s for s in self._idle.values() if s)
                self._idle_total -= 1
                self._discard(other.popleft())
                continue
            await self._wait(timeouts.get("pool"))

    async def _wait(self, limit_s: float | None) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(limit_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._wake()  # woken just as we gave up: pass the turn on
            waiter.cancel()  # a no-op when done; else it stays in the deque and _wake skips it
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout("timed out waiting for an upstream connection") from exc
            raise

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, origin: Origin, limit_s: float | None) -> _Conn:
        scheme, host, port = origin
        context = None
        if scheme == "https":
            if self._ssl is None:
                # NOTE: certifi's roots, as httpx's default transport uses, so hosts without a system
                # CA bundle behave as before.
                self._ssl = ssl.create_default_context(cafile=certifi.where())
            context = self._ssl
        self._open += 1
        try:
            async with asyncio.timeout(limit_s):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=context, server_hostname=host if context else None, limit=_READ_SIZE
                )
        except BaseException as exc:
            self._open -= 1
            self._wake()
            if isinstance(exc, TimeoutError):
                raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from exc
            if isinstance(exc, OSError):  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
                raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
            raise
        self.connections_opened += 1
        return _Conn(origin, reader, writer)

    def _discard(self, conn: _Conn) -> None:
        conn.close()
        self._open -= 1
        self._wake()


def _encode(request: httpx.Request, body: bytes) -> bytes:
    """Request line, headers and body as one buffer; our own Content-Length replaces any framing."""
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), request.url.raw_path)]
    lines += [name + b": " + value for name, value in request.headers.raw if name.lower() not in _FRAMING]
    if body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: %d" % len(body))
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    # NOTE: one count over the whole head catches CR/LF smuggled into any header (request splitting).
    if head.count(b"\n") != len(lines) + 1 or head.count(b"\r") != len(lines) + 1:
        raise httpx.LocalProtocolError("CR or LF inside a request header")
    return head + body
