"""The engine's own OpenAI-compatible HTTP server (``crossway engine --model ... --port ...``).

Owns the wire surface of a standalone engine: ``POST /v1/chat/completions`` and
``POST /v1/completions`` (JSON or SSE streams), ``GET /v1/models``, ``GET /health`` and
``GET /metrics`` (Prometheus text), plus ``main`` for the command line. Does not own auth,
routing or accounting (the gateway's), nor the engine loop (``async_engine``).
"""

from __future__ import annotations

import argparse
import gc
import time
import uuid
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

from selfhost.async_engine import AsyncEngine
from selfhost.config import EngineConfig
from selfhost.metrics import render_prometheus
from selfhost.sampling import SamplingParams, TokenLogprobs

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from selfhost.output import RequestOutput

TENANT_HEADER = "x-crossway-tenant"


class StreamOptions(msgspec.Struct):
    """OpenAI ``stream_options``."""

    include_usage: bool = False


class ChatRequest(msgspec.Struct):
    """The subset of OpenAI's chat request the engine honours (unknown fields are ignored)."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    n: int = 1
    user: str | None = None


class CompletionRequest(msgspec.Struct):
    """The subset of OpenAI's legacy completion request the engine honours."""

    model: str
    prompt: str | list[int]
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = None
    n: int = 1
    user: str | None = None


def _error(status: int, message: str, code: str | None = None) -> Response[dict[str, Any]]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return Response({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _params(
    body: ChatRequest | CompletionRequest, max_tokens: int | None, prompt_len: int, context: int
) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    top_n = body.top_logprobs or 0 if isinstance(body, ChatRequest) else body.logprobs
    wants_logprobs = body.logprobs if isinstance(body, ChatRequest) else body.logprobs is not None
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else max(1, context - prompt_len),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=stop,
        logprobs=(top_n or 0) if wants_logprobs else None,
    )


def create_app(engine: AsyncEngine) -> Litestar:
    """Build the Litestar app serving ``engine``."""

    def check_model(body: ChatRequest | CompletionRequest) -> Response[dict[str, Any]] | None:
        if body.model != engine.model_name:
            return _error(404, f"model {body.model!r} is not served here; try {engine.model_name!r}", "model_not_found")
        if body.n != 1:
            return _error(400, "only n=1 is supported")
        return None

    @get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": engine.model_name, "object": "model", "created": 0, "owned_by": "crossway"}
        return {"object": "list", "data": [card]}

    @get("/metrics", media_type="text/plain; version=0.0.4")
    async def metrics() -> str:
        return render_prometheus(engine.metrics_snapshot(), engine.model_name)

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        try:
            body = msgspec.json.decode(await request.body(), type=ChatRequest)
            if (bad := check_model(body)) is not None:
                return bad
            prompt = engine.tokenizer.encode_chat(body.messages)
            params = _params(
                body, body.max_completion_tokens or body.max_tokens, len(prompt), engine.engine.max_model_len
            )
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError, TypeError, KeyError) as exc:
            return _error(400, str(exc))
        return await _respond(engine, request, prompt, params, body, chat=True)

    @post("/v1/completions", status_code=200)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
        try:
            body = msgspec.json.decode(await request.body(), type=CompletionRequest)
            if (bad := check_model(body)) is not None:
                return bad
            prompt = engine.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else body.prompt
            params = _params(body, body.max_tokens, len(prompt), engine.engine.max_model_len)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            return _error(400, str(exc))
        return await _respond(engine, request, prompt, params, body, chat=False)

    return Litestar([health, models, metrics, chat, completions], debug=False)


async def _respond(
    engine: AsyncEngine,
    request: Request[Any, Any, Any],
    prompt: list[int],
    params: SamplingParams,
    body: ChatRequest | CompletionRequest,
    *,
    chat: bool,
) -> Response[Any]:
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    stream = engine.generate(
        prompt, params, request_id=rid, tenant=request.headers.get(TENANT_HEADER), stream=body.stream
    )
    try:
        first = await anext(stream)
    except ValueError as exc:
        return _error(400, str(exc))
    except RuntimeError as exc:
        return _error(503, str(exc))
    wire = _Wire(engine, rid, body.model, chat)
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return Stream(wire.sse(first, stream, usage), media_type="text/event-stream")
    outputs = [first]
    try:
        outputs += [out async for out in stream]
    except RuntimeError as exc:
        return _error(503, str(exc))
    return Response(wire.whole(outputs))


