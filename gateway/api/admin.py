"""Admin routes under ``/admin`` (admin key from ``CROSSWAY_ADMIN_KEY``): tenants and API keys.

Also the two guards every ``/admin`` route starts with: ``require_admin`` (the admin key; the read-only
finance key from ``CROSSWAY_FINANCE_KEY`` gets a 403) and ``require_reader`` (either key).

Owns the HTTP shape of key management; the work is ``gateway.store.keys.KeyStore``'s. A revoke
here takes effect on this replica at once (the authenticator forgets the key) and on others within
``Settings.key_cache_ttl_s``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from gateway.auth import AdminRole, admin_role, bearer_key, check_admin
from gateway.errors import InvalidRequest, NotFound
from gateway.store.keys import ConflictError, KeyInfo, NotFoundError, TenantInfo


class _NewTenant(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class _NewKey(msgspec.Struct, forbid_unknown_fields=True):
    tenant: str
    name: str | None = None


def require_admin(request: Request[Any, Any, Any], state: State) -> None:
    """Let the request through only with the admin key; the read-only finance key gets a 403.

    Every ``/admin`` route that changes something, or reads keys and tenants, starts with this.
    """
    check_admin(_presented(request), state.settings.admin_key, state.settings.finance_key)


def require_reader(request: Request[Any, Any, Any], state: State) -> AdminRole:
    """Let a read-only ``/admin`` request through with the admin key or the finance key.

    Returns:
        Which of the two keys it presented.
    """
    return admin_role(_presented(request), state.settings.admin_key, state.settings.finance_key)


def _presented(request: Request[Any, Any, Any]) -> str | None:
    return bearer_key(request.headers.get("authorization"), request.headers.get("x-api-key"))


def decode_body(body: bytes, kind: type[Any]) -> Any:
    """Decode a JSON admin body into ``kind``; a malformed one is a 400."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Invalid request body: {exc}") from exc


def _tenant(t: TenantInfo) -> dict[str, Any]:
    return {"id": t.id, "name": t.name, "created_at": t.created_at.isoformat(), "active_keys": t.active_keys}


def _key(k: KeyInfo) -> dict[str, Any]:
    return {
        "id": k.id,
        "tenant": k.tenant,
        "name": k.name,
        "prefix": k.prefix,
        "created_at": k.created_at.isoformat(),
        "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
    }


def json_response(obj: Any, status: int = 200) -> Response[bytes]:
    """A JSON response."""
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


@get("/admin/tenants", summary="List tenants")
async def list_tenants(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Every tenant with its number of active keys."""
    require_admin(request, state)
    return json_response({"data": [_tenant(t) for t in await state.key_store.list_tenants()]})


@post("/admin/tenants", summary="Create a tenant")
async def create_tenant(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Create a tenant by name."""
    require_admin(request, state)
    new: _NewTenant = decode_body(await request.body(), _NewTenant)
    try:
        return json_response(_tenant(await state.key_store.create_tenant(new.name)), 201)
    except (ValueError, ConflictError) as exc:
        raise InvalidRequest(str(exc), param="name") from exc


@get("/admin/keys", summary="List API keys")
async def list_keys(
    request: Request[Any, Any, Any], state: State, tenant: FromQuery[str | None] = None
) -> Response[bytes]:
    """Keys (never the secrets), optionally of one tenant."""
    require_admin(request, state)
    return json_response({"data": [_key(k) for k in await state.key_store.list_keys(tenant)]})


@post("/admin/keys", summary="Create an API key")
async def create_key(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Create a key for a tenant (created if missing); the secret is in this response only."""
    require_admin(request, state)
    new: _NewKey = decode_body(await request.body(), _NewKey)
    try:
        info, raw = await state.key_store.create_key(new.tenant, name=new.name)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="tenant") from exc
    return json_response({**_key(info), "key": raw}, 201)


@delete("/admin/keys/{key:str}", status_code=200, summary="Revoke an API key")
async def revoke_key(request: Request[Any, Any, Any], state: State, key: FromPath[str]) -> Response[bytes]:
    """Revoke a key by id or prefix."""
    require_admin(request, state)
    try:
        info = await state.key_store.revoke_key(int(key) if key.isdigit() else key)
    except NotFoundError as exc:
        raise NotFound(str(exc)) from exc
    except ConflictError as exc:
        raise InvalidRequest(str(exc)) from exc
    state.pipeline.auth.forget(info.key_hash)
    return json_response(_key(info))


ROUTES = [list_tenants, create_tenant, list_keys, create_key, revoke_key]
