"""The finance API and the limits, through the real gateway over HTTP."""

from __future__ import annotations

import csv
import io
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream
    from tests.gateway.e2e.server import GatewayServer

MSGS = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def gateway(upstream: FakeUpstream, tmp_path: Path) -> Iterator[tuple[GatewayServer, str, httpx.Client]]:
    server, key = start_gateway(upstream, tmp_path)
    admin = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    try:
        yield server, key, admin
    finally:
        admin.close()
        server.stop()


def _spend(admin: httpx.Client, group_by: str, requests: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 5
    while True:  # records are written behind the responses, within the flush interval
        data = admin.get("/admin/finance/spend", params={"group_by": group_by}).raise_for_status().json()["data"]
        if sum(r["requests"] for r in data) >= requests or time.monotonic() > deadline:
            return data
        time.sleep(0.05)


def test_finance_reports_spend_csv_and_goodput_priced_by_version(gateway) -> None:
    server, key, admin = gateway
    created = admin.post(
        "/admin/finance/prices", json={"deployment": "openai/gpt-4o-mini", "input": 1.0, "output": 2.0}
    )
    assert created.status_code == 201
    client = openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0)
    try:
        answers = [client.chat.completions.create(model="gpt-test", messages=MSGS) for _ in range(2)]
        chunks = list(
            client.chat.completions.create(
                model="gpt-test", messages=MSGS, stream=True, stream_options={"include_usage": True}
            )
        )
    finally:
        client.close()
    usage = [a.usage for a in answers] + [chunks[-1].usage]
    expected_nanos = sum(round(u.prompt_tokens * 1.0 * 1000) + round(u.completion_tokens * 2.0 * 1000) for u in usage)
    (row,) = _spend(admin, "tenant,model,provider,day", 3)
    assert (row["tenant"], row["model"], row["provider"], row["requests"]) == ("acme", "gpt-test", "openai", 3)
    assert row["output_tokens"] == sum(u.completion_tokens for u in usage if u is not None)
    assert row["cost_usd"] == pytest.approx(expected_nanos / 1e9, abs=1e-12)
    exported = admin.get("/admin/finance/spend.csv", params={"group_by": "tenant,model"})
    assert exported.headers["content-type"].startswith("text/csv")
    (line,) = list(csv.DictReader(io.StringIO(exported.text)))
    assert (line["tenant"], line["model"], line["requests"]) == ("acme", "gpt-test", "3")
    assert float(line["cost_usd"]) == pytest.approx(expected_nanos / 1e9, abs=1e-9)
    (good,) = admin.get("/admin/finance/goodput").raise_for_status().json()["data"]
    assert (good["tenant"], good["deployment"], good["requests"]) == ("acme", "openai/gpt-4o-mini", 3)
    assert good["slo_met_share"] == 1.0  # no objectives in this policy: every served request meets its class
    metrics = admin.get("/metrics").text
    spent = [line for line in metrics.splitlines() if line.startswith('crossway_cost_usd_total{kind="spent"')]
    assert [line.split()[0] for line in spent] == [
        'crossway_cost_usd_total{kind="spent",provider="openai",tenant="acme"}'
    ]
    assert float(spent[0].split()[1]) == pytest.approx(expected_nanos / 1e9, rel=1e-9)
    ttft = [line for line in metrics.splitlines() if line.startswith("crossway_slo_latency_seconds_count{")]
    # only the streamed request has a TTFT; the goodput report's percentiles come from the same records
    assert [line.split()[1] for line in ttft if 'kind="ttft"' in line and 'tenant="acme"' in line] == ["1.0"]
    assert all('deployment="openai/gpt-4o-mini"' in line for line in ttft)


def test_hard_budget_rejects_with_402_and_budget_status_shows_spend(gateway) -> None:
    server, key, admin = gateway
    admin.post("/admin/finance/prices", json={"deployment": "openai/gpt-4o-mini", "input": 1000.0, "output": 1000.0})
    # one request reserves (prompt + 100 output tokens) * $1000 per million = about $0.11
    admin.put("/admin/finance/limits", json={"tenant": "acme", "budget_hard_usd": 0.2}).raise_for_status()
    statuses = []
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}) as client:
        body = {"model": "gpt-test", "messages": MSGS, "max_tokens": 100}
        for _ in range(40):  # each request spends about $0.01 of its $0.11 reservation
            response = client.post("/v1/chat/completions", json=body)
            statuses.append(response.status_code)
            if response.status_code != 200:
                break
    assert statuses[0] == 200
    assert statuses[-1] == 402
    assert response.json()["error"]["type"] == "insufficient_quota"
    (status,) = admin.get("/admin/finance/budgets").raise_for_status().json()["data"]
    assert status["tenant"] == "acme"
    assert 0 < status["spent_usd"] <= 0.2
    assert status["reserved_usd"] == 0
    gauges = {
        line.split()[0]: float(line.split()[1])
        for line in admin.get("/metrics").text.splitlines()
        if line.startswith("crossway_budget_usd{")
    }
    assert gauges == {
        'crossway_budget_usd{key_id="",kind="spent",tenant="acme"}': pytest.approx(status["spent_usd"]),
        'crossway_budget_usd{key_id="",kind="reserved",tenant="acme"}': 0.0,
        'crossway_budget_usd{key_id="",kind="hard_limit",tenant="acme"}': 0.2,
    }


def test_rate_limit_answers_429_with_retry_after(gateway) -> None:
    server, key, admin = gateway
    admin.put("/admin/finance/limits", json={"tenant": "acme", "rpm": 2}).raise_for_status()
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}) as client:
        body = {"model": "gpt-test", "messages": MSGS}
        assert [client.post("/v1/chat/completions", json=body).status_code for _ in range(2)] == [200, 200]
        limited = client.post("/v1/chat/completions", json=body)
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limit_requests"
