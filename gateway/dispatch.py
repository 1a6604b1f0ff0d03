"""Dispatch: send a request to the targets of a plan, in order, until one answers.

Owns fallback before the first byte: a target that fails with an upstream error is recorded and
the next one is tried; for streams, "answers" means the first event arrived, so a stream that breaks
later is the pipeline's problem, not a reason to switch targets. Errors that are the caller's fault
(``ClientError``) stop at once. Does not own choosing or ordering targets (``gateway.policy``), nor
retries with backoff and circuit breakers (the routing issue adds those here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import structlog

from gateway.errors import AllTargetsFailed, ProviderBadResponse, UpstreamError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from gateway.obs.metrics import Metrics
    from gateway.policy import Plan, Target
    from gateway.providers.base import Provider
    from gateway.types import ChatRequest, ChatResponse, EmbeddingRequest, EmbeddingResponse, StreamEvent

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One call to one target and how it ended."""

    target: Target
    outcome: str
    """``ok`` or the error class name."""
    seconds: float


@dataclass(slots=True)
class Dispatched:
    """Where a request went and what was tried on the way."""

    target: Target
    attempts: list[Attempt] = field(default_factory=list)


@dataclass(slots=True)
class OpenStream:
    """A stream whose first event has arrived."""

    dispatched: Dispatched
    first: StreamEvent
    rest: AsyncIterator[StreamEvent]


def _failed(errors: list[UpstreamError]) -> UpstreamError:
    return errors[0] if len(errors) == 1 else AllTargetsFailed(errors)


def _record(attempts: list[Attempt], metrics: Metrics, target: Target, outcome: str, started: float) -> None:
    attempts.append(Attempt(target, outcome, time.perf_counter() - started))
    metrics.observe_attempt(target.provider, outcome)
    if outcome != "ok":
        log.warning(
            "provider_call_failed", target=f"{target.provider}/{target.model}", error=outcome, attempt=len(attempts)
        )


async def _first_answer(plan: Plan, metrics: Metrics, call: Callable[[Target], Awaitable[T]]) -> tuple[T, Dispatched]:
    attempts: list[Attempt] = []
    errors: list[UpstreamError] = []
    for target in plan.targets:
        started = time.perf_counter()
        try:
            answer = await call(target)
        except UpstreamError as exc:
            _record(attempts, metrics, target, type(exc).__name__, started)
            errors.append(exc)
            continue
        _record(attempts, metrics, target, "ok", started)
        return answer, Dispatched(target, attempts)
    raise _failed(errors)


async def chat(
    plan: Plan, request: ChatRequest, providers: Mapping[str, Provider], metrics: Metrics
) -> tuple[ChatResponse, Dispatched]:
    """A non-streamed completion from the first target that answers.

    Raises:
        ClientError: the upstream said the request itself is wrong.
        UpstreamError: the only target failed, or ``AllTargetsFailed``.
    """
    return await _first_answer(plan, metrics, lambda t: providers[t.provider].chat(request, t.model))


async def open_stream(
    plan: Plan, request: ChatRequest, providers: Mapping[str, Provider], metrics: Metrics
) -> OpenStream:
    """Open a stream on the first target whose first event arrives; later events are the caller's to read.

    Raises:
        ClientError: the upstream said the request itself is wrong.
        UpstreamError: the only target failed, or ``AllTargetsFailed``.
    """
    attempts: list[Attempt] = []
    errors: list[UpstreamError] = []
    for target in plan.targets:
        started = time.perf_counter()
        events = providers[target.provider].stream(request, target.model)
        try:
            first = await anext(events)
        except StopAsyncIteration:
            exc: UpstreamError = ProviderBadResponse(f"{target.provider}: stream ended before any event")
        except UpstreamError as upstream:
            exc = upstream
        except BaseException:
            await events.aclose()  # type: ignore[attr-defined]
            raise
        else:
            _record(attempts, metrics, target, "ok", started)
            return OpenStream(Dispatched(target, attempts), first, events)
        await events.aclose()  # type: ignore[attr-defined]
        _record(attempts, metrics, target, type(exc).__name__, started)
        errors.append(exc)
    raise _failed(errors)


async def embed(
    plan: Plan, request: EmbeddingRequest, providers: Mapping[str, Provider], metrics: Metrics
) -> tuple[EmbeddingResponse, Dispatched]:
    """Embeddings from the first target that answers (same rules as ``chat``)."""
    return await _first_answer(plan, metrics, lambda t: providers[t.provider].embed(request, t.model))
