"""Two gateway processes sharing PostgreSQL and Redis: a policy edit made on one is in force on both,
and a deployment's concurrency cap counts the requests of both.

Each test run gets its own PostgreSQL database (created and dropped here) so that migrations and
policy versions never meet another run's. The gateways are real ``crossway serve`` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import asyncpg
import httpx
import openai
import pytest

from tests.gateway.e2e.conftest import ADMIN_KEY, PROVIDER_KEYS
from tests.gateway.e2e.server import serve_process, stop_processes

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream

POSTGRES = os.environ.get("CROSSWAY_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("CROSSWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

POLICY = """
providers:
  openai: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY}}
  anthropic: {{kind: anthropic, base_url: "{url}", api_key_env: ANTHROPIC_API_KEY}}
routing: {{explore_share: 0}}
models:
  chat:
    targets:
      - {first}
      - {{provider: anthropic, model: claude-haiku-4-5, price: {{input: 1, output: 5}}}}
"""


def _policy(url: str, openai_price: float = 0.1, model: str = "gpt-4o-mini", cap: str = "") -> str:
    """The shared policy: ``chat`` on OpenAI's ``model`` first (``cap``: a max_concurrency entry), then Anthropic."""
    first = f"{{provider: openai, model: {model}, price: {{input: {openai_price}, output: {openai_price}}}{cap}}}"
    return POLICY.format(url=url, first=first)


async def _database(statement: str) -> None:
    conn = await asyncpg.connect(f"{POSTGRES}/test")
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def shared_database() -> Iterator[str]:
    name = f"crossway_replicas_{uuid.uuid4().hex[:10]}"
    asyncio.run(_database(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        asyncio.run(_database(f'DROP DATABASE "{name}" WITH (FORCE)'))


def _serve(tmp_path: Path, database_url: str, policy: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        **os.environ,
        **PROVIDER_KEYS,
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "CROSSWAY_POLICY": str(policy),
        "CROSSWAY_ADMIN_KEY": ADMIN_KEY,
        "CROSSWAY_POLICY_POLL_S": "30",  # so that only the Redis announcement can explain a quick switch
    }
    return serve_process(tmp_path, env)


def _served(client: openai.OpenAI) -> str:
    raw = client.chat.completions.with_raw_response.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    return raw.headers["x-crossway-deployment"]


@contextlib.contextmanager
def _two_replicas(tmp_path: Path, database_url: str, policy: Path) -> Iterator[tuple[str, str, list[openai.OpenAI]]]:
    """Two gateway processes on one policy file, and an OpenAI client of one tenant on each; stopped after."""
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[openai.OpenAI] = []
    try:
        urls = []
        for _ in range(2):
            proc, url = _serve(tmp_path, database_url, policy)
            procs.append(proc)
            urls.append(url)
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        key = httpx.post(f"{urls[0]}/admin/keys", json={"tenant": "acme"}, headers=admin).json()["key"]
        clients = [openai.OpenAI(base_url=f"{u}/v1", api_key=key, max_retries=0) for u in urls]
        yield urls[0], urls[1], clients
    finally:
        for client in clients:
            client.close()
        # a replica that hangs is made to print its threads' stacks, then killed and reaped, so it
        # fails this test only (seen once, 2026-11-26: left running, its Popen's finaliser warned in
        # whichever test came next)
        hung = stop_processes(procs)
        assert not hung, f"gateway replicas did not stop within 20 s of SIGINT; their stderr ends: {hung}"


def test_policy_edit_on_one_replica_takes_effect_on_the_other(
    tmp_path: Path, upstream: FakeUpstream, shared_database: str
):
    policy = tmp_path / "shared.yaml"
    policy.write_text(_policy(upstream.url))
    with _two_replicas(tmp_path, shared_database, policy) as (a, b, clients):
        assert [_served(c) for c in clients] == ["openai/gpt-4o-mini"] * 2
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        saved = httpx.put(
            f"{a}/admin/policies/shared",
            json={"body": _policy(upstream.url, openai_price=50), "author": "ops"},
            headers=admin,
        )
        assert saved.status_code == 200, saved.text
        assert _served(clients[0]) == "anthropic/claude-haiku-4-5"  # the replica that saved: at once
        deadline = time.monotonic() + 5  # the other: as soon as the Redis announcement arrives
        while httpx.get(f"{b}/admin/policies", headers=admin).json()["serving"]["version"] != 2:
            assert time.monotonic() < deadline, "the second replica never took the edit"
            time.sleep(0.05)
        assert _served(clients[1]) == "anthropic/claude-haiku-4-5"


def test_a_concurrency_cap_counts_the_requests_of_every_replica(
    tmp_path: Path, upstream: FakeUpstream, shared_database: str
):
    policy = tmp_path / "capped.yaml"
    policy.write_text(_policy(upstream.url, model="slow-1500", cap=", max_concurrency: 1"))
    with _two_replicas(tmp_path, shared_database, policy) as (_, _, clients), ThreadPoolExecutor(1) as pool:
        held = pool.submit(_served, clients[0])  # the cheap deployment's one slot, for 1.5 s, on replica a
        deadline = time.monotonic() + 5
        while not any(r.body and r.body.get("model") == "slow-1500" for r in upstream.requests):
            assert time.monotonic() < deadline, "the first request never reached the upstream"
            time.sleep(0.02)
        time.sleep(0.4)  # replica b reads a's count at its next sync (every 0.1 s)
        assert _served(clients[1]) == "anthropic/claude-haiku-4-5"  # per replica, b would have taken it
        assert held.result(timeout=10) == "openai/slow-1500"
        time.sleep(0.4)  # a's request ended: b reads the slot free again
        assert _served(clients[1]) == "openai/slow-1500"
