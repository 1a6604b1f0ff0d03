"""The Litestar application: wiring at startup, teardown at shutdown, and ``serve``.

Owns the process's long-lived objects (database, Redis client, the one pooled ``httpx.AsyncClient``,
metrics, the pipeline), built once from ``Settings`` in the lifespan and kept on ``app.state``.
Routes live in their own modules; the OpenAPI document is served at ``/openapi`` (JSON at
``/openapi/openapi.json``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

import httpx
import structlog
from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from redis.asyncio import BlockingConnectionPool, Redis

from gateway.api import admin, anthropic, cache, dashboard, finance, health, openai, policies
from gateway.api.errors import handle_exception
from gateway.auth import Authenticator
from gateway.cache.responses import ResponseCache
from gateway.cache.store import build_store
from gateway.inflight import InFlightShare
from gateway.ledger import build_ledger
from gateway.obs import logging as obs_logging
from gateway.obs.metrics import Metrics
from gateway.pipeline import Pipeline
from gateway.policy import load_policy
from gateway.providers.transport import PooledTransport
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.keys import KeyStore, bootstrap
from gateway.store.policies import PolicyStore
from gateway.watcher import PolicyWatcher

log = structlog.get_logger("gateway.app")

VERSION = "0.1.0"


def create_app(settings: Settings) -> Litestar:
    """Build the app. Nothing connects until the lifespan starts.

    Raises:
        PolicyError: the policy file is invalid (checked now, so a bad file fails before serving).
    """
    policy = load_policy(settings.policy_path, settings.env)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        db = Database.connect(settings.database_url)
        # NOTE: redis-py 8's default pool raises MaxConnectionsError past 100 connections; this one waits.
        redis = (
            Redis.from_pool(BlockingConnectionPool.from_url(settings.redis_url, max_connections=256, timeout=5))
            if settings.redis_url
            else None
        )
        # NOTE: our own pool under httpx (see gateway.providers.transport): httpcore's bookkeeping was
        # half the gateway's CPU. httpx ignores ``limits=`` once a transport is given, so they go there.
        transport = PooledTransport(httpx.Limits(max_connections=1000, max_keepalive_connections=200))
        client = httpx.AsyncClient(transport=transport)
        keys = KeyStore(db)
        metrics = Metrics()
        runtime = Runtime(policy, client, metrics)
        responses = ResponseCache(build_store(settings.redis_url, settings.cache_memory_bytes))
        ledger = build_ledger(db, redis, engines=lambda t: runtime.policy.providers.get(t.provider))
        metrics.watch_ledger(lambda: ledger.writer.pending)
        pipeline = Pipeline(
            settings,
            Authenticator(keys, settings.key_cache_ttl_s),
            runtime,
            metrics,
            responses,
            ledger=ledger if settings.ledger else None,
        )
        policy_store = PolicyStore(db)
        watcher = PolicyWatcher(
            policy_store,
            runtime,
            settings.policy_path.stem,
            settings.env,
            interval_s=settings.policy_poll_s,
            redis=redis,
        )
        app.state.update(
            settings=settings,
            db=db,
            redis=redis,
            key_store=keys,
            metrics=metrics,
            pipeline=pipeline,
            ledger=ledger,
            policy_store=policy_store,
            watcher=watcher,
        )
        await watcher.start(settings.policy_path.parent)  # the stored policy, if newer than the file, wins
        inflight = InFlightShare(redis, runtime.router.stats) if redis is not None else None
        if inflight is not None:
            await inflight.start()
        await ledger.start()
        if raw := await bootstrap(settings, keys):
            print(f"crossway: created tenant 'default' with API key (shown once): {raw}", file=sys.stderr)  # noqa: T201
        log.info(
            "gateway_started",
            policy=runtime.policy.source,
            models=len(policy.models),
            providers=[name for name, p in policy.providers.items() if p.enabled],
        )
        try:
            yield
        finally:
            # NOTE: each close but the ledger's is bounded and each step logged, so a stuck close
            # cannot keep the replica from stopping, and the log names it (InFlightShare.aclose once
            # hung so, on a cancellation swallowed inside a Redis command: see gateway.inflight)
            log.info("gateway_stopping")
            await closing("watcher", watcher.aclose())
            if inflight is not None:
                await closing("inflight", inflight.aclose())
            await closing("runtime", pipeline.runtime.aclose())
            await ledger.aclose()  # after the last request: flushes every usage record, however long it takes
            await closing("response_store", responses.store.aclose())
            await closing("http_client", client.aclose())
            if redis is not None:
                await closing("redis", redis.aclose())
            await closing("database", db.aclose())
            log.info("gateway_stopped")

    return Litestar(
        route_handlers=[
            *openai.ROUTES,
            *anthropic.ROUTES,
            *health.ROUTES,
            *admin.ROUTES,
            *policies.ROUTES,
            *cache.ROUTES,
            *finance.ROUTES,
            *dashboard.ROUTES,
        ],
        lifespan=[lifespan],
        exception_handlers={Exception: handle_exception},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Crossway", version=VERSION, path="/openapi"),
        debug=False,
    )


async def closing(step: str, close: Awaitable[None], seconds: float = 5.0) -> None:
    """Await one shutdown step for at most ``seconds``; one that takes longer is logged, cancelled and left behind.

    Not ``asyncio.wait_for``: on a timeout it waits for the cancellation to finish, which a close
    stuck in a shielded wait would never do. A step's own exception still propagates.
    """
    task = asyncio.ensure_future(close)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        task.result()
        return
    task.cancel()
    log.error("shutdown_step_timed_out", step=step, seconds=seconds)


def from_env() -> Litestar:
    """App factory for uvicorn workers: each worker reads its settings from the environment."""
    return create_app(Settings.from_env())


def serve(settings: Settings, workers: int = 1) -> None:
    """Run the gateway with uvicorn until interrupted.

    With several workers, each is its own process reading ``Settings.from_env()``; the CLI exports its
    overrides to the environment first.
    """
    import uvicorn

    obs_logging.configure(settings.log_level, settings.log_json)
    options = {
        "host": settings.host,
        "port": settings.port,
        "log_level": "warning",
        "access_log": False,
        "loop": "uvloop",
        "http": "httptools",
        "lifespan": "on",
    }
    if workers > 1:
        uvicorn.run("gateway.api.app:from_env", factory=True, workers=workers, **options)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(settings), **options)  # type: ignore[arg-type]
