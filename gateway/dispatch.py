"""Dispatch: carry out a routing decision, attempt by attempt, until a deployment answers.

Owns the attempt loop and what each attempt teaches the router:

- targets are tried in the decision's order; one whose breaker is open or that is at its
  concurrency cap is skipped (and the skip recorded);
- an upstream error moves on to the next target at once (fallback before the first byte); for
  streams, "answers" means the first event arrived, so a stream that breaks later is the pipeline's
  to end with an error event, never a reason to switch;
- once every target has been tried, those that failed with a retryable error are tried again, up to
  ``routing.retries`` more rounds, after an exponential backoff with full jitter;
- each attempt has its own deadline (the target's ``attempt_timeout_s``) inside the request's total
  one (``routing.total_timeout_s``);
- errors that are the caller's fault (``ClientError``) stop everything at once and are nobody's
  failure; every other outcome goes to the deployment's breaker and statistics, and every attempt,
  skipped ones included, is listed in ``Dispatched.attempts``.

Does not own ranking targets (``gateway.router``) or what a stream does after its first event.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import structlog

from gateway.errors import (
    AllTargetsFailed,
    ClientError,
    ProviderBadResponse,
    ProviderTimeout,
    ProviderUnavailable,
    UpstreamError,
)
from gateway.router import PRIOR_TPOT_S

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from gateway.obs.metrics import Metrics
    from gateway.policy import Target
    from gateway.providers.base import Provider
    from gateway.router import Decision, Router
    from gateway.types import ChatRequest, ChatResponse, EmbeddingRequest, EmbeddingResponse, StreamEvent

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of one target and how it ended."""

    target: Target
    outcome: str
    """``ok``, the error class name, or ``skipped:breaker_open`` / ``skipped:at_capacity``."""
    seconds: float


@dataclass(slots=True)
class Dispatched:
    """Where a request went, why, and what was tried on the way."""

    target: Target
    reason: str
    """The router's reason for its first choice (``gateway.router.Decision.reason``)."""
    attempts: list[Attempt] = field(default_factory=list)


class OpenStream:
    """A stream whose first event has arrived; ``finish`` must be called once it ends, however it ends."""

    def __init__(
        self,
        dispatched: Dispatched,
        first: StreamEvent,
        rest: AsyncIterator[StreamEvent],
        dispatcher: Dispatcher,
        load: int | None = None,
    ) -> None:
        self.dispatched = dispatched
        self.first = first
        self.rest = rest
        self._dispatcher = dispatcher
        self._first_at = dispatcher.clock()
        self.load = load
        """Requests in flight on the deployment when this stream's attempt started, itself included."""
        self._finished = False

    def finish(self, *, ok: bool, output_tokens: int) -> None:
        """Teach the router how the stream went: its time per output token, and whether it broke."""
        if self._finished:
            return
        self._finished = True
        key = self.dispatched.target.key
        router = self._dispatcher.router
        tpot = (self._dispatcher.clock() - self._first_at) / (output_tokens - 1) if output_tokens > 1 else None
        stats = router.stats[key]
        stats.in_flight -= 1
        if not ok:  # its success was counted at the first event
            stats.outcome(False)
            router.breakers[key].failure(self._dispatcher.clock())
        elif tpot is not None:
            router.stats.record(key, tpot=tpot, ok=None, load=self.load)


