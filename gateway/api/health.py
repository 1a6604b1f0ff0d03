"""Operational routes: ``/healthz`` (the process is up), ``/readyz`` (it can serve), ``/metrics``.

Owns the readiness checks: the database answers, Redis answers when configured, a policy is loaded.
None of these routes needs an API key, as load balancers and Prometheus expect.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import msgspec
from litestar import Response, get
from litestar.datastructures import State

from gateway.ledger.reports import budget_status
from gateway.obs.metrics import CONTENT_TYPE

_CHECK_TIMEOUT_S = 2.0


@get("/healthz", summary="Liveness", include_in_schema=True)
async def healthz() -> Response[bytes]:
    """Always 200 while the process runs."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@get("/readyz", summary="Readiness")
async def readyz(state: State) -> Response[bytes]:
    """200 when the database, Redis (if configured) and the policy are ready; 503 naming what is not."""
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(state.db.ping(), _CHECK_TIMEOUT_S)
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - readiness reports any failure as "not ready"
        checks["database"] = f"error: {type(exc).__name__}"
    if state.redis is not None:
        try:
            await asyncio.wait_for(state.redis.ping(), _CHECK_TIMEOUT_S)
            checks["redis"] = "ok"
        except Exception as exc:  # noqa: BLE001
            checks["redis"] = f"error: {type(exc).__name__}"
    checks["policy"] = "ok" if state.pipeline.runtime.policy is not None else "error: not loaded"
    ready = all(v == "ok" for v in checks.values())
    body = msgspec.json.encode({"status": "ready" if ready else "not ready", "checks": checks})
    return Response(body, status_code=200 if ready else 503, media_type="application/json")


@get("/metrics", summary="Prometheus metrics")
async def metrics(state: State) -> Response[bytes]:
    """The text exposition format; the budgets' standing is read at each scrape."""
    if state.pipeline.ledger is not None:
        ledger = state.pipeline.ledger
        state.metrics.set_budgets(await budget_status(ledger.limits, ledger.budgets, datetime.now(UTC)))
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


ROUTES = [healthz, readyz, metrics]
