"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/models``.

Each handler names the call, hands the body's decoder to the pipeline and encodes what comes back.
Errors raised here are rendered by ``gateway.api.errors``; errors after the first streamed byte
become an error chunk.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath
from litestar.response import Stream

from gateway.api.calls import make_call, respond, served_headers
from gateway.errors import UnknownModel
from gateway.types import EmbeddingRequest
from gateway.wire import openai as wire

_CREATED = int(time.time())


@post("/v1/chat/completions", status_code=200, summary="Create a chat completion (OpenAI wire)")
async def chat_completions(request: Request[Any, Any, Any], state: State) -> Response[bytes] | Stream:
    """OpenAI's Chat Completions API, streamed (SSE) or not, over every configured provider."""
    call = make_call(request, "chat.completions")
    body = await request.body()
    result = await state.pipeline.chat(call, lambda: wire.decode_chat(body))
    return respond(
        request,
        call,
        result,
        f"chatcmpl-{call.request_id}",
        wire.encode_response,
        lambda s, rid: wire.StreamEncoder(rid, s.served_by.target.model, s.request.stream_usage),
    )


@post("/v1/embeddings", status_code=200, summary="Create embeddings (OpenAI wire)")
async def embeddings(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """OpenAI's Embeddings API; ``encoding_format`` float or base64."""
    call = make_call(request, "embeddings")
    body = await request.body()
    fmt: list[Literal["float", "base64"]] = []

    def decode() -> EmbeddingRequest:
        req, encoding = wire.decode_embeddings(body)
        fmt.append(encoding)
        return req

    response, served_by = await state.pipeline.embed(call, decode)
    return Response(
        wire.encode_embeddings(response, fmt[0]), media_type="application/json", headers=served_headers(call, served_by)
    )


@get("/v1/models", summary="List models")
async def list_models(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """The model aliases this key can use."""
    call = make_call(request, "models")
    models = await state.pipeline.models(call)
    return Response(wire.encode_models(models, _CREATED), media_type="application/json")


@get("/v1/models/{model:path}", summary="Retrieve a model")
async def retrieve_model(request: Request[Any, Any, Any], state: State, model: FromPath[str]) -> Response[bytes]:
    """One model alias."""
    call = make_call(request, "models")
    model = model.lstrip("/")
    for alias, owner in await state.pipeline.models(call):
        if alias == model:
            return Response(wire.encode_model(alias, owner, _CREATED), media_type="application/json")
    raise UnknownModel(
        f"The model `{model}` does not exist or you do not have access to it.", param="model", code="model_not_found"
    )


ROUTES = [chat_completions, embeddings, list_models, retrieve_model]