class Dispatcher:
    """Runs attempts for the router's decisions and feeds their outcomes back into it."""

    def __init__(
        self,
        router: Router,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        self.jitter = jitter

    async def chat(
        self, decision: Decision, request: ChatRequest, providers: Mapping[str, Provider]
    ) -> tuple[ChatResponse, Dispatched]:
        """A non-streamed completion from the first target that answers.

        Raises:
            ClientError: the upstream said the request itself is wrong.
            UpstreamError: every attempt failed (``AllTargetsFailed`` when more than one was made).
        """

        async def attempt(target: Target, started: float, load: int) -> ChatResponse:
            response = await providers[target.provider].chat(request, target.model)
            self._learn_whole(target, self.clock() - started, response.usage.output_tokens, load)
            return response

        return await self._run(decision, attempt)

    async def embed(
        self, decision: Decision, request: EmbeddingRequest, providers: Mapping[str, Provider]
    ) -> tuple[EmbeddingResponse, Dispatched]:
        """Embeddings from the first target that answers (same rules as ``chat``)."""

        async def attempt(target: Target, started: float, load: int) -> EmbeddingResponse:
            response = await providers[target.provider].embed(request, target.model)
            self._learn_whole(target, self.clock() - started, 0, load)
            return response

        return await self._run(decision, attempt)

    async def open_stream(
        self, decision: Decision, request: ChatRequest, providers: Mapping[str, Provider]
    ) -> OpenStream:
        """Open a stream on the first target whose first event arrives; the rest is the caller's to read.

        The caller must call ``OpenStream.finish`` when the stream ends.

        Raises:
            ClientError: the upstream said the request itself is wrong.
            UpstreamError: every attempt failed before a first event.
        """

        async def attempt(
            target: Target, started: float, load: int
        ) -> tuple[StreamEvent, AsyncIterator[StreamEvent], int]:
            events = providers[target.provider].stream(request, target.model)
            try:
                first = await anext(events)
            except StopAsyncIteration:
                await events.aclose()  # type: ignore[attr-defined]
                raise ProviderBadResponse(f"{target.key}: the stream ended before any event") from None
            except BaseException:
                await events.aclose()  # type: ignore[attr-defined]
                raise
            self.router.stats.record(target.key, ttft=self.clock() - started, ok=True, load=load)
            return first, events, load

        (first, rest, load), dispatched = await self._run(decision, attempt, streaming=True)
        return OpenStream(dispatched, first, rest, self, load)

    def _learn_whole(self, target: Target, seconds: float, output_tokens: int, load: int) -> None:
        """Samples from a whole (non-streamed) answer: its TTFT is what remains after the usual decode time."""
        stats = self.router.stats[target.key]
        tpot = stats.tpot.quantile(0.5) or PRIOR_TPOT_S
        ttft = max(seconds - max(output_tokens - 1, 0) * tpot, 0.0)
        self.router.stats.record(target.key, ttft=ttft, ok=True, load=load)

    async def _run(
        self, decision: Decision, attempt: Callable[[Target, float, int], Awaitable[T]], *, streaming: bool = False
    ) -> tuple[T, Dispatched]:
        options = self.router.options
        deadline = self.clock() + options.total_timeout_s
        attempts: list[Attempt] = []
        errors: list[UpstreamError] = []
        pending = list(decision.order)
        for round_no in range(options.retries + 1):
            if round_no:
                cap = min(options.backoff_max_ms, options.backoff_ms * 2 ** (round_no - 1)) / 1000
                await self.sleep(min(self.jitter() * cap, max(deadline - self.clock(), 0.0)))
            again: list[Target] = []
            for target in pending:
                now = self.clock()
                if now >= deadline:
                    errors.append(ProviderTimeout(f"no answer within the {options.total_timeout_s:g} s total deadline"))
                    raise _failed(errors)
                skipped = self._skip_reason(target, now)
                if skipped is not None:
                    attempts.append(Attempt(target, f"skipped:{skipped}", 0.0))
                    again.append(target)  # its breaker may be half-open by the next round
                    continue
                judged = decision.loads.get(target.key)
                result = await self._try(target, attempt, attempts, deadline, judged, streaming=streaming)
                if isinstance(result, UpstreamError):
                    errors.append(result)
                    if result.retryable:
                        again.append(target)
                    continue
                return result, Dispatched(target, decision.reason, attempts)
            pending = again
            if not pending:
                break
        if not errors:
            raise ProviderUnavailable(
                "Every deployment for this model is unavailable right now (circuit open or at capacity)."
            )
        raise _failed(errors)

    def _skip_reason(self, target: Target, now: float) -> str | None:
        cap = target.max_concurrency
        if cap is not None and self.router.stats[target.key].held >= cap:
            return "at_capacity"
        if not self.router.breakers[target.key].acquire(now):
            return "breaker_open"
        return None

    async def _try(
        self,
        target: Target,
        attempt: Callable[[Target, float, int], Awaitable[T]],
        attempts: list[Attempt],
        deadline: float,
        judged_load: int | None,
        *,
        streaming: bool,
    ) -> T | UpstreamError:
        """One attempt: its result, or the upstream error it ended with (caller errors propagate).

        Its samples are filed under ``judged_load`` (an engine's own load, as the router judged it)
        or else this replica's in-flight count, itself included.
        """
        key = target.key
        stats, breaker = self.router.stats[key], self.router.breakers[key]
        started = self.clock()
        limit = min(target.attempt_timeout_s or math.inf, deadline - started)
        stats.in_flight += 1
        load = judged_load if judged_load is not None else stats.in_flight
        keep_in_flight = False
        try:
            async with asyncio.timeout(limit if math.isfinite(limit) else None):
                result = await attempt(target, started, load)
        except TimeoutError:
            error: UpstreamError = ProviderTimeout(f"{key}: no answer within {limit:.3g} s")
        except UpstreamError as exc:
            error = exc
        except ClientError:
            breaker.release()
            self._record(attempts, target, "client_error", started)
            raise
        except BaseException:
            breaker.release()  # cancelled: no verdict on the deployment
            raise
        else:
            if breaker.success():
                stats.recovered()
            keep_in_flight = streaming  # the stream is still running; OpenStream.finish ends it
            self._record(attempts, target, "ok", started)
            return result
        finally:
            if not keep_in_flight:
                stats.in_flight -= 1
        breaker.failure(self.clock())
        self.router.stats.record(key, ok=False)
        self._record(attempts, target, type(error).__name__, started)
        return error

    def _record(self, attempts: list[Attempt], target: Target, outcome: str, started: float) -> None:
        attempts.append(Attempt(target, outcome, self.clock() - started))
        self.metrics.observe_attempt(target.provider, outcome)
        if outcome != "ok":
            log.warning("provider_call_failed", target=target.key, error=outcome, attempt=len(attempts))


def _failed(errors: list[UpstreamError]) -> UpstreamError:
    """One kind of failure is reported as itself (the last, with its ``retry_after``); mixed ones together."""
    if len({type(e) for e in errors}) == 1:
        return errors[-1]
    return AllTargetsFailed(errors)
