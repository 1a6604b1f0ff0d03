"""HTTP plumbing shared by the vendor adapters.

Owns how an adapter talks HTTP: the one shared ``httpx.AsyncClient`` with per-request timeouts,
fixed headers, msgspec JSON encoding and typed decoding, opening and closing streamed responses,
and turning vendor error bodies and cut streams into ``gateway.errors``. Does not own any vendor's
request or response format (each adapter module does) nor the status-to-error table
(``gateway.providers.base.status_error``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import msgspec

from gateway.errors import ProviderBadResponse, ProviderTimeout, ProviderUnavailable
from gateway.providers.base import status_error, transport_errors

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping

    from gateway.errors import InvalidRequest, UpstreamError
    from gateway.policy import ProviderConfig

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()
_MAX_ROUTES = 256
"""Parsed upstream URLs kept per provider (Gemini's carry the model name, so they are bounded)."""


def encode_json(value: Any) -> bytes:
    """JSON bytes of ``value`` (dicts, lists, msgspec Structs), compact, key order kept."""
    return _ENCODER.encode(value)


class Upstream:
    """One provider account's HTTP endpoint: the shared client, its timeouts and fixed headers.

    Holds no per-request state; safe to share between concurrent requests. The API key only ever
    lives in ``headers`` and is scrubbed from every error message built here.
    """

    __slots__ = ("_extensions", "_request_headers", "_routes", "_secret", "client", "headers", "name", "timeout")

    def __init__(self, config: ProviderConfig, client: httpx.AsyncClient, auth_headers: Mapping[str, str]) -> None:
        """Bind a provider config to the shared client.

        Args:
            config: the provider's resolved configuration.
            client: the gateway's one pooled client; never closed here.
            auth_headers: the vendor's authentication headers (empty when there is no key).
        """
        self.name = config.name
        self.client = client
        self.headers: dict[str, str] = {"content-type": "application/json", **auth_headers, **config.headers}
        self.timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        self._secret = config.api_key
        # NOTE: what ``client.send`` would merge into every request, merged once (see ``_send``).
        self._request_headers = httpx.Headers(client.headers)
        self._request_headers.update(self.headers)
        self._extensions = {"timeout": self.timeout.as_dict()}
        self._routes: dict[str, tuple[httpx.URL, httpx.AsyncBaseTransport]] = {}

    async def _send(self, url: str, body: Mapping[str, Any]) -> httpx.Response:
        """POST ``body`` to ``url`` straight on the client's transport; the body is still to be read.

        NOTE: ``client.send`` builds and merges a request per call and runs auth, redirect and
        cookie handling that no vendor API here uses; on a loopback upstream that was a fifth of the
        gateway's CPU per request. The request sent is the one ``client.send`` would have sent
        (same headers, timeouts and transport, mounts included) minus cookies, and its response is
        read and decoded the same way.
        """
        route = self._routes.get(url)
        if route is None:
            if len(self._routes) >= _MAX_ROUTES:
                self._routes.clear()
            parsed = httpx.URL(url)
            route = self._routes[url] = (parsed, self.client._transport_for_url(parsed))
        target, transport = route
        request = httpx.Request(
            "POST", target, content=encode_json(body), headers=self._request_headers, extensions=self._extensions
        )
        return await transport.handle_async_request(request)

    async def post(self, url: str, body: Mapping[str, Any], into: type[T]) -> T:
        """POST ``body`` as JSON and decode a 2xx answer into ``into``.

        Raises:
            UpstreamError: transport failure, non-2xx status or an undecodable body.
            InvalidRequest: the vendor rejected the request as malformed (400/422).
        """
        with transport_errors(self.name):
            response = await self._send(url, body)
            try:
                await response.aread()
            finally:
                await response.aclose()
        if not response.is_success:
            raise self.status_error(
                response.status_code, error_message(response.content), response.headers.get("retry-after")
            )
        return self.decode(response.content, into)

    @contextlib.asynccontextmanager
    async def open_stream(self, url: str, body: Mapping[str, Any]) -> AsyncIterator[httpx.Response]:
        """POST ``body`` and yield the streamed 2xx response; the response is closed on exit.

        Raises:
            UpstreamError: transport failure or non-2xx status (the error body is read first).
            InvalidRequest: the vendor rejected the request as malformed (400/422).
        """
        with transport_errors(self.name):
            response = await self._send(url, body)
        try:
            if not response.is_success:
                with transport_errors(self.name):
                    await response.aread()
                raise self.status_error(
                    response.status_code, error_message(response.content), response.headers.get("retry-after")
                )
            yield response
        finally:
            await response.aclose()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Map failures while reading a stream's body: a cut connection is a bad (truncated) response.

        NOTE: a peer that closes mid-body leaves a stream that looks shorter than it is, so it is a
        ``ProviderBadResponse`` here (never retried mid-stream), not the ``ProviderUnavailable`` that
        ``transport_errors`` reports for a connection that never got going.
        """
        try:
            yield
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"{self.name}: upstream stream stalled ({type(exc).__name__})") from exc
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise ProviderBadResponse(f"{self.name}: upstream cut the stream before it finished") from exc
        except httpx.TransportError as exc:
            raise ProviderUnavailable(f"{self.name}: upstream transport error ({type(exc).__name__})") from exc

    def decode(self, data: bytes | str, into: type[T]) -> T:
        """Decode vendor JSON into ``into``; malformed or mistyped JSON is a ``ProviderBadResponse``."""
        try:
            return msgspec.json.decode(data, type=into)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise ProviderBadResponse(f"{self.name}: upstream sent malformed JSON: {exc}") from exc

    def status_error(self, status: int, message: str, retry_after: str | None = None) -> UpstreamError | InvalidRequest:
        """The gateway error for a vendor status and message, with the API key scrubbed out."""
        if self._secret and self._secret in message:
            message = message.replace(self._secret, "***")
        return status_error(self.name, status, message, retry_after)

    def bad_response(self, what: str) -> ProviderBadResponse:
        """A ``ProviderBadResponse`` naming this provider."""
        return ProviderBadResponse(f"{self.name}: {what}")


def error_message(content: bytes) -> str:
    """The human message inside a vendor error body (any of the three vendors' shapes, or vLLM's)."""
    try:
        doc = msgspec.json.decode(content)
    except msgspec.DecodeError:
        return content[:200].decode("utf-8", "replace").strip()
    if isinstance(doc, list) and doc:  # Gemini's JSON-array stream framing wraps errors in a list
        doc = doc[0]
    if not isinstance(doc, dict):
        return ""
    err = doc.get("error")
    if isinstance(err, str):
        return err
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    for key in ("message", "detail"):
        if isinstance(doc.get(key), str):
            return str(doc[key])
    return ""
