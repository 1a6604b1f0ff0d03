"""Admin routes of the response cache under ``/admin/cache`` (admin key): statistics and purges.

Owns the HTTP shape only; the work is ``gateway.cache.ResponseCache``'s. Statistics are this
replica's (hits, misses, bypasses, bytes written, money and time saved, per tenant); the store's
size is the store's own figure (shared by every replica when it is Redis). A purge removes entries
from the store, so it reaches every replica at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from litestar import Request, Response, delete, get
from litestar.datastructures import State
from litestar.params import FromPath

from gateway.api.admin import json_response, require_admin
from gateway.cache.responses import ResponseCache


def _admin(request: Request[Any, Any, Any], state: State) -> ResponseCache:
    require_admin(request, state)
    cache: ResponseCache = state.pipeline.cache
    return cache


@get("/admin/cache/stats", summary="Response cache statistics")
async def cache_stats(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Hit rate, bytes and savings per tenant on this replica, and the store's size."""
    cache = _admin(request, state)
    info = await cache.store.info()
    tenants: dict[str, Any] = {}
    for tenant, s in sorted(cache.stats.items()):
        looked_up = s.hits + s.misses
        tenants[tenant or "-"] = {
            **dataclasses.asdict(s),
            "hit_rate": round(s.hits / looked_up, 4) if looked_up else None,
        }
    return json_response(
        {
            "backend": info.backend,
            "available": cache.store.available,
            "entries": info.entries,
            "bytes": info.bytes,
            "max_bytes": info.max_bytes,
            "in_flight": len(cache.flights.flights),
            "shared_in_flight": cache.flights.shared,
            "tenants": tenants,
        }
    )


@delete("/admin/cache/tenants/{tenant:str}", status_code=200, summary="Purge a tenant's cache entries")
async def purge_tenant(request: Request[Any, Any, Any], state: State, tenant: FromPath[str]) -> Response[bytes]:
    """Remove every entry of a tenant (``*`` for entries shared across tenants)."""
    cache = _admin(request, state)
    return json_response({"tenant": tenant, "purged": await cache.purge_tenant(tenant)})


@delete("/admin/cache/entries/{key:str}", status_code=200, summary="Purge one cache entry")
async def purge_entry(request: Request[Any, Any, Any], state: State, key: FromPath[str]) -> Response[bytes]:
    """Remove one entry by the key a response carried in ``x-crossway-cache-key``."""
    cache = _admin(request, state)
    return json_response({"key": key, "purged": await cache.purge_key(key)})


ROUTES = [cache_stats, purge_tenant, purge_entry]
