"""``PooledTransport`` against real loopback servers: the fake vendors, and tiny raw asyncio servers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import httpx
import msgspec
import pytest

from gateway.errors import ProviderBadResponse, ProviderRateLimited, ProviderTimeout, ProviderUnavailable
from gateway.providers import build_providers
from gateway.providers.transport import PooledTransport
from gateway.types import Finish, TextDelta
from tests.gateway.providers.conftest import KEYS, KINDS, chat, collect, free_port, make_config

if TYPE_CHECKING:
    from tests.fakes.upstream import FakeUpstream

AUTH = {"authorization": f"Bearer {KEYS.openai}"}

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def body(model: str, *, stream: bool = False, text: str = "hello there") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}


@pytest.fixture
async def transport() -> AsyncIterator[PooledTransport]:
    t = PooledTransport()
    yield t
    await t.aclose()


@pytest.fixture
async def client(transport: PooledTransport) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=transport, timeout=5.0) as c:
        yield c


@pytest.fixture
def openai_url(upstream: FakeUpstream) -> str:
    return f"{upstream.url}/v1/chat/completions"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request off a raw connection (b"" when the client closed it)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A loopback asyncio server running ``handler`` per connection; yields its base URL.

    On exit every connection it still has is closed and its handler ended, so nothing leaks.
    """
    tasks: set[asyncio.Task[None]] = set()

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def answer(raw: bytes) -> Handler:
    """A server that answers every request on a connection with ``raw``, then waits for the next."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            writer.write(raw)
            await writer.drain()
        writer.close()

    return handle


# ------------------------------------------------------------------------------- the fake vendors


async def test_json_request_and_content_length_response(client, openai_url, upstream):
    r = await client.post(openai_url, json=body("gpt-4o-mini", text="ping pong"), headers=AUTH)
    assert r.status_code == 200 and r.reason_phrase == "OK"
    assert r.headers["content-length"] == str(len(r.content))
    assert r.json()["choices"][0]["message"]["content"] == "echo: ping pong"
    assert upstream.requests[-1].body["messages"][0]["content"] == "ping pong"
    assert upstream.requests[-1].headers["content-length"] == str(len(upstream.requests[-1].raw))


async def test_sse_stream_is_chunked_and_complete(client, openai_url):
    async with client.stream("POST", openai_url, json=body("long-stream-50", stream=True), headers=AUTH) as r:
        assert r.headers["transfer-encoding"] == "chunked"
        text = "".join([piece async for piece in r.aiter_text()])
    frames = text.split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    deltas = [msgspec.json.decode(f.removeprefix("data: "))["choices"][0]["delta"].get("content") for f in frames[:-2]]
    assert "".join(d for d in deltas if d) == "".join(f" tok{i}" for i in range(50))


async def test_error_status_passes_through_with_its_headers(client, openai_url):
    r = await client.post(openai_url, json=body("error-429"), headers=AUTH)
    assert r.status_code == 429 and r.headers["retry-after"] == "1" and "error" in r.json()


async def test_one_connection_serves_sequential_requests(client, transport, openai_url):
    for i in range(20):
        stream = i % 2 == 1
        r = await client.post(openai_url, json=body("gpt-4o-mini", stream=stream), headers=AUTH)
        assert r.status_code == 200
    assert transport.connections_opened == 1


async def test_read_timeout_raises_httpx_read_timeout(client, transport, openai_url):
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await client.post(openai_url, json=body("slow-2000"), headers=AUTH, timeout=httpx.Timeout(5.0, read=0.2))
    assert time.monotonic() - started < 1.5
    assert (await client.post(openai_url, json=body("m"), headers=AUTH)).status_code == 200  # pool still fine


async def test_connection_refused_raises_connect_error(client):
    with pytest.raises(httpx.ConnectError):
        await client.post(f"http://127.0.0.1:{free_port()}/v1/chat/completions", json={})


@pytest.mark.parametrize("kind", KINDS)
async def test_adapters_over_the_transport_map_errors_as_before(client, transport, upstream, kind):
    provider = build_providers({kind: make_config(kind, upstream.url)}, client)[kind]
    assert (await provider.chat(chat("x y"), "m")).content == "echo: x y"
    events = await collect(provider, chat("a b c"), "m")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "echo: a b c"
    assert Finish("stop") in events
    with pytest.raises(ProviderRateLimited):
        await provider.chat(chat(), "error-429")
    with pytest.raises(ProviderBadResponse):
        await collect(provider, chat(), "cut-stream")
    with pytest.raises(ProviderTimeout):
        await build_providers({kind: make_config(kind, upstream.url, timeout_s=0.2)}, client)[kind].chat(
            chat(), "slow-2000"
        )
    refused = build_providers({kind: make_config(kind, f"http://127.0.0.1:{free_port()}")}, client)[kind]
    with pytest.raises(ProviderUnavailable):
        await refused.chat(chat(), "m")


# ----------------------------------------------------------------------------- raw loopback servers


async def test_stream_chunks_arrive_before_the_stream_ends(client):
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
        await writer.drain()
        await release.wait()  # the second chunk only goes out once the client saw the first
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(handle) as url, client.stream("POST", url, content=b"{}") as r:
        chunks = r.aiter_bytes()
        async with asyncio.timeout(2):
            assert await anext(chunks) == b"first\n"
        release.set()
        assert [c async for c in chunks] == [b"second\n"]


@pytest.mark.parametrize(
    ("raw", "content"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"hello"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\nt: 1\r\n\r\n",
            b"hello",
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
)
async def test_framed_bodies_are_read_and_the_connection_reused(client, transport, raw, content):
    async with raw_server(answer(raw)) as url:
        for _ in range(3):
            assert (await client.post(url, content=b"x")).content == content
    assert transport.connections_opened == 1


async def test_body_until_close_is_read_and_the_connection_not_reused(client, transport):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async with raw_server(handle) as url:
        assert (await client.post(url, content=b"x")).content == b"until the end"
        assert (await client.post(url, content=b"x")).content == b"until the end"
    assert transport.connections_opened == 2


async def test_server_closing_an_idle_connection_is_noticed_at_checkout(client, transport):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")  # keep-alive, then closes anyway
        await writer.drain()
        writer.close()

    async with raw_server(handle) as url:
        for _ in range(3):
            assert (await client.post(url, content=b"x")).content == b"ok"
            await asyncio.sleep(0.05)  # the FIN reaches us while the connection is idle
    assert transport.connections_opened == 3


async def test_keep_alive_race_is_retried_once_on_a_new_connection(client, transport):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # the reused connection's request is dropped unanswered
        writer.close()

    async with raw_server(handle) as url:
        assert (await client.post(url, content=b"1")).content == b"ok"
        assert (await client.post(url, content=b"2")).content == b"ok"
    assert transport.connections_opened == 2


async def test_fresh_connection_closed_without_answer_is_not_retried(client, transport):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async with raw_server(handle) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, content=b"x")
    assert transport.connections_opened == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\ndata: partial\n\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nf\r\ndata: partial\n\n\r\n",
    ],
)
async def test_cut_body_raises_from_aiter(client, raw):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        writer.close()

    async with raw_server(handle) as url, client.stream("POST", url, content=b"x") as r:
        seen: list[bytes] = []

        async def read_all() -> None:
            async for chunk in r.aiter_bytes():
                seen.append(chunk)

        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await read_all()
        assert b"".join(seen) == b"data: partial\n\n"


async def test_malformed_response_raises_remote_protocol_error(client):
    async with raw_server(answer(b"SMTP ready\r\n\r\n")) as url:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, content=b"x")


async def test_pool_cap_makes_callers_wait_then_time_out():
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    transport = PooledTransport(httpx.Limits(max_connections=1, max_keepalive_connections=1))
    async with raw_server(answer(raw)) as url, httpx.AsyncClient(transport=transport) as client:
        async with client.stream("POST", url, content=b"x") as held:  # holds the only connection
            with pytest.raises(httpx.PoolTimeout):
                await client.post(url, content=b"y", timeout=httpx.Timeout(5.0, pool=0.1))
            waiting = asyncio.ensure_future(client.post(url, content=b"z"))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert await held.aread() == b"ok"
        assert (await waiting).content == b"ok"  # served as soon as the stream gave the connection back
    assert transport.connections_opened == 1


async def test_header_with_a_line_break_is_refused(client):
    async with raw_server(answer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")) as url:
        with pytest.raises(httpx.LocalProtocolError):
            await client.post(url, content=b"x", headers={"x-evil": "a\r\nHost: other"})


async def test_aclose_closes_idle_connections(transport):
    closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")(reader, writer)
        closed.set()  # the client closed its end

    async with raw_server(handle) as url:
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.post(url, content=b"x")).status_code == 200
        async with asyncio.timeout(2):
            await closed.wait()
