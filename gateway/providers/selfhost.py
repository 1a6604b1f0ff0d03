"""Adapter for the self-hosted engine running inside the gateway process (the embedded default).

Owns loading one ``selfhost.AsyncEngine`` per model on first use (in a worker thread, so the event
loop keeps serving), translating canonical chat requests into the model's own chat template and
sampling parameters, and engine outputs into canonical events with exact token counts
(``source="engine"``; prefix-cache hits reported as cached input tokens). The KV prefix cache is
salted with the request's tenant. Does not own the engine itself (``selfhost``) nor the engine run as
its own server: that one is reached with the ``openai`` adapter like any OpenAI-compatible server.

The engine serves text chat: tools, images and structured output are refused with a clear 400.
``torch`` and the engine are imported only when a self-hosted model is first used.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequest, ProviderUnavailable
from gateway.stats import EngineLoad
from gateway.types import ChatResponse, Finish, ImagePart, TextDelta, Usage, UsageEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx

    from gateway.policy import ProviderConfig
    from gateway.types import ChatRequest, EmbeddingRequest, EmbeddingResponse, FinishReason, StreamEvent
    from selfhost.async_engine import AsyncEngine
    from selfhost.output import RequestOutput

_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "error", None: "stop"}
_ids = itertools.count()


class SelfHostProvider:
    """The in-process engine behind the ``Provider`` protocol; the upstream model names what to load."""

    def __init__(self, config: ProviderConfig, client: httpx.AsyncClient | None = None) -> None:
        """Prepare (not load) engines for ``config``; ``client`` is unused (no HTTP here)."""
        self.config = config
        self._engines: dict[str, asyncio.Task[AsyncEngine]] = {}

    def _engine(self, model: str) -> asyncio.Task[AsyncEngine]:
        task = self._engines.get(model)
        if task is None:
            task = self._engines[model] = asyncio.ensure_future(asyncio.to_thread(_load, model, self.config.engine))
        return task

    def load(self, model: str) -> EngineLoad | None:
        """How busy ``model``'s engine is as of its latest step (``None`` until it is loaded)."""
        task = self._engines.get(model)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        snapshot = task.result().metrics_snapshot()
        total = snapshot.kv_blocks_total
        return EngineLoad(snapshot.num_waiting, snapshot.num_running, snapshot.kv_blocks_free / total if total else 1.0)

    async def engine(self, model: str) -> AsyncEngine:
        """The running engine for ``model``, loading it on first use.

        Raises:
            ProviderUnavailable: the model could not be loaded (the message says why).
        """
        task = self._engine(model)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.config.timeout_s)
        except TimeoutError as exc:
            raise ProviderUnavailable(f"{self.config.name}: model {model!r} is still loading") from exc
        except (OSError, ValueError, RuntimeError) as exc:
            del self._engines[model]  # let a later request try again
            raise ProviderUnavailable(f"{self.config.name}: cannot load model {model!r}: {exc}") from exc

    async def chat(self, request: ChatRequest, model: str) -> ChatResponse:
        """Run one request to the end."""
        text: list[str] = []
        finish: FinishReason = "stop"
        usage = Usage(source="engine")
        async for event in self.stream(request, model):
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, Finish):
                finish = event.reason
            elif isinstance(event, UsageEvent):
                usage = event.usage
        return ChatResponse(model=model, content="".join(text), finish_reason=finish, usage=usage)

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        """Stream text deltas, then ``Finish`` and exact usage. Closing the iterator aborts the request."""
        engine = await self.engine(model)
        prompt = engine.tokenizer.encode_chat(_messages(request))
        params = _sampling(request, engine.engine.max_model_len - len(prompt))
        last: RequestOutput | None = None
        try:
            async for out in engine.generate(prompt, params, request_id=f"gw-{next(_ids)}", tenant=request.tenant):
                last = out
                if out.text:
                    yield TextDelta(out.text)
        except ValueError as exc:
            raise InvalidRequest(f"{self.config.name}: {exc}") from exc
        except RuntimeError as exc:
            raise ProviderUnavailable(f"{self.config.name}: {exc}") from exc
        if last is None:
            raise ProviderUnavailable(f"{self.config.name}: the engine produced no output")
        yield Finish(_FINISH.get(last.finish_reason, "stop"))
        yield UsageEvent(
            Usage(
                last.num_prompt_tokens,
                last.num_output_tokens,
                cached_input_tokens=last.num_cached_tokens,
                source="engine",
            )
        )

    async def embed(self, request: EmbeddingRequest, model: str) -> EmbeddingResponse:
        """The engine serves no embeddings."""
        raise InvalidRequest(f"{self.config.name}: the self-hosted engine does not serve embeddings", param="model")

    async def aclose(self) -> None:
        """Stop every engine that finished loading (a load still running is left to end on its own)."""
        for task in self._engines.values():
            if task.done() and not task.cancelled() and task.exception() is None:
                await asyncio.to_thread(task.result().close)
        self._engines.clear()


def _load(model: str, options: dict[str, Any]) -> AsyncEngine:
    from selfhost.async_engine import AsyncEngine
    from selfhost.config import EngineConfig

    return AsyncEngine.from_model(model, EngineConfig(**options))


def _messages(request: ChatRequest) -> list[dict[str, str]]:
    if request.tools or (request.tool_choice is not None and request.tool_choice.mode != "none"):
        raise InvalidRequest("The self-hosted model does not support tool calling.", param="tools")
    if request.response_format is not None:
        raise InvalidRequest("The self-hosted model does not support response_format.", param="response_format")
    out = []
    for m in request.messages:
        if m.role == "tool" or m.tool_calls:
            raise InvalidRequest("The self-hosted model does not support tool calling.", param="messages")
        if any(isinstance(p, ImagePart) for p in m.content):
            raise InvalidRequest("The self-hosted model does not accept images.", param="messages")
        out.append({"role": m.role, "content": m.text()})
    return out


def _sampling(request: ChatRequest, room: int) -> Any:
    from selfhost.sampling import SamplingParams

    if room < 1 or (request.max_tokens or 1) > room:
        raise InvalidRequest(
            f"The prompt leaves room for {max(room, 0)} tokens in the self-hosted model's context; "
            f"{request.max_tokens} were requested.",
            param="max_tokens",
        )
    try:
        return SamplingParams(
            max_tokens=request.max_tokens or room,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else max(request.top_p, 1e-6),
            top_k=request.top_k or 0,
            seed=request.seed,
            stop=tuple(request.stop),
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
