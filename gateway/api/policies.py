"""Admin routes for routing policies: list, read, validate, save, history, rollback, explain.

Listing, reading and history take the admin key or the read-only finance key; the rest only the admin key.

Owns the HTTP shape of policy administration. Saving validates first (a policy that does not compile
is a 400 naming the file, key path and problem, and nothing is stored), then appends a version
(``gateway.store.policies``); saving the policy this gateway serves puts it in force here at once and
tells the other replicas (``gateway.watcher``). ``POST /admin/route/explain`` shows what the router
would do with a chat request (OpenAI wire) right now, candidate by candidate.

A save's body is JSON ``{"body": "<yaml>", "comment": "...", "author": "..."}`` or the YAML itself
(``Content-Type: application/yaml``, author and comment in ``x-crossway-author`` /
``x-crossway-comment``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get, post, put
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from gateway.api.admin import decode_body, json_response, require_admin, require_reader
from gateway.errors import InvalidRequest, NotFound
from gateway.policy import PolicyError, parse_policy
from gateway.store.keys import NotFoundError
from gateway.wire import openai as wire

if TYPE_CHECKING:
    from gateway.policy import Policy
    from gateway.router import Candidate
    from gateway.store.policies import PolicyInfo

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class _Save(msgspec.Struct, forbid_unknown_fields=True):
    body: str
    comment: str | None = None
    author: str | None = None


class _Rollback(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    author: str | None = None


def _info(p: PolicyInfo, *, body: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": p.name,
        "version": p.version,
        "author": p.author,
        "comment": p.comment,
        "created_at": p.created_at.isoformat(),
        "diff": p.diff,
    }
    if body:
        out["body"] = p.body
    return out


def _name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidRequest(
            f"Invalid policy name {name!r}: lowercase letters, digits, '.', '_' and '-', at most 64.", param="name"
        )
    return name


async def _submitted(request: Request[Any, Any, Any]) -> _Save:
    raw = await request.body()
    if "yaml" in request.headers.get("content-type", ""):
        text = raw.decode("utf-8", errors="replace")
        return _Save(text, request.headers.get("x-crossway-comment"), request.headers.get("x-crossway-author"))
    save: _Save = decode_body(raw, _Save)
    return save


def _compile(state: State, text: str, source: str) -> Policy:
    try:
        return parse_policy(text, state.settings.env, source=source)
    except PolicyError as exc:
        raise InvalidRequest(str(exc), param="body", code="invalid_policy") from exc


@get("/admin/policies", summary="List policies")
async def list_policies(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """The newest version of every stored policy, and which one this gateway serves."""
    require_reader(request, state)
    live = state.pipeline.runtime.live
    return json_response(
        {
            "serving": {"name": state.watcher.name, "version": live.version},
            "data": [_info(p, body=False) for p in await state.policy_store.names()],
        }
    )


@get("/admin/policies/{name:str}", summary="Read a policy")
async def read_policy(
    request: Request[Any, Any, Any], state: State, name: FromPath[str], version: FromQuery[int | None] = None
) -> Response[bytes]:
    """The newest version of a policy, or ``?version=N``."""
    require_reader(request, state)
    try:
        info = await state.policy_store.get(name, version) if version else await state.policy_store.latest(name)
    except NotFoundError as exc:
        raise NotFound(str(exc)) from exc
    if info is None:
        raise NotFound(f"no policy named {name!r}")
    return json_response(_info(info))


@get("/admin/policies/{name:str}/history", summary="A policy's versions")
async def policy_history(request: Request[Any, Any, Any], state: State, name: FromPath[str]) -> Response[bytes]:
    """Every version, newest first, with author, time, comment and diff."""
    require_reader(request, state)
    try:
        return json_response({"data": [_info(p, body=False) for p in await state.policy_store.history(name)]})
    except NotFoundError as exc:
        raise NotFound(str(exc)) from exc


@post("/admin/policies/validate", status_code=200, summary="Validate a policy")
async def validate_policy(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Compile a policy without saving it: 200 with a summary, or 400 naming the key path and problem."""
    require_admin(request, state)
    policy = _compile(state, (await _submitted(request)).body, "<submitted>")
    return json_response({"valid": True, "models": sorted(policy.models), "slo_classes": sorted(policy.slo_classes)})


@put("/admin/policies/{name:str}", summary="Create or update a policy")
async def save_policy(request: Request[Any, Any, Any], state: State, name: FromPath[str]) -> Response[bytes]:
    """Validate and save as the next version; the served policy takes effect at once on every replica."""
    require_admin(request, state)
    save = await _submitted(request)
    _compile(state, save.body, _name(name))
    info = await state.policy_store.save(name, save.body, save.author or "admin", save.comment)
    await _follow(state, name)
    return json_response(_info(info), 201 if info.version == 1 else 200)


@post("/admin/policies/{name:str}/rollback", status_code=200, summary="Roll a policy back")
async def rollback_policy(request: Request[Any, Any, Any], state: State, name: FromPath[str]) -> Response[bytes]:
    """Save an earlier version's text as the newest version."""
    require_admin(request, state)
    rollback: _Rollback = decode_body(await request.body(), _Rollback)
    try:
        old = await state.policy_store.get(name, rollback.version)
    except NotFoundError as exc:
        raise NotFound(str(exc)) from exc
    _compile(state, old.body, f"{name}@{rollback.version}")
    info = await state.policy_store.rollback(name, rollback.version, rollback.author or "admin")
    await _follow(state, name)
    return json_response(_info(info))


async def _follow(state: State, name: str) -> None:
    if name == state.watcher.name:
        await state.watcher.check()
        await state.watcher.announce()


@post("/admin/route/explain", status_code=200, summary="Explain a routing decision")
async def explain_route(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Each candidate's predicted TTFT, TPOT and cost for a chat request, and why it was chosen or dropped.

    Headers: ``x-crossway-tenant`` (whose overrides apply) and ``x-crossway-slo`` (the SLO class).
    """
    require_admin(request, state)
    chat = wire.decode_chat(await request.body())
    plan, decision = state.pipeline.explain(
        chat, request.headers.get("x-crossway-tenant"), request.headers.get("x-crossway-slo")
    )
    return json_response(
        {
            "model": plan.alias,
            "slo_class": plan.slo.name,
            "policy_version": state.pipeline.runtime.live.version,
            "reason": decision.reason,
            "order": [t.key for t in decision.order],
            "candidates": [_candidate(c) for c in decision.candidates],
        }
    )


def _candidate(c: Candidate) -> dict[str, Any]:
    return {
        "deployment": c.target.key,
        "predicted_ttft_ms": round(c.ttft_s * 1000, 3),
        "predicted_tpot_ms": round(c.tpot_s * 1000, 3),
        "cost_usd": c.cost_usd,
        "p_meet_slo": round(c.p_meet, 4),
        "usable": c.usable,
        "qualified": c.qualified,
        "reason": c.reason,
    }


ROUTES = [
    list_policies,
    validate_policy,
    read_policy,
    policy_history,
    save_policy,
    rollback_policy,
    explain_route,
]
