"""Anthropic-compatible route: ``POST /v1/messages``, streamed with named SSE events or not.

Errors raised here are rendered in Anthropic's shape by ``gateway.api.errors`` (it picks the
renderer by path); errors after the first streamed byte become an ``error`` event.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.response import Stream

from gateway.api.calls import make_call, respond
from gateway.wire import anthropic as wire


@post("/v1/messages", status_code=200, summary="Create a message (Anthropic wire)")
async def messages(request: Request[Any, Any, Any], state: State) -> Response[bytes] | Stream:
    """Anthropic's Messages API over every configured provider."""
    call = make_call(request, "messages")
    body = await request.body()
    result = await state.pipeline.chat(call, lambda: wire.decode_messages(body))
    return respond(
        request,
        call,
        result,
        f"msg_{call.request_id}",
        wire.encode_response,
        lambda streamed, rid: wire.StreamEncoder(rid, streamed.served_by.target.model),
    )


ROUTES = [messages]
