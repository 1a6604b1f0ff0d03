"""The request path, as one function per endpoint (and a streaming twin for chat).

Reading ``Pipeline.chat`` top to bottom is reading what happens to a request:

    auth -> decode -> policy.resolve -> router.decide -> [limits, moderation.in: their issues] -> cache
         (a hit replays) -> dispatch -> [moderation.out: its issue] -> cache.put -> ledger

Every stage lives in its own module; this one only orders them and owns the per-request facts
(``Call``) and what a request produced (``Completion``, ``Streamed``). It knows nothing of HTTP or
wire formats: the API layer decodes and encodes around it. A request reads the live policy once
(``Runtime.live``), so an edit that lands mid-request never mixes two policies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from gateway import dispatch, tokens
from gateway.cache.entry import replay
from gateway.cache.prefix import request_prefix
from gateway.cache.responses import ResponseCache
from gateway.cache.store import MemoryStore
from gateway.errors import BudgetExceeded, GatewayError
from gateway.policy import Target
from gateway.router import Workload
from gateway.types import ChatRequest, TextDelta, ToolCallDelta, Usage, UsageEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from gateway.auth import Authenticator
    from gateway.cache.responses import CacheStatus, Directive, Slot
    from gateway.ledger import Admission, Ledger
    from gateway.obs.metrics import Metrics
    from gateway.policy import Plan, Policy
    from gateway.router import Decision
    from gateway.runtime import Live, Runtime
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
    slo: str | None = None
    """The SLO class asked for in the ``x-crossway-slo`` header."""
    cache: Directive | None = None
    """The ``x-crossway-cache`` header: ``use`` (opt in), ``bypass`` or ``refresh``."""


@dataclass(slots=True)
class Completion:
    """A non-streamed answer and where it came from."""

    response: ChatResponse
    served_by: dispatch.Dispatched
    slo: str
    cache: CacheStatus | None = None
    admission: Admission | None = None
    """The ledger's admission (its rate-limit standing becomes response headers); ``None`` without limits."""


@dataclass(slots=True)
class Streamed:
    """An open stream: its first event has arrived, so the HTTP response can start."""

    request: ChatRequest
    served_by: dispatch.Dispatched
    slo: str
    events: AsyncIterator[StreamEvent]
    cache: CacheStatus | None = None
    admission: Admission | None = None


