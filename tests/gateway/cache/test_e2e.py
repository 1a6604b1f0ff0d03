"""The response cache through the real gateway, driven by the official SDKs, against the fake vendors.

Every test uses its own prompt text, so entries of one test never answer another's requests. Upstream
calls are counted at the fake upstream (its recorded requests).
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import TYPE_CHECKING

import anthropic
import httpx
import openai
import pytest

from gateway.settings import Settings
from tests.fakes.upstream import FakeUpstream
from tests.gateway.e2e.conftest import ADMIN_KEY, POLICY, PROVIDER_KEYS, _free_port, _prepare
from tests.gateway.e2e.server import GatewayServer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

CACHE_ON = "cache: {mode: on, ttl_s: 300}\n"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


class Cached:
    """A gateway with the cache on, its fake upstream and its tenant key."""

    def __init__(self, server: GatewayServer, key: str, upstream: FakeUpstream) -> None:
        self.server, self.key, self.upstream = server, key, upstream
        self.url = server.url
        self.openai = openai.OpenAI(api_key=key, base_url=f"{self.url}/v1", max_retries=0, timeout=20)
        self.anthropic = anthropic.Anthropic(api_key=key, base_url=self.url, max_retries=0, timeout=20)

    def calls(self, marker: str) -> int:
        """Upstream requests whose body mentions ``marker``."""
        return sum(1 for r in self.upstream.requests if marker in str(r.body))

    def post(self, body: dict, key: str | None = None, **headers: str) -> httpx.Response:
        auth = {"authorization": f"Bearer {key or self.key}", **headers}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=auth, timeout=20)


def _start(upstream: FakeUpstream, workdir: Path, policy_tail: str, **overrides: object) -> tuple[GatewayServer, str]:
    """``start_gateway`` of the e2e suite with ``policy_tail`` appended to its policy."""
    url = f"sqlite+aiosqlite:///{workdir / 'gateway.db'}"
    key = asyncio.run(_prepare(url))
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY.format(url=upstream.url, dead_port=_free_port()) + policy_tail)
    values: dict[str, object] = {
        "database_url": url,
        "policy_path": policy,
        "admin_key": ADMIN_KEY,
        "bootstrap": False,
        "env": PROVIDER_KEYS,
    }
    values.update(overrides)
    return GatewayServer(Settings(**values)).start(), key  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cached]:
    fake = FakeUpstream().start()
    server, key = _start(fake, tmp_path_factory.mktemp("cache"), CACHE_ON)
    gw = Cached(server, key, fake)
    yield gw
    gw.openai.close()
    gw.anthropic.close()
    server.stop()
    fake.stop()


def _marker() -> str:
    return f"m-{uuid.uuid4().hex[:12]}"


def test_second_identical_request_is_a_hit_with_the_same_answer_and_no_upstream_call(cached):
    marker = _marker()
    kw = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "temperature": 0}
    first = cached.openai.chat.completions.with_raw_response.create(**kw)
    second = cached.openai.chat.completions.with_raw_response.create(**kw)
    assert first.headers["x-crossway-cache"] == "miss" and second.headers["x-crossway-cache"] == "hit"
    assert int(second.headers["x-crossway-cache-age"]) >= 0
    a, b = first.parse(), second.parse()
    assert b.choices[0].message.content == a.choices[0].message.content == f"echo: {marker}"
    assert b.usage == a.usage
    assert cached.calls(marker) == 1


def test_streamed_replay_through_the_openai_sdk_reproduces_content_and_usage(cached):
    marker = _marker()
    kw = {
        "model": "claude-test",
        "messages": [{"role": "user", "content": f"{marker} one two three"}],
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def run() -> tuple[str, object, str]:
        with cached.openai.chat.completions.with_streaming_response.create(**kw) as raw:
            chunks = list(raw.parse())
            outcome = raw.headers["x-crossway-cache"]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage, outcome

    first, second = run(), run()
    assert (first[2], second[2]) == ("miss", "hit")
    assert second[0] == first[0] == f"echo: {marker} one two three"
    assert second[1] == first[1] and first[1] is not None and first[1].completion_tokens > 0
    assert cached.calls(marker) == 1


def test_streamed_replay_through_the_anthropic_sdk_reproduces_content_and_usage(cached):
    marker = _marker()
    kw = {"model": "gpt-test", "max_tokens": 50, "messages": [{"role": "user", "content": marker}]}
    kw["extra_body"] = {"temperature": 0}  # this SDK version no longer takes it as an argument

    def run() -> tuple[str, object, str]:
        with cached.anthropic.messages.with_streaming_response.create(stream=True, **kw) as raw:
            outcome = raw.headers["x-crossway-cache"]
            events = list(raw.parse())
        text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
        usage = next(e.usage for e in events if e.type == "message_delta")
        return text, usage, outcome

    first, second = run(), run()
    assert (first[2], second[2]) == ("miss", "hit")
    assert second[0] == first[0] == f"echo: {marker}"
    assert second[1] == first[1]
    assert cached.calls(marker) == 1


def test_a_streamed_and_a_non_streamed_request_are_separate_entries(cached):
    marker = _marker()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "temperature": 0}
    assert cached.post(body).headers["x-crossway-cache"] == "miss"
    with httpx.stream(
        "POST",
        f"{cached.url}/v1/chat/completions",
        json={**body, "stream": True},
        headers={"authorization": f"Bearer {cached.key}"},
        timeout=20,
    ) as r:
        assert r.headers["x-crossway-cache"] == "miss"
        r.read()
    assert cached.calls(marker) == 2


def test_fifty_concurrent_identical_requests_make_exactly_one_upstream_call(cached):
    marker = _marker()
    body = {"model": "openai/slow-300", "messages": [{"role": "user", "content": marker}], "temperature": 0}

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            auth = {"authorization": f"Bearer {cached.key}"}
            url = f"{cached.url}/v1/chat/completions"
            return await asyncio.gather(*(client.post(url, json=body, headers=auth) for _ in range(50)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 50
    assert {r.json()["choices"][0]["message"]["content"] for r in responses} == {f"echo: {marker}"}
    outcomes = sorted(r.headers["x-crossway-cache"] for r in responses)
    assert outcomes == ["hit"] * 49 + ["miss"]
    assert cached.calls(marker) == 1


def test_an_upstream_failure_is_never_cached(cached):
    marker = _marker()
    body = {"model": "openai/error-503", "messages": [{"role": "user", "content": marker}], "temperature": 0}
    assert cached.post(body).status_code == 503
    first = cached.calls(marker)  # with the routing policy's retries
    second = cached.post(body)
    assert second.status_code == 503 and "x-crossway-cache" not in second.headers
    assert first >= 1 and cached.calls(marker) == 2 * first  # the second went upstream just the same


def test_tenants_never_share_entries(cached):
    created = httpx.post(f"{cached.url}/admin/keys", json={"tenant": f"t-{_marker()}"}, headers=ADMIN, timeout=10)
    other_key = created.json()["key"]
    marker = _marker()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "seed": 1}
    assert cached.post(body).headers["x-crossway-cache"] == "miss"
    assert cached.post(body, key=other_key).headers["x-crossway-cache"] == "miss"
    assert cached.post(body, key=other_key).headers["x-crossway-cache"] == "hit"
    assert cached.calls(marker) == 2


def test_bypass_and_refresh_headers_skip_the_cache_per_request(cached):
    marker = _marker()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "temperature": 0}
    assert cached.post(body).headers["x-crossway-cache"] == "miss"
    assert cached.post(body, **{"x-crossway-cache": "bypass"}).headers["x-crossway-cache"] == "bypass"
    assert cached.post(body, **{"x-crossway-cache": "refresh"}).headers["x-crossway-cache"] == "refresh"
    assert cached.post(body).headers["x-crossway-cache"] == "hit"
    assert cached.calls(marker) == 3


def test_non_deterministic_requests_bypass_the_cache_by_default(cached):
    marker = _marker()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "temperature": 0.8}
    assert [cached.post(body).headers["x-crossway-cache"] for _ in range(2)] == ["bypass", "bypass"]
    assert cached.calls(marker) == 2


def test_admin_stats_count_hits_and_purge_by_key_and_tenant_forgets_entries(cached):
    marker = _marker()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "temperature": 0}
    key = cached.post(body).headers["x-crossway-cache-key"]
    assert cached.post(body).headers["x-crossway-cache"] == "hit"
    stats = httpx.get(f"{cached.url}/admin/cache/stats", headers=ADMIN, timeout=10).json()
    assert stats["backend"] == "memory" and stats["entries"] >= 1 and stats["bytes"] > 0
    assert stats["tenants"]["acme"]["hits"] >= 1 and stats["tenants"]["acme"]["hit_rate"] > 0
    purged = httpx.delete(f"{cached.url}/admin/cache/entries/{key}", headers=ADMIN, timeout=10).json()
    assert purged["purged"] == 1
    assert cached.post(body).headers["x-crossway-cache"] == "miss"
    assert httpx.delete(f"{cached.url}/admin/cache/tenants/acme", headers=ADMIN, timeout=10).json()["purged"] >= 1
    assert cached.post(body).headers["x-crossway-cache"] == "miss"
    assert httpx.get(f"{cached.url}/admin/cache/stats", timeout=10).status_code in (401, 403)


def test_anthropic_upstream_receives_cache_control_on_a_long_system_prompt(cached):
    marker = _marker()
    system = f"{marker} You answer questions about the attached handbook. " + "Rule. " * 1000
    cached.openai.chat.completions.create(
        model="claude-test", messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
    )
    sent = next(r for r in reversed(cached.upstream.requests) if marker in str(r.body))
    assert sent.body["system"] == [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_redis_down_means_bypass_and_the_request_still_succeeds(tmp_path):
    fake = FakeUpstream().start()
    try:
        server, key = _start(fake, tmp_path, CACHE_ON, redis_url=f"redis://127.0.0.1:{_closed_port()}/0")
        try:
            gw = Cached(server, key, fake)
            body = {"model": "gpt-test", "messages": [{"role": "user", "content": "redis down"}], "temperature": 0}
            responses = [gw.post(body) for _ in range(2)]
            gw.openai.close()
            gw.anthropic.close()
        finally:
            server.stop()
    finally:
        fake.stop()
    assert [r.status_code for r in responses] == [200, 200]
    assert [r.headers["x-crossway-cache"] for r in responses] == ["bypass", "bypass"]
    assert responses[0].json()["choices"][0]["message"]["content"] == "echo: redis down"


def test_entries_are_shared_between_gateways_through_redis(tmp_path):
    fake = FakeUpstream().start()
    marker = _marker()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": marker}], "temperature": 0}
    servers = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            servers.append(_start(fake, tmp_path / name, CACHE_ON, redis_url="redis://127.0.0.1:6379/0"))
        (a, key_a), (b, key_b) = servers
        # two databases, two keys, one tenant name ("acme"): the replicas share the tenant's entries
        first = httpx.post(f"{a.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key_a}"})
        second = httpx.post(f"{b.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key_b}"})
        httpx.delete(f"{b.url}/admin/cache/entries/{second.headers['x-crossway-cache-key']}", headers=ADMIN)
    finally:
        for server, _ in servers:
            server.stop()
        fake.stop()
    assert (first.headers["x-crossway-cache"], second.headers["x-crossway-cache"]) == ("miss", "hit")
    assert second.json()["choices"][0]["message"]["content"] == f"echo: {marker}"
    assert sum(1 for r in fake.requests if marker in str(r.body)) == 1
