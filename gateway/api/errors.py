"""The one exception handler: every error leaves the gateway here, in the caller's wire format.

Owns mapping framework exceptions (Litestar's 404/405/413...) and bugs into ``gateway.errors``,
choosing the renderer by route (Anthropic's on ``/v1/messages``, OpenAI's elsewhere) and logging
each error once: ``warning`` for 4xx, ``error`` for 5xx. Never returns a stack trace.
"""

from __future__ import annotations

import secrets
from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException

from gateway.errors import (
    AuthenticationError,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PermissionDenied,
    ProviderRateLimited,
    RateLimited,
    RequestTooLarge,
)
from gateway.wire import anthropic, openai

log = structlog.get_logger("gateway.errors")

_BY_STATUS: dict[int, type[GatewayError]] = {
    401: AuthenticationError, 403: PermissionDenied, 404: NotFound, 405: MethodNotAllowed, 413: RequestTooLarge,
}  # fmt: skip


def to_gateway_error(request: Request[Any, Any, Any], exc: Exception) -> GatewayError:
    """The gateway error for any exception raised while serving ``request``."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, HTTPException) and exc.status_code < 500:
        if exc.status_code == 404:
            return NotFound(f"Unknown request URL: {request.method} {request.url.path}.")
        if exc.status_code == 405:
            return MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}.")
        if exc.status_code == 413:
            return RequestTooLarge("Request body is too large.")
        return _BY_STATUS.get(exc.status_code, InvalidRequest)(exc.detail)
    log.error("unhandled_exception", exc_info=exc)
    return InternalError("The server had an error while processing your request.")


def is_anthropic(path: str) -> bool:
    """Whether a route speaks Anthropic's wire format."""
    return path.startswith("/v1/messages")


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """Render ``exc`` for the route's wire format."""
    err = to_gateway_error(request, exc)
    level = log.warning if err.status_code < 500 else log.error
    level(
        "request_failed", status=err.status_code, error=type(err).__name__, message=err.message, path=request.url.path
    )
    body = anthropic.render_error(err) if is_anthropic(request.url.path) else openai.render_error(err)
    headers = {"x-request-id": request.scope.get("state", {}).get("request_id") or secrets.token_hex(12)}
    if isinstance(err, RateLimited | ProviderRateLimited) and err.retry_after is not None:
        headers["retry-after"] = str(max(1, round(err.retry_after)))
    if isinstance(err, RateLimited) and err.headers_for is not None:  # where the caller stands, as on a success
        headers.update(err.headers_for("anthropic" if is_anthropic(request.url.path) else "openai"))
    return Response(body, status_code=err.status_code, media_type="application/json", headers=headers)