class Pipeline:
    """The stages, wired once at startup; each method is the request path of one endpoint."""

    def __init__(
        self,
        settings: Settings,
        auth: Authenticator,
        runtime: Runtime,
        metrics: Metrics,
        cache: ResponseCache | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        """Usage records, budgets and rate limits; ``None`` turns all three off."""
        self.auth = auth
        self.runtime = runtime
        self.metrics = metrics
        self.cache = cache or ResponseCache(MemoryStore(settings.cache_memory_bytes))

    async def chat(self, call: Call, decode: Callable[[], ChatRequest]) -> Completion | Streamed:
        """A chat completion; ``decode`` turns the body into the canonical request."""
        principal = await self.auth.authenticate(call.api_key)  # 401 before the body is looked at
        model = ""
        try:
            request = decode()  # 400
            model = request.model
            _bind(principal, request)
            live = self.runtime.live
            plan = live.policy.resolve(model, principal.tenant, _slo_asked(call, request, live.policy))  # 404/403
        except GatewayError as exc:  # a known tenant's refused request is accounted for too
            self._refused(call, principal, model, exc)
            raise
        decision = self.runtime.decide(plan, workload(request), live)
        admission = await self._admit(call, principal, plan, request)  # 429 / 402
        # moderation.in joins here (its own issue)
        slot = await self.cache.open(request, live.policy.cache, _first_choice(decision, request), call.cache)
        if slot.hit is not None:
            if admission is not None and self.ledger is not None:  # a replay costs nothing upstream
                self.ledger.finish(admission, target=None, status=200, usage=None)
            return self._replay(call, request, plan, slot, admission)
        if request.stream:
            return await self._open_stream(call, request, plan, decision, live, slot, admission)
        try:
            response, served_by = await self.runtime.dispatcher.chat(decision, request, live.providers)
        except GatewayError as exc:
            self._ledger(call, request.model, None, exc.status_code, None, admission, type(exc).__name__)
            raise
        if response.usage.input_tokens == 0 and response.usage.output_tokens == 0:
            response.usage = _estimate(request, response.content + "".join(c.arguments for c in response.tool_calls))
        await slot.store(response, served_by.target)
        self._ledger(call, request.model, served_by, 200, response.usage, admission)
        return Completion(response, served_by, plan.slo.name, slot.status, admission)

    def _replay(
        self, call: Call, request: ChatRequest, plan: Plan, slot: Slot, admission: Admission | None = None
    ) -> Completion | Streamed:
        """A cache hit: the stored answer as first sent (also as a stream), with no upstream call."""
        hit = slot.hit
        assert hit is not None  # noqa: S101 - called for hits only
        served_by = dispatch.Dispatched(Target(hit.provider, hit.model), "cache-hit")
        self.metrics.observe_request(call.endpoint, request.model, "cache", 200, time.perf_counter() - call.started)
        log.info("request_done", endpoint=call.endpoint, status=200, cache="hit", target=f"{hit.provider}/{hit.model}")
        if hit.response is not None:
            return Completion(hit.response, served_by, plan.slo.name, slot.status, admission)
        return Streamed(request, served_by, plan.slo.name, replay(hit.events or []), slot.status, admission)

    async def _open_stream(
        self,
        call: Call,
        request: ChatRequest,
        plan: Plan,
        decision: Decision,
        live: Live,
        slot: Slot,
        admission: Admission | None = None,
    ) -> Streamed:
        """The streaming twin: returns once the first event has arrived, so errors before it still raise."""
        try:
            opened = await self.runtime.dispatcher.open_stream(decision, request, live.providers)
        except GatewayError as exc:
            self._ledger(call, request.model, None, exc.status_code, None, admission, type(exc).__name__)
            raise
        ttft = time.perf_counter() - call.started
        self.metrics.ttft.labels(opened.dispatched.target.provider).observe(ttft)
        if admission is not None:
            admission.ttft_s = ttft
        followed = self._follow(call, request, opened, admission)
        events = slot.tee(followed, opened.dispatched.target)  # stored once complete
        return Streamed(request, opened.dispatched, plan.slo.name, events, slot.status, admission)

    async def _follow(
        self, call: Call, request: ChatRequest, opened: dispatch.OpenStream, admission: Admission | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Pass a stream through, making sure it ends with usage, and account for it however it ends."""
        produced: list[str] = []
        usage: Usage | None = None
        status = 499  # the client went away, unless we learn otherwise
        error: str | None = "ClientDisconnected"
        # A budgeted request's reservation covers ``max_tokens`` of output; an upstream that streams past
        # them is stopped. Characters are counted as they pass (an add per event); once they could be
        # half the cap (2 per token), the new text's tokens are counted, and again each time enough
        # text has followed to pass the limit at the characters per token seen so far. The limit has
        # some slack over the cap because our count (tiktoken) is not the upstream's tokenizer: an
        # honest upstream must never be cut.
        cap = request.max_tokens if admission is not None and admission.reservation is not None else None
        limit = cap + cap // 4 + 8 if cap is not None else 0
        check_at = cap * 2 if cap is not None else -1
        chars = counted = used = 0
        try:
            event: StreamEvent = opened.first
            events = opened.rest
            while True:
                if isinstance(event, TextDelta):
                    produced.append(event.text)
                    chars += len(event.text)
                elif isinstance(event, ToolCallDelta):
                    produced.append(event.arguments)
                    chars += len(event.arguments)
                elif isinstance(event, UsageEvent):
                    usage = event.usage
                if 0 <= check_at < chars:
                    used += tokens.count_text("".join(produced[counted:]))
                    counted = len(produced)
                    if used > limit:
                        raise _past_reservation(request.max_tokens or 0, admission)
                    check_at = chars + (limit - used) * max(1, chars // max(used, 1))
                yield event
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
            if usage is None:
                usage = _estimate(request, "".join(produced))
                yield UsageEvent(usage)
            status, error = 200, None
        except GatewayError as exc:
            status, error = exc.status_code, type(exc).__name__
            raise
        finally:
            await opened.rest.aclose()  # type: ignore[attr-defined]
            if usage is None:  # cut short: bill what was produced
                usage = _estimate(request, "".join(produced))
            opened.finish(ok=status < 500, output_tokens=usage.output_tokens)
            self._ledger(call, request.model, opened.dispatched, status, usage, admission, error)

    async def embed(
        self, call: Call, decode: Callable[[], EmbeddingRequest]
    ) -> tuple[EmbeddingResponse, dispatch.Dispatched]:
        """Embeddings."""
        principal = await self.auth.authenticate(call.api_key)
        model = ""
        try:
            request = decode()
            model = request.model
            _bind(principal, request)
            live = self.runtime.live
            plan = live.policy.resolve(model, principal.tenant, call.slo)
        except GatewayError as exc:
            self._refused(call, principal, model, exc)
            raise
        size = sum(len(x) // CHARS_PER_TOKEN if isinstance(x, str) else len(x) for x in request.input)
        decision = self.runtime.decide(plan, Workload(size, 0), live)
        admission = await self._admit(call, principal, plan, None, size)  # 429 / 402
        try:
            response, served_by = await self.runtime.dispatcher.embed(decision, request, live.providers)
        except GatewayError as exc:
            self._ledger(call, request.model, None, exc.status_code, None, admission, type(exc).__name__)
            raise
        self._ledger(call, request.model, served_by, 200, response.usage, admission)
        return response, served_by

    async def models(self, call: Call) -> list[tuple[str, str]]:
        """The aliases this caller can use, with the provider that serves each first."""
        principal = await self.auth.authenticate(call.api_key)
        policy = self.runtime.policy
        return [(alias, policy.models[alias][0].provider) for alias in policy.available_models(principal.tenant)]

    def explain(self, request: ChatRequest, tenant: str | None, slo: str | None) -> tuple[Plan, Decision]:
        """What the router would do with ``request`` now, without sending it or exploring (admin API)."""
        live = self.runtime.live
        plan = live.policy.resolve(request.model, tenant, slo or _slo_asked(None, request, live.policy))
        return plan, self.runtime.decide(plan, workload(request), live, explore=False)

    async def _admit(
        self, call: Call, principal: Principal, plan: Plan, request: ChatRequest | None, embed_tokens: int = 0
    ) -> Admission | None:
        """Rate limits and budget reservation (``gateway.ledger``); may cap a budgeted request's ``max_tokens``."""
        if self.ledger is None:
            return None
        chat = request
        admission, cap = await self.ledger.admit(
            principal,
            plan,
            request_id=call.request_id,
            endpoint=call.endpoint,
            started=call.started,
            streamed=request.stream if request is not None else False,
            input_tokens=lambda: tokens.count_prompt(chat) if chat is not None else embed_tokens,
            max_output_tokens=request.max_tokens if request is not None else 0,
        )
        if request is not None:
            request.max_tokens = cap
        return admission

    def _refused(self, call: Call, principal: Principal, model: str, exc: GatewayError) -> None:
        """Record a request refused after authentication and before admission (status, error, no tokens)."""
        if self.ledger is not None:
            self.ledger.refuse(
                principal,
                request_id=call.request_id,
                endpoint=call.endpoint,
                started=call.started,
                alias=model,
                status=exc.status_code,
                error=type(exc).__name__,
            )

    def _ledger(
        self,
        call: Call,
        model: str,
        served_by: dispatch.Dispatched | None,
        status: int,
        usage: Usage | None,
        admission: Admission | None = None,
        error: str | None = None,
    ) -> None:
        """Record the outcome: metrics, the request log line and the usage record (written behind the response)."""
        if admission is not None and self.ledger is not None:
            target = served_by.target if served_by is not None else None
            record = self.ledger.finish(admission, target=target, status=status, usage=usage, error=error)
            if record is not None and record.provider is not None:
                tenant = record.tenant or "none"
                self.metrics.observe_cost(tenant, record.provider, record.cost_nanos / 1e9, record.saved_nanos / 1e9)
                if record.slo_met is not None:
                    self.metrics.observe_slo(
                        tenant,
                        record.slo_class,
                        record.slo_met,
                        record.deployment or record.provider,
                        record.ttft_ms / 1000 if record.ttft_ms is not None else None,
                        record.tpot_ms / 1000 if record.tpot_ms is not None else None,
                    )
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


CHARS_PER_TOKEN = 4
"""The router sizes requests by characters: a token count would cost more than the decision it informs."""
DEFAULT_OUTPUT_TOKENS = 256
"""The answer length the router assumes when a request sets no ``max_tokens``."""
PREFIX_MIN_CHARS = 1024
"""A stable prefix (system prompt and tools) at least this long makes prefix affinity worth keeping."""


def workload(request: ChatRequest) -> Workload:
    """What the router needs to know of a request's size, and the hash of its stable prefix.

    The prefix is computed here once per request and kept on it (``request_prefix``): provider
    adapters derive their prompt-cache keys from the same block.
    """
    chars = sum(len(m.text()) for m in request.messages)
    stable = request_prefix(request)
    prefix_key = stable.hash if stable is not None and stable.chars >= PREFIX_MIN_CHARS else None
    return Workload(chars // CHARS_PER_TOKEN, request.max_tokens or DEFAULT_OUTPUT_TOKENS, prefix_key)


def _first_choice(decision: Decision, request: ChatRequest) -> str:
    """The deployment the router tries first (what ``cache.key_by: deployment`` keys on)."""
    return decision.order[0].key if decision.order else request.model


def _slo_asked(call: Call | None, request: ChatRequest, policy: Policy) -> str | None:
    """The header's SLO class; else a ``service_tier`` that some SLO class claims (others go upstream as is)."""
    if call is not None and call.slo is not None:
        return call.slo
    tier = request.extra.get("service_tier")
    if isinstance(tier, str) and any(tier in c.service_tiers for c in policy.slo_classes.values()):
        return tier
    return None


def _past_reservation(cap: int, admission: Admission | None) -> BudgetExceeded:
    scopes = ", ".join(f"`{s}`" for s in admission.budget_scopes) if admission is not None else ""
    return BudgetExceeded(
        f"Stream stopped: the output passed the {cap} tokens its budget reservation covers ({scopes}); "
        "the tokens produced so far are billed.",
        code="budget_exceeded",
    )


def _bind(principal: Principal, request: ChatRequest | EmbeddingRequest) -> None:
    if isinstance(request, ChatRequest):
        request.tenant = principal.tenant
    structlog.contextvars.bind_contextvars(tenant=principal.tenant, model=request.model)


def _estimate(request: ChatRequest, output: str) -> Usage:
    """Usage counted by us because upstream reported none; labelled as an estimate."""
    return Usage(tokens.count_prompt(request), tokens.count_text(output), source="estimate")
