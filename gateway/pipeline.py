"""The request path, as one function per endpoint (and a streaming twin for chat).

Reading ``Pipeline.chat`` top to bottom is reading what happens to a request:

    auth -> decode -> policy.route -> [limits, moderation.in, cache: their issues] -> dispatch
         -> [moderation.out, cache.put] -> ledger (metrics and the request log for now)

Every stage lives in its own module; this one only orders them and owns the per-request facts
(``Call``) and what a request produced (``Completion``, ``Streamed``). It knows nothing of HTTP or
wire formats: the API layer decodes and encodes around it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from gateway import dispatch, tokens
from gateway.errors import GatewayError
from gateway.providers import SelfHostProvider, build_providers
from gateway.types import ChatRequest, TextDelta, ToolCallDelta, Usage, UsageEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    import httpx

    from gateway.auth import Authenticator
    from gateway.obs.metrics import Metrics
    from gateway.policy import Plan, Policy
    from gateway.providers.base import Provider
    from gateway.settings import Settings
    from gateway.store.keys import Principal
    from gateway.types import ChatResponse, EmbeddingRequest, EmbeddingResponse, StreamEvent

log = structlog.get_logger("gateway.request")


@dataclass(frozen=True, slots=True)
class Call:
    """What is known about a request before its body is read."""

    request_id: str
    api_key: str | None
    endpoint: str
    """``chat.completions``, ``messages``, ``embeddings`` or ``models``."""
    started: float
    """``time.perf_counter()`` when the request arrived."""


@dataclass(slots=True)
class Completion:
    """A non-streamed answer and where it came from."""

    response: ChatResponse
    served_by: dispatch.Dispatched


@dataclass(slots=True)
class Streamed:
    """An open stream: its first event has arrived, so the HTTP response can start."""

    request: ChatRequest
    served_by: dispatch.Dispatched
    events: AsyncIterator[StreamEvent]


class Runtime:
    """The live policy and the provider adapters built from it, sharing one pooled HTTP client."""

    def __init__(self, policy: Policy, client: httpx.AsyncClient) -> None:
        self.client = client
        self.policy = policy
        self.providers: Mapping[str, Provider] = build_providers(policy.providers, client)

    async def aclose(self) -> None:
        """Release what providers hold beyond the shared client (the in-process engine's thread)."""
        for provider in self.providers.values():
            if isinstance(provider, SelfHostProvider):
                await provider.aclose()


class Pipeline:
    """The stages, wired once at startup; each method is the request path of one endpoint."""

    def __init__(self, settings: Settings, auth: Authenticator, runtime: Runtime, metrics: Metrics) -> None:
        self.settings = settings
        self.auth = auth
        self.runtime = runtime
        self.metrics = metrics

    async def chat(self, call: Call, decode: Callable[[], ChatRequest]) -> Completion | Streamed:
        """A chat completion; ``decode`` turns the body into the canonical request."""
        principal = await self.auth.authenticate(call.api_key)  # 401 before the body is looked at
        request = decode()  # 400
        plan = self.runtime.policy.resolve(request.model)  # 404
        _bind(principal, request)
        # limits / budget, moderation.in and the response cache join here (their own issues)
        if request.stream:
            return await self._open_stream(call, request, plan)
        try:
            response, served_by = await dispatch.chat(plan, request, self.runtime.providers, self.metrics)
        except GatewayError as exc:
            self._ledger(call, request.model, None, exc.status_code, None)
            raise
        if response.usage.input_tokens == 0 and response.usage.output_tokens == 0:
            response.usage = _estimate(request, response.content + "".join(c.arguments for c in response.tool_calls))
        self._ledger(call, request.model, served_by, 200, response.usage)
        return Completion(response, served_by)

    async def _open_stream(self, call: Call, request: ChatRequest, plan: Plan) -> Streamed:
        """The streaming twin: returns once the first event has arrived, so errors before it still raise."""
        try:
            opened = await dispatch.open_stream(plan, request, self.runtime.providers, self.metrics)
        except GatewayError as exc:
            self._ledger(call, request.model, None, exc.status_code, None)
            raise
        self.metrics.ttft.labels(opened.dispatched.target.provider).observe(time.perf_counter() - call.started)
        return Streamed(request, opened.dispatched, self._follow(call, request, opened))

    async def _follow(
        self, call: Call, request: ChatRequest, opened: dispatch.OpenStream
    ) -> AsyncIterator[StreamEvent]:
        """Pass a stream through, making sure it ends with usage, and account for it however it ends."""
        produced: list[str] = []
        usage: Usage | None = None
        status = 499  # the client went away, unless we learn otherwise
        try:
            event: StreamEvent = opened.first
            events = opened.rest
            while True:
                if isinstance(event, TextDelta):
                    produced.append(event.text)
                elif isinstance(event, ToolCallDelta):
                    produced.append(event.arguments)
                elif isinstance(event, UsageEvent):
                    usage = event.usage
                yield event
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
            if usage is None:
                usage = _estimate(request, "".join(produced))
                yield UsageEvent(usage)
            status = 200
        except GatewayError as exc:
            status = exc.status_code
            raise
        finally:
            await opened.rest.aclose()  # type: ignore[attr-defined]
            if usage is None:  # cut short: bill what was produced
                usage = _estimate(request, "".join(produced))
            self._ledger(call, request.model, opened.dispatched, status, usage)

    async def embed(
        self, call: Call, decode: Callable[[], EmbeddingRequest]
    ) -> tuple[EmbeddingResponse, dispatch.Dispatched]:
        """Embeddings."""
        principal = await self.auth.authenticate(call.api_key)
        request = decode()
        plan = self.runtime.policy.resolve(request.model)
        _bind(principal, request)
        try:
            response, served_by = await dispatch.embed(plan, request, self.runtime.providers, self.metrics)
        except GatewayError as exc:
            self._ledger(call, request.model, None, exc.status_code, None)
            raise
        self._ledger(call, request.model, served_by, 200, response.usage)
        return response, served_by

    async def models(self, call: Call) -> list[tuple[str, str]]:
        """The aliases this caller can use, with the provider that serves each first."""
        await self.auth.authenticate(call.api_key)
        policy = self.runtime.policy
        return [(alias, policy.models[alias][0].provider) for alias in policy.available_models()]

    def _ledger(
        self, call: Call, model: str, served_by: dispatch.Dispatched | None, status: int, usage: Usage | None
    ) -> None:
        """Record the outcome. The usage ledger (its own issue) will write records here, behind the response."""
        seconds = time.perf_counter() - call.started
        provider = served_by.target.provider if served_by else "none"
        self.metrics.observe_request(call.endpoint, model, provider, status, seconds)
        if usage is not None and served_by is not None:
            self.metrics.observe_tokens(provider, usage.input_tokens, usage.output_tokens, usage.cached_input_tokens)
        log.info(
            "request_done",
            endpoint=call.endpoint,
            status=status,
            ms=round(seconds * 1000, 2),
            target=f"{provider}/{served_by.target.model}" if served_by else None,
            attempts=len(served_by.attempts) if served_by else 0,
            input_tokens=usage.input_tokens if usage else None,
            output_tokens=usage.output_tokens if usage else None,
            usage_source=usage.source if usage else None,
        )


def _bind(principal: Principal, request: ChatRequest | EmbeddingRequest) -> None:
    if isinstance(request, ChatRequest):
        request.tenant = principal.tenant
    structlog.contextvars.bind_contextvars(tenant=principal.tenant, model=request.model)


def _estimate(request: ChatRequest, output: str) -> Usage:
    """Usage counted by us because upstream reported none; labelled as an estimate."""
    return Usage(tokens.count_prompt(request), tokens.count_text(output), source="estimate")
