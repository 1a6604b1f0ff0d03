"""A fake of the three paid vendor APIs (OpenAI, Anthropic, Gemini) as one raw ASGI app, and its server.

Owns routing by path, the vendors' auth checks, recording every request, the delays and the
response framing (JSON or SSE over ASGI), plus ``FakeUpstream`` (uvicorn on 127.0.0.1 in a
background thread) and the ``python -m tests.fakes.upstream --port N`` entry point. Written as raw
ASGI, no framework, so that it is cheap enough to be the loopback upstream of latency benchmarks.
Does not own the vendors' bytes (``fake_openai``, ``fake_anthropic``, ``fake_gemini``) nor what the
model says, chosen by the model name (``tests.fakes.scenario``, which lists the behaviours).

Routes: OpenAI ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models`` (Bearer
auth); Anthropic ``POST /v1/messages`` (``x-api-key``, or Bearer as newer SDKs send it, and
``anthropic-version``); Gemini
``POST /v1beta/models/{model}:generateContent | streamGenerateContent[?alt=sse] | batchEmbedContents``
(``x-goog-api-key`` or ``?key=``). A wrong or missing key is a 401 in the vendor's format.

Usage::

    with FakeUpstream() as fake:  # or fake = FakeUpstream().start() ... fake.stop()
        OpenAI base URL: f"{fake.url}/v1"; Anthropic and Gemini base URL: fake.url
        fake.requests[-1].body  # the parsed JSON of the last request
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec
import uvicorn

from tests.fakes import fake_anthropic, fake_gemini, fake_openai
from tests.fakes.scenario import error_status, plan

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, MutableMapping
    from types import TracebackType

    from tests.fakes.scenario import Answer, Prompt

    Scope = MutableMapping[str, Any]
    Event = dict[str, Any]
    Receive = Callable[[], Awaitable[Event]]
    Send = Callable[[Event], Awaitable[None]]

_GEMINI_PATH = re.compile(r"/v1beta/models/([^/:]+):(\w+)")
_BAD_JSON = b"{this is not json"
_SSE = "text/event-stream; charset=utf-8"
_PROMPT_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


@dataclass(frozen=True, slots=True)
class FakeKeys:
    """The API keys the fake accepts, one per vendor."""

    openai: str = "sk-fake-openai"
    anthropic: str = "sk-ant-fake"
    gemini: str = "gm-fake"


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    """Lower-cased header names."""
    body: Any
    """Parsed JSON, or ``None`` when the body was empty or not JSON (see ``raw``)."""
    raw: bytes


class FakeVendorApp:
    """The ASGI app. ``requests`` grows with every request received, in arrival order."""

    def __init__(self, keys: FakeKeys | None = None) -> None:
        """Create the app accepting ``keys`` (the defaults when ``None``)."""
        self.keys = keys or FakeKeys()
        self.requests: list[RecordedRequest] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        raw = await _read_body(receive)
        body: Any = None
        if raw:
            try:
                body = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                body = None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        req = RecordedRequest(
            scope["method"], scope["path"], scope["query_string"].decode("latin-1"), headers, body, raw
        )
        self.requests.append(req)
        if req.path.startswith("/v1beta/"):
            response = self._gemini(req)
        elif req.path.startswith("/v1/messages"):
            response = self._anthropic(req)
        else:
            response = self._openai(req)
        if await _wait(receive, response.delay_s):
            await _send(send, response)

    def _openai(self, req: RecordedRequest) -> _Response:
        auth = req.headers.get("authorization", "")
        key = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if key != self.keys.openai:
            return _Response(401, fake_openai.unauthorized(key))
        if req.method == "GET" and req.path == "/v1/models":
            return _Response(200, fake_openai.models())
        if req.method != "POST" or req.path not in ("/v1/chat/completions", "/v1/embeddings"):
            return _Response(404, fake_openai.error(404, f"Invalid URL ({req.method} {req.path})"))
        body = req.body
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _Response(400, fake_openai.error(400, "We could not parse the JSON body of your request."))
        model: str = body["model"]
        if (status := error_status(model)) is not None:
            return _Response(status, fake_openai.unauthorized(key) if status == 401 else fake_openai.error(status))
        try:
            if req.path == "/v1/embeddings":
                return _Response(200, fake_openai.embeddings(body, model))
            prompt = fake_openai.prompt(body)
        except _PROMPT_ERRORS as exc:
            return _Response(400, fake_openai.error(400, f"Invalid request: {exc}"))
        answer = plan(model, prompt)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return _streamed(answer, fake_openai.events(answer, model, include_usage=include_usage), _SSE)
        return _complete(answer, fake_openai.completion(answer, model), fake_openai.error)

    def _anthropic(self, req: RecordedRequest) -> _Response:
        key = req.headers.get("x-api-key") or req.headers.get("authorization", "").removeprefix("Bearer ")
        if key != self.keys.anthropic:
            return _Response(401, fake_anthropic.error(401))
        if "anthropic-version" not in req.headers:
            return _Response(400, fake_anthropic.error(400, "anthropic-version: header is required"))
        if req.method != "POST" or req.path != "/v1/messages":
            return _Response(404, fake_anthropic.error(404))
        body = req.body
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _Response(400, fake_anthropic.error(400, "There was an issue with your request body."))
        model: str = body["model"]
        if (status := error_status(model)) is not None:
            return _Response(status, fake_anthropic.error(status))
        try:
            prompt = fake_anthropic.prompt(body)
        except _PROMPT_ERRORS as exc:
            return _Response(400, fake_anthropic.error(400, str(exc)))
        answer = plan(model, prompt)
        preamble = _preamble(answer, prompt)
        if body.get("stream"):
            return _streamed(answer, fake_anthropic.events(answer, model, preamble=preamble), _SSE)
        return _complete(answer, fake_anthropic.message(answer, model, preamble=preamble), fake_anthropic.error)

    def _gemini(self, req: RecordedRequest) -> _Response:
        query = parse_qs(req.query)
        key = req.headers.get("x-goog-api-key") or next(iter(query.get("key", ())), None)
        if key != self.keys.gemini:
            return _Response(401, fake_gemini.error(401))
        match = _GEMINI_PATH.fullmatch(req.path)
        if req.method != "POST" or match is None:
            return _Response(404, fake_gemini.error(404))
        model, method = match.groups()
        if (status := error_status(model)) is not None:
            return _Response(status, fake_gemini.error(status))
        body = req.body
        if not isinstance(body, dict):
            return _Response(400, fake_gemini.error(400, "Invalid JSON payload received."))
        if method not in ("generateContent", "streamGenerateContent", "batchEmbedContents"):
            return _Response(404, fake_gemini.error(404, f"Method {method} is not supported."))
        try:
            if method == "batchEmbedContents":
                return _Response(200, fake_gemini.embeddings(body))
            prompt = fake_gemini.prompt(body)
        except _PROMPT_ERRORS as exc:
            return _Response(400, fake_gemini.error(400, f"Invalid JSON payload received: {exc}"))
        answer = plan(model, prompt)
        if method == "streamGenerateContent":
            sse = query.get("alt") == ["sse"]
            content_type = "text/event-stream" if sse else "application/json; charset=UTF-8"
            return _streamed(answer, fake_gemini.events(answer, model, sse=sse), content_type)
        return _complete(answer, fake_gemini.response(answer, model), fake_gemini.error)


@dataclass(slots=True)
class _Response:
    """What to send: one JSON body, or SSE frames when ``frames`` is set; after ``delay_s``."""

    status: int
    body: bytes = b""
    frames: Iterable[bytes] | None = None
    content_type: str = "application/json"
    delay_s: float = 0.0


def _complete(answer: Answer, body: bytes, error: Callable[[int], bytes]) -> _Response:
    """A non-streamed answer, broken the way ``answer.mode`` asks."""
    if answer.mode == "cut":
        body = body[: len(body) // 2]
    elif answer.mode == "bad_json":
        body = _BAD_JSON
    elif answer.mode == "stream_error":
        return _Response(503, error(503), delay_s=answer.delay_s)
    return _Response(200, body, delay_s=answer.delay_s)


def _streamed(answer: Answer, frames: Iterable[bytes], content_type: str) -> _Response:
    return _Response(200, frames=frames, content_type=content_type, delay_s=answer.delay_s)


def _preamble(answer: Answer, prompt: Prompt) -> str | None:
    """Claude says a word before a tool call it chose itself, never before a forced one."""
    if answer.tool is None or prompt.forced_tool is not None:
        return None
    return f"Let me look that up with {answer.tool.name}."


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        event = await receive()
        if event["type"] != "http.request":
            break
        chunks.append(event.get("body", b""))
        if not event.get("more_body", False):
            break
    return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _wait(receive: Receive, seconds: float) -> bool:
    """Sleep ``seconds``; ``False`` if the client went away meanwhile (then nothing is sent)."""
    if seconds <= 0:
        return True

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    try:
        await asyncio.wait_for(disconnected(), timeout=seconds)
    except TimeoutError:
        return True
    return False


async def _send(send: Send, response: _Response) -> None:
    headers = [(b"content-type", response.content_type.encode())]
    if response.status == 429:
        headers.append((b"retry-after", b"1"))
    if response.frames is None:
        headers.append((b"content-length", str(len(response.body)).encode()))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        return
    headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    for frame in response.frames:
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


class FakeUpstream:
    """``FakeVendorApp`` served by uvicorn on a free loopback port in a background thread.

    Use as a context manager, or call ``start()`` and ``stop()`` (pytest fixtures). ``stop`` joins
    the thread, so nothing is left running.
    """

    def __init__(self, keys: FakeKeys | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        """Prepare (not start) a server accepting ``keys`` on ``host``:``port`` (0 picks a free port)."""
        self.app = FakeVendorApp(keys)
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the Anthropic and Gemini base URL; OpenAI's is ``url + "/v1"``."""
        return f"http://{self.host}:{self.port}"

    @property
    def keys(self) -> FakeKeys:
        """The keys the fake accepts."""
        return self.app.keys

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a live list; ``clear()`` it between tests if needed)."""
        return self.app.requests

    def start(self) -> FakeUpstream:
        """Bind, start serving and wait until ready.

        Raises:
            RuntimeError: already started, or the server did not come up within 10 s.
        """
        if self._thread is not None:
            raise RuntimeError("FakeUpstream is already started")
        sock = self._sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_config(self.app, log_config=None))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"fake-upstream-{self.port}"
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("FakeUpstream did not start")
            time.sleep(0.002)
        return self

    def stop(self) -> None:
        """Stop serving and join the server thread; a no-op when not started."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server, self._thread, self._sock = None, None, None

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket (port 0 picks a free one); uvicorn starts listening on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _config(app: FakeVendorApp, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "off",
        "ws": "none",
        "timeout_keep_alive": 75,
        "timeout_graceful_shutdown": 2,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def main(argv: list[str] | None = None) -> None:
    """Run the fake as its own process: ``python -m tests.fakes.upstream --port N``."""
    defaults = FakeKeys()
    parser = argparse.ArgumentParser(description="Fake OpenAI, Anthropic and Gemini APIs on one loopback port.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900, help="0 picks a free port (printed at start)")
    parser.add_argument("--openai-key", default=defaults.openai)
    parser.add_argument("--anthropic-key", default=defaults.anthropic)
    parser.add_argument("--gemini-key", default=defaults.gemini)
    args = parser.parse_args(argv)
    app = FakeVendorApp(FakeKeys(args.openai_key, args.anthropic_key, args.gemini_key))
    sock = bind_socket(args.host, args.port)
    print(f"fake upstream on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(_config(app)).run(sockets=[sock])


if __name__ == "__main__":
    main()
