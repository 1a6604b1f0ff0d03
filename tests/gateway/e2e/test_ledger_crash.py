"""Crash test of the ledger: a real ``crossway serve`` is SIGKILLed mid-load, then restarted.

The bound under test (``gateway.ledger.writer``): a record is committed within ``flush_interval_s``
(0.25 s) of its request's end plus one batch insert, so after a crash at most the last second of
records can be missing; a committed record is never written twice. The load is bounded in count and
time; the check has a margin (requests answered more than ``BOUND_S`` before the kill), and asserts
nothing about how fast anything ran.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.store.db import Database
from gateway.store.models import UsageRow
from tests.gateway.e2e.conftest import ADMIN_KEY, PROVIDER_KEYS
from tests.gateway.e2e.server import serve_process
from tests.gateway.e2e.test_policy_replicas import POSTGRES, REDIS_URL, _database

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream

BOUND_S = 1.0
"""The documented crash-loss bound: records of requests answered earlier than this before a crash are on disk."""
LOAD_S = 3.0
"""Load runs this long before the kill."""
MAX_REQUESTS = 3000
"""And never more than this many requests in all."""
THREADS = 6

POLICY = """
providers:
  openai: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY}}
routing: {{explore_share: 0}}
models:
  chat: {{targets: [{{provider: openai, model: gpt-4o-mini, price: {{input: 0.15, output: 0.6}}}}]}}
  slow: {{targets: [{{provider: openai, model: slow-40, price: {{input: 0.15, output: 0.6}}}}]}}
"""


@dataclass
class Load:
    """What the clients saw: each answered request id with the monotonic time its answer was complete."""

    answered: dict[str, float] = field(default_factory=dict)
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)


def _serve(workdir: Path, database_url: str, redis_url: str | None) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        **os.environ,
        **PROVIDER_KEYS,
        "DATABASE_URL": database_url,
        "CROSSWAY_POLICY": str(workdir / "policy.yaml"),
        "CROSSWAY_ADMIN_KEY": ADMIN_KEY,
    }
    env.pop("REDIS_URL", None)
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return serve_process(workdir, env)


def _drive(client: openai.OpenAI, load: Load, worker: int) -> None:
    """One client thread: alternate plain, streamed and slow requests until told to stop or the server dies."""
    n = 0
    while not load.stop.is_set():
        with load.lock:
            if load.sent >= MAX_REQUESTS:
                return
            load.sent += 1
        request_id = uuid.uuid4().hex
        model = "slow" if n % 3 == 2 else "chat"
        stream = n % 2 == 1
        n += 1
        try:
            if stream:
                with client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"worker {worker} request {n}"}],
                    stream=True,
                    extra_headers={"x-request-id": request_id},
                ) as chunks:
                    for _ in chunks:
                        pass
            else:
                client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"worker {worker} request {n}"}],
                    extra_headers={"x-request-id": request_id},
                )
        except (openai.APIConnectionError, openai.APIStatusError, httpx.HTTPError):
            return  # the server was killed under us
        done = time.monotonic()
        with load.lock:
            load.answered[request_id] = done


async def _records(database_url: str) -> list[tuple[str, str, int]]:
    async with Database.connect(database_url) as db, db.session() as s:
        rows = (await s.execute(select(UsageRow.id, UsageRow.request_id, UsageRow.status))).all()
    return [(r.id, r.request_id, r.status) for r in rows]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """The database URL (and Redis URL) the killed gateway runs on: a SQLite file, or PostgreSQL with Redis."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'crash.db'}", None
        return
    name = f"crossway_crash_{uuid.uuid4().hex[:10]}"
    asyncio.run(_database(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{POSTGRES}/{name}", REDIS_URL
    finally:
        asyncio.run(_database(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.mark.slow
def test_gateway_killed_mid_load_keeps_every_record_older_than_the_bound_and_none_twice(
    tmp_path: Path, upstream: FakeUpstream, backend: tuple[str, str | None]
):
    database_url, redis_url = backend
    (tmp_path / "policy.yaml").write_text(POLICY.format(url=upstream.url))
    proc, url = _serve(tmp_path, database_url, redis_url)
    load = Load()
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        key = httpx.post(f"{url}/admin/keys", json={"tenant": "acme"}, headers=admin).json()["key"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=10)
        threads = [threading.Thread(target=_drive, args=(client, load, i), daemon=True) for i in range(THREADS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + LOAD_S
        while time.monotonic() < deadline and load.sent < MAX_REQUESTS:
            time.sleep(0.05)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)  # mid-load: no shutdown, no final flush
        proc.wait(timeout=10)
        load.stop.set()
        for t in threads:
            t.join(timeout=15)
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    restarted, url = _serve(tmp_path, database_url, redis_url)  # the same database comes back up and serves
    try:
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        records = asyncio.run(_records(database_url))
    finally:
        restarted.send_signal(signal.SIGINT)
        restarted.wait(timeout=20)

    old_enough = {rid for rid, at in load.answered.items() if at < killed_at - BOUND_S}
    assert len(old_enough) >= 50, "the load did not run long enough to test anything"
    on_disk = Counter(request_id for _, request_id, _ in records)
    missing = old_enough - on_disk.keys()
    assert not missing, f"{len(missing)} of {len(old_enough)} records older than {BOUND_S}s before the kill are lost"
    assert all(status == 200 for _, rid, status in records if rid in old_enough)
    twice = [rid for rid, n in on_disk.items() if n > 1]
    assert not twice, f"request ids recorded more than once: {twice[:5]}"
    assert len({record_id for record_id, _, _ in records}) == len(records)
    # A record whose answer no client saw complete can only be of a request in flight at the kill: one per client.
    unseen = [rid for rid in on_disk if rid not in load.answered]
    assert len(unseen) <= THREADS, unseen
