"""Requests refused before admission completes leave a usage record too (issue 6: "successful or failed").

Through the real gateway: a rate-limited (429), over-budget (402), unknown-model (404), forbidden-model
(403) and malformed (400) request of a known tenant each get a record with its status and error kind,
zero tokens and zero cost, and the spend report counts them as failed. A request without a valid key
(401) has no tenant to charge and gets none.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from gateway.ledger.reports import spend
from gateway.store.db import Database
from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway
from tests.gateway.ledger.helpers import rows

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream

POLICY = """
providers:
  openai: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY, timeout_s: 2}}
models:
  gpt-test: {{targets: [{{provider: openai, model: gpt-4o-mini, price: {{input: 1, output: 2}}}}]}}
  secret-test: {{targets: [{{provider: openai, model: gpt-4o-mini, price: {{input: 1, output: 2}}}}]}}
tenants:
  acme: {{allowed_models: [gpt-test]}}
"""
MSGS = [{"role": "user", "content": "hello there"}]


async def _records_and_report(url: str) -> tuple[list, list]:
    async with Database.connect(url) as db:
        now = datetime.now(UTC)
        return await rows(db), await spend(db, now - timedelta(hours=1), now + timedelta(hours=1), ["tenant"])


def test_refused_requests_are_recorded_with_status_and_error_and_counted_failed(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    server, acme = start_gateway(upstream, tmp_path, POLICY.format(url=upstream.url))
    try:
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
            limited = admin.post("/admin/keys", json={"tenant": "limited"}).raise_for_status().json()["key"]
            broke = admin.post("/admin/keys", json={"tenant": "broke"}).raise_for_status().json()["key"]
            admin.put("/admin/finance/limits", json={"tenant": "limited", "rpm": 1}).raise_for_status()
            admin.put("/admin/finance/limits", json={"tenant": "broke", "budget_hard_usd": 1e-6}).raise_for_status()

        def client(key: str) -> openai.OpenAI:
            return openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0)

        with client(acme) as c:
            c.chat.completions.create(model="gpt-test", messages=MSGS, extra_headers={"x-request-id": "acme-ok"})
            with pytest.raises(openai.NotFoundError):
                c.chat.completions.create(model="no-such", messages=MSGS, extra_headers={"x-request-id": "acme-404"})
            with pytest.raises(openai.PermissionDeniedError):
                c.chat.completions.create(
                    model="secret-test", messages=MSGS, extra_headers={"x-request-id": "acme-403"}
                )
        bad = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "gpt-test", "messages": "not a list"},
            headers={"authorization": f"Bearer {acme}", "x-request-id": "acme-400"},
        )
        assert bad.status_code == 400
        with client(limited) as c:
            c.chat.completions.create(model="gpt-test", messages=MSGS, extra_headers={"x-request-id": "limited-ok"})
            with pytest.raises(openai.RateLimitError):
                c.chat.completions.create(
                    model="gpt-test", messages=MSGS, extra_headers={"x-request-id": "limited-429"}
                )
        with client(broke) as c, pytest.raises(openai.APIStatusError) as over:
            c.chat.completions.create(model="gpt-test", messages=MSGS, extra_headers={"x-request-id": "broke-402"})
        assert over.value.status_code == 402
        with client("cw-not-a-key") as c, pytest.raises(openai.AuthenticationError):
            c.chat.completions.create(model="gpt-test", messages=MSGS, extra_headers={"x-request-id": "nobody-401"})
    finally:
        server.stop()  # a graceful stop flushes every record

    records, report = asyncio.run(_records_and_report(server.settings.database_url))
    by_id = {r.request_id: r for r in records}
    assert "nobody-401" not in by_id
    refused = {
        "acme-404": ("acme", 404, "UnknownModel", "no-such"),
        "acme-403": ("acme", 403, "PermissionDenied", "secret-test"),
        "acme-400": ("acme", 400, "InvalidRequest", ""),
        "limited-429": ("limited", 429, "RateLimited", "gpt-test"),
        "broke-402": ("broke", 402, "BudgetExceeded", "gpt-test"),
    }
    for request_id, (tenant, status, error, alias) in refused.items():
        r = by_id[request_id]
        assert (r.tenant, r.status, r.error, r.alias) == (tenant, status, error, alias), request_id
        assert (r.input_tokens, r.output_tokens, r.cost_nanos, r.provider) == (0, 0, 0, None), request_id
        assert r.key_id is not None
    assert by_id["acme-ok"].status == 200
    assert by_id["acme-ok"].cost_nanos > 0
    assert len(records) == len(refused) + 2  # one record per request, none for the 401
    counted = {row["tenant"]: (row["requests"], row["failed"]) for row in report}
    assert counted == {"acme": (4, 3), "limited": (2, 1), "broke": (1, 1)}


def test_spend_report_failed_count_is_zero_when_every_request_was_served(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    server, key = start_gateway(upstream, tmp_path, POLICY.format(url=upstream.url))
    try:
        with openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0) as c:
            for _ in range(2):
                c.chat.completions.create(model="gpt-test", messages=MSGS)
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
            deadline = time.monotonic() + 5
            while True:  # written behind the responses
                data = admin.get("/admin/finance/spend").raise_for_status().json()["data"]
                if data or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            csv_text = admin.get("/admin/finance/spend.csv", params={"group_by": "tenant"}).text
            scraped = admin.get("/metrics").text
    finally:
        server.stop()
    assert [(d["tenant"], d["requests"], d["failed"]) for d in data] == [("acme", 2, 0)]
    assert csv_text.splitlines()[0].startswith("tenant,requests,failed,")
    assert "crossway_ledger_pending_records 0.0" in scraped  # everything written: a crash now would lose nothing