class _Wire:
    """OpenAI JSON shapes for one response."""

    def __init__(self, engine: AsyncEngine, rid: str, model: str, chat: bool) -> None:
        self.engine, self.rid, self.model, self.chat = engine, rid, model, chat
        self.created = int(time.time())

    def _logprobs(self, outputs: list[RequestOutput]) -> dict[str, Any] | None:
        items = [lp for out in outputs for lp in out.logprobs]
        if not items:
            return None
        tok = self.engine.tokenizer

        def text(t: int) -> str:
            return str(tok.decode([t], skip_special_tokens=False))

        if self.chat:
            return {"content": [_chat_logprob(lp, text) for lp in items]}
        return {
            "tokens": [text(lp.token_id) for lp in items],
            "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{text(t): v for t, v in lp.top} for lp in items],
            "text_offset": [],
        }

    def _usage(self, last: RequestOutput) -> dict[str, Any]:
        return {
            "prompt_tokens": last.num_prompt_tokens,
            "completion_tokens": last.num_output_tokens,
            "total_tokens": last.num_prompt_tokens + last.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": last.num_cached_tokens},
        }

    def whole(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        last = outputs[-1]
        text = "".join(out.text for out in outputs)
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason, "logprobs": self._logprobs(outputs)}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        obj = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(last),
        }

    def _chunk(self, out: RequestOutput | None, first: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason if out else None}
        choice["logprobs"] = self._logprobs([out]) if out else None
        if self.chat:
            delta: dict[str, Any] = {"content": out.text if out else ""}
            if first:
                delta["role"] = "assistant"
            choice["delta"] = delta
        else:
            choice["text"] = out.text if out else ""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    async def sse(self, first: RequestOutput, rest: AsyncIterator[RequestOutput], usage: bool) -> AsyncIterator[bytes]:
        enc = msgspec.json.Encoder()
        if self.chat:
            yield b"data: " + enc.encode(self._chunk(None, True)) + b"\n\n"
        last = first
        yield b"data: " + enc.encode(self._chunk(first, False)) + b"\n\n"
        try:
            async for out in rest:
                last = out
                yield b"data: " + enc.encode(self._chunk(out, False)) + b"\n\n"
        except RuntimeError as exc:
            yield b"data: " + enc.encode({"error": {"message": str(exc), "type": "server_error"}}) + b"\n\n"
            return
        if usage:
            tail: dict[str, Any] = {
                "id": self.rid,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
            }
            tail |= {"created": self.created, "model": self.model, "choices": [], "usage": self._usage(last)}
            yield b"data: " + enc.encode(tail) + b"\n\n"
        yield b"data: [DONE]\n\n"


def _chat_logprob(lp: TokenLogprobs, text: Any) -> dict[str, Any]:
    def entry(token_id: int, value: float) -> dict[str, Any]:
        s = text(token_id)
        return {"token": s, "logprob": value, "bytes": list(s.encode())}

    return entry(lp.token_id, lp.logprob) | {"top_logprobs": [entry(t, v) for t, v in lp.top]}


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of ``crossway engine``."""
    p = argparse.ArgumentParser(
        prog="crossway engine", description="Serve a model with Crossway's engine (OpenAI API)."
    )
    d = EngineConfig()  # the flags' defaults are the config's own
    p.add_argument("--model", default="smollm2", help="'smollm2', a GGUF file or a Hugging Face folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=d.device)
    p.add_argument(
        "--quantization",
        default=d.quantization,
        choices=["none", "int8", "int4", "gguf"],
        help="weight-only quantization of the linear layers: int8 per channel or int4 per group of 32; "
        "gguf: a GGUF file's own Q4_1 / Q8_0 blocks on the Triton kernels (CUDA)",
    )
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    p.add_argument(
        "--mixed-prefill-tokens",
        type=int,
        default=d.mixed_prefill_tokens,
        help="most prompt-chunk tokens in a step that also decodes (0: the step budget alone)",
    )
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--num-kv-blocks", type=int, default=d.num_kv_blocks)
    p.add_argument("--no-prefix-caching", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the engine's HTTP server until interrupted; returns the process exit code."""
    import uvicorn

    args = build_parser().parse_args(argv)
    engine = AsyncEngine.from_model(args.model, engine_config(args))
    # NOTE(crossway): what the load left (~688k objects with SmolLM2) is moved out of the
    # collector's sight, as vLLM's engine core does after its start: a full pass over it stopped
    # the engine thread for 186-304 ms on the CPU VM, and for under 0.05 ms once frozen
    # (docs/benchmarks.md, 2026-12-07). Not in from_model: tests build many engines in one process.
    gc.collect()
    gc.freeze()
    try:
        uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="info")
    finally:
        engine.close()
    return 0


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's settings from ``crossway engine``'s parsed flags."""
    return EngineConfig(
        served_model_name=args.served_model_name or ("smollm2" if args.model == "smollm2" else ""),
        dtype=args.dtype,
        device=args.device,
        quantization=args.quantization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        mixed_prefill_tokens=args.mixed_prefill_tokens,
        max_model_len=args.max_model_len,
        num_kv_blocks=args.num_kv_blocks,
        enable_prefix_caching=not args.no_prefix_caching,
    )
