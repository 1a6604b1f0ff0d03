"""Health, readiness, metrics, the OpenAPI document and the admin API, over real HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway

USER = [{"role": "user", "content": "hi"}]


def test_healthz_and_readyz_report_ok(gateway):
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "policy": "ok"}


def test_readyz_checks_real_redis_when_configured(upstream, tmp_path):
    server, _ = start_gateway(upstream, tmp_path, redis_url="redis://127.0.0.1:6379/0")
    try:
        assert httpx.get(f"{server.url}/readyz").json()["checks"]["redis"] == "ok"
    finally:
        server.stop()


def test_readyz_is_503_when_redis_is_unreachable(upstream, tmp_path):
    server, _ = start_gateway(upstream, tmp_path, redis_url="redis://127.0.0.1:1/0")
    try:
        r = httpx.get(f"{server.url}/readyz", timeout=10)
        assert r.status_code == 503 and r.json()["checks"]["redis"].startswith("error")
    finally:
        server.stop()


def test_metrics_count_requests_by_provider_and_status(gateway):
    gateway.openai().chat.completions.create(model="gpt-test", messages=USER)
    text = httpx.get(f"{gateway.url}/metrics").text
    assert (
        'crossway_requests_total{endpoint="chat.completions",model="gpt-test",provider="openai",status="200"}' in text
    )
    assert 'crossway_upstream_attempts_total{outcome="ok",provider="openai"}' in text


def test_openapi_document_lists_the_public_routes(gateway):
    doc = httpx.get(f"{gateway.url}/openapi/openapi.json").json()
    assert doc["info"]["title"] == "Crossway"
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/embeddings", "/v1/models", "/readyz"):
        assert path in doc["paths"]


def test_admin_creates_a_key_that_works_and_revokes_it(gateway):
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(f"{gateway.url}/admin/keys", json={"tenant": "globex", "name": "ci"}, headers=admin)
    assert created.status_code == 201
    key = created.json()["key"]
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    with client:
        assert client.chat.completions.create(model="gpt-test", messages=USER).choices[0].message.content == "echo: hi"
        listed = httpx.get(f"{gateway.url}/admin/keys", params={"tenant": "globex"}, headers=admin).json()["data"]
        assert [k["prefix"] for k in listed] == [created.json()["prefix"]] and key not in str(listed)
        assert httpx.delete(f"{gateway.url}/admin/keys/{created.json()['id']}", headers=admin).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="gpt-test", messages=USER)
    tenants = httpx.get(f"{gateway.url}/admin/tenants", headers=admin).json()["data"]
    assert {"globex", "acme"} <= {t["name"] for t in tenants}


def test_admin_routes_refuse_tenant_keys(gateway):
    r = httpx.get(f"{gateway.url}/admin/tenants", headers={"authorization": f"Bearer {gateway.key}"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
