"""The gateway's one error tree.

Every failure a caller can see is one of these classes. Each class knows its HTTP status, its
OpenAI-style ``error_type`` and whether a different attempt could succeed (``retryable``). The wire
renderers (``gateway.wire.openai.render_error``, ``gateway.wire.anthropic.render_error``) turn them
into the caller's format; nothing else formats errors. Vendor and transport errors are mapped into
this tree at the provider boundary with ``raise ... from exc``.

    GatewayError
      ClientError (4xx)
        InvalidRequest 400 · ModerationBlocked 400
        AuthenticationError 401 · BudgetExceeded 402 · PermissionDenied 403
        NotFound 404 > UnknownModel 404 · MethodNotAllowed 405
        RequestTooLarge 413 · RateLimited 429 (retry_after)
      UpstreamError (5xx)
        ProviderBadResponse 502 · ProviderUnavailable 503 [retryable]
        ProviderTimeout 504 [retryable] · ProviderRateLimited 429 [retryable]
        AllTargetsFailed 502 (errors: list[UpstreamError])
      Overloaded 503 [retryable]
      InternalError 500
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    from collections.abc import Callable


class GatewayError(Exception):
    """Base of every error the gateway reports to a caller."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ClientError(GatewayError):
    """The caller sent something the gateway will not serve; retrying the same request fails again."""

    status_code = 400
    error_type = "invalid_request_error"


class InvalidRequest(ClientError):
    """Malformed JSON, wrong types, unknown fields or values out of range."""


class ModerationBlocked(ClientError):
    """An input hook refused the request."""


class AuthenticationError(ClientError):
    """Missing, unknown or revoked API key."""

    status_code = 401
    error_type = "authentication_error"


class BudgetExceeded(ClientError):
    """The tenant's hard budget would be exceeded."""

    status_code = 402
    error_type = "insufficient_quota"


class PermissionDenied(ClientError):
    """The key is valid but may not do this."""

    status_code = 403
    error_type = "permission_error"


class NotFound(ClientError):
    """No such route or object."""

    status_code = 404
    error_type = "not_found_error"


class UnknownModel(NotFound):
    """No alias or passthrough route matches the requested model."""


class MethodNotAllowed(ClientError):
    """The route exists but not for this HTTP method."""

    status_code = 405


class RequestTooLarge(ClientError):
    """The body exceeds the configured maximum size."""

    status_code = 413
    error_type = "request_too_large"


class RateLimited(ClientError):
    """The caller exceeded its own request or token rate."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        code: str | None = None,
        headers_for: Callable[[Literal["openai", "anthropic"]], dict[str, str]] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after
        self.headers_for = headers_for
        """The limits' standing as response headers, given the wire's style (``openai`` or ``anthropic``)."""


class UpstreamError(GatewayError):
    """A provider failed; the caller did nothing wrong."""

    status_code = 502
    error_type = "server_error"


class ProviderBadResponse(UpstreamError):
    """The provider answered with something we cannot use (bad JSON, auth failure on our key, 4xx/5xx)."""


class ProviderUnavailable(UpstreamError):
    """The provider is down, refused the connection or is not configured."""

    status_code = 503
    retryable = True


class ProviderTimeout(UpstreamError):
    """The provider did not answer within the deadline."""

    status_code = 504
    error_type = "timeout_error"
    retryable = True


class ProviderRateLimited(UpstreamError):
    """The provider throttled us; another deployment may still have room."""

    status_code = 429
    error_type = "rate_limit_error"
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AllTargetsFailed(UpstreamError):
    """Every candidate deployment failed; carries each attempt's error, last one decides the status."""

    def __init__(self, errors: list[UpstreamError]) -> None:
        last = errors[-1]
        attempts = "; ".join(f"{type(e).__name__}: {e.message}" for e in errors)
        super().__init__(f"all {len(errors)} target(s) failed: {attempts}")
        self.errors = errors
        self.status_code = last.status_code  # type: ignore[misc]
        self.error_type = last.error_type  # type: ignore[misc]


class Overloaded(GatewayError):
    """The gateway sheds load; try again shortly."""

    status_code = 503
    error_type = "overloaded_error"
    retryable = True


class InternalError(GatewayError):
    """A bug in the gateway. The message is generic; details go to the log only."""
