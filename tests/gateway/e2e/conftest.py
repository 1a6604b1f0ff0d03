"""The real gateway on a loopback port, in front of fake vendor APIs, for SDK-driven tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anthropic
import openai
import pytest

from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.keys import KeyStore
from gateway.store.migrate import migrate
from tests.fakes.upstream import FakeUpstream
from tests.gateway.e2e.server import GatewayServer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

ADMIN_KEY = "admin-test-key"
PROVIDER_KEYS = {"OPENAI_API_KEY": "sk-fake-openai", "ANTHROPIC_API_KEY": "sk-ant-fake", "GEMINI_API_KEY": "gm-fake"}

POLICY = """
providers:
  openai: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY, timeout_s: 2}}
  anthropic: {{kind: anthropic, base_url: "{url}", api_key_env: ANTHROPIC_API_KEY, timeout_s: 2}}
  gemini: {{kind: gemini, base_url: "{url}", api_key_env: GEMINI_API_KEY, timeout_s: 2}}
  dead: {{kind: openai, base_url: "http://127.0.0.1:{dead_port}/v1", api_key_required: false, connect_timeout_s: 1}}
  unconfigured: {{kind: openai, api_key_env: NOT_SET_ANYWHERE}}
  local: {{kind: selfhost, timeout_s: 120, engine: {{max_num_seqs: 8}}}}
models:
  gpt-test: {{targets: [{{provider: openai, model: gpt-4o-mini}}]}}
  claude-test: {{targets: [{{provider: anthropic, model: claude-sonnet-4-5}}]}}
  gemini-test: {{targets: [{{provider: gemini, model: gemini-2.5-flash}}]}}
  embed-test: {{targets: [{{provider: openai, model: text-embedding-3-small}}]}}
  fallback-test: {{targets: [{{provider: openai, model: error-503}}, {{provider: dead, model: m}}, {{provider: anthropic, model: claude-fallback}}]}}
  nowhere-test: {{targets: [{{provider: unconfigured, model: m}}]}}
  smollm2: {{targets: [{{provider: local, model: smollm2}}]}}
routing: {{explore_share: 0, breaker_failures: 1000}}  # deterministic for the wire tests; routing has its own
"""


@dataclass
class Gateway:
    """A running gateway and what tests need to talk to it: one SDK client of each kind, reused."""

    url: str
    key: str
    server: GatewayServer
    upstream: FakeUpstream
    clients: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    def openai(self) -> openai.OpenAI:
        return self._client(openai.OpenAI, base_url=f"{self.url}/v1")

    def anthropic(self) -> anthropic.Anthropic:
        return self._client(anthropic.Anthropic, base_url=self.url)

    def _client(self, kind, **kw):
        for client in self.clients:
            if isinstance(client, kind):
                return client
        client = kind(api_key=self.key, max_retries=0, timeout=20, **kw)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _prepare(url: str) -> str:
    await migrate(url)
    async with Database.connect(url) as db:
        _, raw = await KeyStore(db).create_key("acme", name="e2e")
    return raw


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    fake.start()
    yield fake
    fake.stop()


def start_gateway(
    upstream: FakeUpstream, workdir: Path, policy_text: str | None = None, **overrides: object
) -> tuple[GatewayServer, str]:
    """Migrate a fresh SQLite database, create a key, start a gateway; the caller stops it.

    The policy is ``policy_text`` (default: ``POLICY`` over ``upstream``), written to ``workdir/policy.yaml``.
    """
    url = f"sqlite+aiosqlite:///{workdir / 'gateway.db'}"
    key = asyncio.run(_prepare(url))
    policy = workdir / "policy.yaml"
    policy.write_text(policy_text or POLICY.format(url=upstream.url, dead_port=_free_port()))
    values: dict[str, object] = {
        "database_url": url,
        "policy_path": policy,
        "admin_key": ADMIN_KEY,
        "bootstrap": False,
        "env": PROVIDER_KEYS,
        "max_body_bytes": 1024 * 1024,
    }
    values.update(overrides)
    return GatewayServer(Settings(**values)).start(), key  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    server, key = start_gateway(upstream, tmp_path_factory.mktemp("gateway"))
    gw = Gateway(server.url, key, server, upstream)
    yield gw
    gw.close()
    server.stop()
