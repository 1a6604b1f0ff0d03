"""What every inference route does around the pipeline: identify the call, shape the HTTP response.

Owns the request id (a safe ``x-request-id`` from the caller, or a fresh one), the API key's
extraction from ``Authorization: Bearer`` or ``x-api-key``, the ``x-crossway-*`` headers that say
which deployment served a request, and turning a pipeline result into JSON or an SSE stream (an error
after the first byte becomes the wire's error event). Does not own any wire format's bytes.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog
from litestar import Request, Response
from litestar.response import Stream

from gateway.api.errors import to_gateway_error
from gateway.api.sse import EventStream, StreamEncoder
from gateway.auth import bearer_key
from gateway.cache.responses import DIRECTIVES, Directive
from gateway.dispatch import Dispatched
from gateway.pipeline import Call, Completion, Streamed
from gateway.types import ChatResponse

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def make_call(request: Request[Any, Any, Any], endpoint: str) -> Call:
    """Start a call: pick its request id, bind it to the log context, and find the API key."""
    started = time.perf_counter()
    given = request.headers.get("x-request-id")
    request_id = given if given and _SAFE_ID.match(given) else secrets.token_hex(12)
    request.scope.setdefault("state", {})["request_id"] = request_id
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    key = bearer_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
    slo = request.headers.get("x-crossway-slo") or None
    cache = request.headers.get("x-crossway-cache")
    directive: Directive | None = cache if cache in DIRECTIVES else None  # type: ignore[assignment]
    return Call(request_id=request_id, api_key=key, endpoint=endpoint, started=started, slo=slo, cache=directive)


def served_headers(call: Call, served_by: Dispatched, slo: str | None = None) -> dict[str, str]:
    """Response headers naming the deployment that answered, why the router chose it, and the attempts made."""
    target = served_by.target
    headers = {
        "x-request-id": call.request_id,
        "x-crossway-provider": target.provider,
        "x-crossway-model": target.model,
        "x-crossway-deployment": target.key,
        "x-crossway-route-reason": served_by.reason,
        "x-crossway-attempts": ",".join(f"{a.target.key}:{a.outcome}" for a in served_by.attempts),
    }
    if slo is not None:
        headers["x-crossway-slo-class"] = slo
    return headers


SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def respond(
    request: Request[Any, Any, Any],
    call: Call,
    result: Completion | Streamed,
    response_id: str,
    encode: Callable[[ChatResponse, str], bytes],
    stream_encoder: Callable[[Streamed, str], StreamEncoder],
) -> Response[bytes] | Stream:
    """The HTTP response for a pipeline result: JSON, or SSE through the wire's stream encoder."""
    headers = served_headers(call, result.served_by, result.slo)
    if result.cache is not None:
        headers.update(result.cache.headers())
    if result.admission is not None:  # rate-limit standing, in the caller's vendor's names
        headers.update(result.admission.headers("anthropic" if call.endpoint == "messages" else "openai"))
    if isinstance(result, Completion):
        return Response(encode(result.response, response_id), media_type="application/json", headers=headers)
    encoder = stream_encoder(result, response_id)
    return EventStream(
        result.events, encoder, lambda exc: to_gateway_error(request, exc), headers={**SSE_HEADERS, **headers}
    )
