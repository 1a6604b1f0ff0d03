"""The finance dashboard in headless Chromium, and the read-only finance key, against a real gateway.

The gateway runs over fake vendors with prices and SLO classes of its own; two tenants send traffic
through the openai SDK, and five earlier days of usage records are written through the ledger's own
writer so that charts have a history. Every figure the page shows is compared with what the JSON API
answers for the same range.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from selenium.webdriver.common.by import By

from gateway.ledger.record import UsageRecord
from gateway.ledger.writer import LedgerWriter
from gateway.store.db import Database
from tests.gateway.e2e.browser import chromium, console_errors, datasets, table, wait_for
from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway

if TYPE_CHECKING:
    from collections.abc import Iterator

    from selenium import webdriver

    from tests.fakes.upstream import FakeUpstream
    from tests.gateway.e2e.server import GatewayServer

FINANCE_KEY = "finance-test-key"
SCREENSHOTS = "/tmp/crossway-dashboard"  # noqa: S108 - looked at by a person after the run

POLICY = """
providers:
  openai: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY, timeout_s: 5}}
  anthropic: {{kind: anthropic, base_url: "{url}", api_key_env: ANTHROPIC_API_KEY, timeout_s: 5}}
slo_classes:
  interactive: {{ttft_p95_ms: 150, tpot_p95_ms: 100}}
  standard: {{ttft_p95_ms: 5000, tpot_p95_ms: 1000}}
default_slo_class: standard
models:
  gpt-test: {{targets: [{{provider: openai, model: gpt-4o-mini, price: {{input: 100, output: 400}}}}]}}
  slow-test: {{targets: [{{provider: openai, model: slow-300, price: {{input: 100, output: 400}}}}]}}
  claude-test: {{targets: [{{provider: anthropic, model: claude-sonnet-4-5, price: {{input: 300, output: 1500}}}}]}}
routing: {{explore_share: 0, breaker_failures: 1000}}
"""
MSGS = [{"role": "user", "content": "what did we spend on the dashboard this week"}]
HISTORY_DAYS = 5
"""Days before today with written usage records."""


def _history(today: datetime) -> list[UsageRecord]:
    """Usage records for the ``HISTORY_DAYS`` days before ``today``: both tenants, both providers, some SLO misses."""
    rng = random.Random(6)  # noqa: S311 - test data, not secrets
    out = []
    for back in range(1, HISTORY_DAYS + 1):
        day = today - timedelta(days=back)
        for tenant, provider, model, n in (
            ("acme", "openai", "gpt-4o-mini", 3 + back),
            ("globex", "anthropic", "claude-sonnet-4-5", 2),
        ):
            for i in range(n):
                ttft = rng.uniform(40, 400)
                out.append(UsageRecord(
                    id=UsageRecord.new_id(), ts=day + timedelta(hours=1 + i), request_id=f"hist-{back}-{tenant}-{i}",
                    endpoint="chat.completions", alias=model, status=200, tenant=tenant, provider=provider,
                    deployment=f"{provider}/{model}", slo_class="interactive", streamed=True,
                    input_tokens=rng.randint(200, 3000), output_tokens=rng.randint(50, 800), usage_source="provider",
                    cost_nanos=rng.randint(1, 400) * 100_000, ttft_ms=ttft, tpot_ms=rng.uniform(5, 60),
                    latency_ms=ttft + 500, slo_met=ttft < 150,
                ))  # fmt: skip
    return out


async def _write(url: str, records: list[UsageRecord]) -> None:
    async with Database.connect(url) as db:
        writer = LedgerWriter(db)
        writer.start()
        for record in records:
            writer.submit(record)
        await writer.aclose()


def _traffic(server: GatewayServer, keys: dict[str, str]) -> int:
    """Requests of both tenants through the openai SDK, streamed and not, some too slow for their class."""
    sent = 0
    plan = {"acme": [("gpt-test", False, None)] * 2 + [("gpt-test", True, None)] * 2 + [("slow-test", True, "interactive")] * 2,
            "globex": [("claude-test", False, None)] * 2 + [("claude-test", True, None), ("gpt-test", True, "interactive")]}  # fmt: skip
    for tenant, calls in plan.items():
        with openai.OpenAI(api_key=keys[tenant], base_url=f"{server.url}/v1", max_retries=0, timeout=20) as client:
            for model, stream, slo in calls:
                headers = {"x-crossway-slo": slo} if slo else None
                if stream:
                    chunks = client.chat.completions.create(
                        model=model, messages=MSGS, max_tokens=50, stream=True, extra_headers=headers,
                        stream_options={"include_usage": True},
                    )  # fmt: skip
                    assert next(c for c in chunks if c.usage).usage.completion_tokens > 0
                else:
                    answer = client.chat.completions.create(
                        model=model, messages=MSGS, max_tokens=50, extra_headers=headers
                    )
                    assert answer.usage.completion_tokens > 0
                sent += 1
    return sent


class Site:
    """The gateway under test, its two tenants' traffic, and API clients with either key."""

    def __init__(self, server: GatewayServer, today: datetime, history: list[UsageRecord], live: int) -> None:
        self.server, self.today, self.history, self.live = server, today, history, live
        self.admin = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        self.finance = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {FINANCE_KEY}"}, timeout=10)

    def day(self, back: int) -> str:
        return (self.today - timedelta(days=back)).date().isoformat()

    def get(self, path: str, first: str, last: str, **params: str) -> list[dict[str, Any]]:
        """An API answer for the page's inclusive day range, read with the finance key."""
        end = (datetime.fromisoformat(last) + timedelta(days=1)).date().isoformat()
        query = {"start": f"{first}T00:00:00+00:00", "end": f"{end}T00:00:00+00:00", **params}
        data: list[dict[str, Any]] = self.finance.get(path, params=query).raise_for_status().json()["data"]
        return data


@pytest.fixture(scope="module")
def site(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    workdir = tmp_path_factory.mktemp("dashboard")
    server, acme_key = start_gateway(upstream, workdir, POLICY.format(url=upstream.url), finance_key=FINANCE_KEY)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    history = _history(today)
    asyncio.run(_write(server.settings.database_url, history))
    s = Site(server, today, history, 0)
    try:
        globex_key = s.admin.post("/admin/keys", json={"tenant": "globex"}).raise_for_status().json()["key"]
        for tenant, soft, hard in (("acme", 0.02, 5.0), ("globex", 0.5, 2.0)):
            limits = {"tenant": tenant, "budget_soft_usd": soft, "budget_hard_usd": hard}
            s.admin.put("/admin/finance/limits", json=limits).raise_for_status()
        s.live = _traffic(server, {"acme": acme_key, "globex": globex_key})
        expected = len(history) + s.live
        deadline = time.monotonic() + 10
        while sum(r["requests"] for r in s.get("/admin/finance/spend", s.day(7), s.day(0))) < expected:
            assert time.monotonic() < deadline, "usage records were not written within 10 s"
            time.sleep(0.05)  # written behind the responses, within the writer's flush interval
        yield s
    finally:
        s.admin.close()
        s.finance.close()
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    yield from chromium()


READS = [
    ("GET", "/admin/finance/spend"), ("GET", "/admin/finance/spend.csv"), ("GET", "/admin/finance/goodput"),
    ("GET", "/admin/finance/budgets"), ("GET", "/admin/finance/prices"), ("GET", "/admin/policies"),
    ("GET", "/admin/policies/policy"), ("GET", "/admin/policies/policy/history"), ("GET", "/admin/whoami"),
]  # fmt: skip
WRITES = [
    ("PUT", "/admin/finance/limits", {"tenant": "acme", "rpm": 1}),
    ("POST", "/admin/finance/prices", {"deployment": "openai/gpt-4o-mini", "input": 0, "output": 0}),
    ("PUT", "/admin/policies/policy", {"body": "models: {}"}),
    ("POST", "/admin/policies/validate", {"body": "models: {}"}),
    ("POST", "/admin/policies/policy/rollback", {"version": 1}),
    ("POST", "/admin/keys", {"tenant": "acme"}),
    ("GET", "/admin/keys", None),
    ("POST", "/admin/tenants", {"name": "intruder"}),
    ("DELETE", "/admin/keys/1", None),
]


@pytest.mark.parametrize(("method", "path"), READS)
def test_finance_key_and_admin_key_read_reports_and_policies(site: Site, method: str, path: str) -> None:
    for client in (site.finance, site.admin):
        assert client.request(method, path).status_code == 200
    bad = httpx.request(method, site.server.url + path, headers={"authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert bad.json()["error"]["type"] == "authentication_error"


def test_whoami_names_the_role_of_each_key(site: Site) -> None:
    assert site.finance.get("/admin/whoami").json() == {"role": "finance"}
    assert site.admin.get("/admin/whoami").json() == {"role": "admin"}


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_finance_key_cannot_write_and_gets_403_in_openai_format(site: Site, method: str, path: str, body: Any) -> None:
    before = site.admin.get("/admin/finance/budgets").json()
    denied = site.finance.request(method, path, json=body)
    assert denied.status_code == 403
    assert denied.json() == {"error": {
        "message": "The finance key is read-only: this request changes something and needs the admin key.",
        "type": "permission_error", "param": None, "code": "read_only_key",
    }}  # fmt: skip
    bad = httpx.request(method, site.server.url + path, json=body, headers={"authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert site.admin.get("/admin/finance/budgets").json() == before


# ---- the page -------------------------------------------------------------------------------------------


def _sign_in(browser: webdriver.Chrome, key: str) -> None:
    field = browser.find_element(By.ID, "key-input")
    field.clear()
    field.send_keys(key)
    browser.find_element(By.ID, "login-button").click()


def _state(browser: webdriver.Chrome) -> str:
    return str(browser.execute_script("return document.body.dataset.state || ''"))


def _set_range(browser: webdriver.Chrome, first: str, last: str) -> None:
    """Type a range into the date pickers (their value, as a picker sets it) and press Apply."""
    browser.execute_script(
        "document.getElementById('range-start').value = arguments[0];"
        "document.getElementById('range-end').value = arguments[1];",
        first,
        last,
    )
    browser.find_element(By.ID, "range-apply").click()
    wait_for(
        lambda: (
            _state(browser) == "ready"
            and browser.execute_script("return document.body.dataset.range") == f"{first}/{last}"
        ),
        what="the new range",
    )


def _open(browser: webdriver.Chrome, view: str) -> None:
    browser.find_element(By.CSS_SELECTOR, f'[data-view="{view}"]').click()
    assert browser.find_element(By.ID, f"view-{view}").is_displayed()


def _check_spend(browser: webdriver.Chrome, site: Site, first: str, last: str) -> None:
    by_day = site.get("/admin/finance/spend", first, last, group_by="tenant,day")
    bars = datasets(browser, "#spend-chart rect.bar")
    assert sorted((b["tenant"], b["day"], float(b["cost"]), int(b["requests"])) for b in bars) == sorted(
        (r["tenant"], r["day"], r["cost_usd"], r["requests"]) for r in by_day if r["cost_usd"] > 0
    )
    by_tenant = site.get("/admin/finance/spend", first, last, group_by="tenant")
    api = {r["tenant"]: r for r in by_tenant}
    shown = table(browser, "#spend-table", "tenant")
    assert _typed(shown, api) == _expect(api, shown)
    assert len(next(iter(shown.values()))) == 7  # tenant, requests, three token counts, cost, saved
    cost = float(browser.find_element(By.ID, "sum-cost").get_attribute("data-value") or "nan")
    assert cost == pytest.approx(sum(r["cost_usd"] for r in by_tenant), rel=1e-12)
    requests = int(browser.find_element(By.ID, "sum-requests").get_attribute("data-value") or -1)
    assert requests == sum(r["requests"] for r in by_tenant)
    legend = datasets(browser, "#spend-legend .legend-item")
    assert [item["series"] for item in legend] == [r["tenant"] for r in by_tenant]


def _typed(shown: dict[str, dict[str, str]], api: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A table read from the page with each cell typed as the API's figure (a number, a string or null)."""
    out = {}
    for key, row in shown.items():
        ref = api.get(key, {})
        out[key] = {
            k: None
            if v == ""
            else float(v)
            if isinstance(ref.get(k), int | float) and not isinstance(ref.get(k), bool)
            else v
            for k, v in row.items()
        }
    return out


def _expect(api: dict[str, dict[str, Any]], shown: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """The API's rows cut to the fields the page's table shows."""
    fields = next(iter(shown.values())).keys() if shown else []
    return {key: {k: row.get(k) for k in fields} for key, row in api.items()}


def test_dashboard_shows_what_the_api_answers_for_the_finance_key(site: Site, browser: webdriver.Chrome) -> None:
    browser.get(f"{site.server.url}/dashboard")
    wait_for(lambda: _state(browser) == "signed-out", what="the sign-in form")

    _sign_in(browser, "not-a-key")
    error = wait_for(lambda: browser.find_element(By.ID, "login-error").text, what="the sign-in error")
    assert error == "Key refused: Incorrect admin key provided."
    assert not browser.find_element(By.ID, "app").is_displayed()

    refused = console_errors(browser)
    assert len(refused) == 1 and "401" in refused[0]  # the refused /admin/whoami, and nothing else

    _sign_in(browser, FINANCE_KEY)
    wait_for(lambda: _state(browser) == "ready", what="the first load")
    assert browser.find_element(By.ID, "role").text == "finance · read-only"
    first, last = site.day(6), site.day(0)
    _set_range(browser, first, last)
    _check_spend(browser, site, first, last)
    total = sum(r["requests"] for r in site.get("/admin/finance/spend", first, last))
    assert total == len(site.history) + site.live  # every seeded record and every request sent
    browser.save_screenshot(f"{SCREENSHOTS}-spend.png")

    _open(browser, "providers")
    providers = site.get("/admin/finance/spend", first, last, group_by="provider")
    assert {p["provider"] for p in providers} == {"openai", "anthropic"}
    bars = datasets(browser, "#provider-chart rect.bar")
    assert [(b["provider"], float(b["cost"]), int(b["requests"])) for b in bars] == [
        (r["provider"], r["cost_usd"], r["requests"]) for r in providers
    ]
    api = {r["provider"]: r for r in providers}
    shown = table(browser, "#provider-table", "provider")
    assert _typed(shown, api) == _expect(api, shown)
    browser.save_screenshot(f"{SCREENSHOTS}-providers.png")

    _open(browser, "goodput")
    by_day = site.get("/admin/finance/goodput", first, last, group_by="tenant,day")
    points = datasets(browser, "#goodput-chart circle.point")
    assert sorted((p["tenant"], p["day"], float(p["share"]), int(p["requests"])) for p in points) == sorted(
        (r["tenant"], r["day"], r["slo_met_share"], r["requests"]) for r in by_day
    )
    assert {r["slo_met_share"] for r in by_day if r["day"] == last} != {1.0}  # the slow requests missed their class
    detail = {
        "|".join([r["tenant"], r["deployment"], r["slo_class"]]): r
        for r in site.get("/admin/finance/goodput", first, last)
    }
    shown = table(browser, "#goodput-table", "key")
    assert _typed(shown, detail) == _expect(detail, shown)
    browser.save_screenshot(f"{SCREENSHOTS}-goodput.png")

    _open(browser, "latency")
    daily = site.get("/admin/finance/goodput", first, last, group_by="day")
    assert [r["day"] for r in daily] == [site.day(back) for back in range(HISTORY_DAYS, -1, -1)]
    for metric in ("ttft", "tpot"):
        points = datasets(browser, f"#{metric}-chart circle.point")
        expected = [(f"{metric}_{q}_ms", r["day"], r[f"{metric}_{q}_ms"]) for q in ("p50", "p95", "p99") for r in daily]
        assert sorted((p["series"], p["day"], float(p["value"])) for p in points) == sorted(
            e for e in expected if e[2] is not None
        )
    api = {r["day"]: r for r in daily}
    shown = table(browser, "#latency-table", "day")
    assert _typed(shown, api) == _expect(api, shown)
    browser.save_screenshot(f"{SCREENSHOTS}-latency.png")

    _open(browser, "budgets")
    budgets = site.finance.get("/admin/finance/budgets").json()["data"]
    marks = datasets(browser, "#budget-chart g.budget")
    assert sorted(
        (m["tenant"], float(m["spent"]), float(m["reserved"]), float(m["soft"]), float(m["hard"])) for m in marks
    ) == sorted(
        (b["tenant"], b["spent_usd"], b["reserved_usd"], b["soft_limit_usd"], b["hard_limit_usd"]) for b in budgets
    )
    states = {t: row["state"] for t, row in table(browser, "#budget-table", "tenant").items()}
    assert states["acme"] == "over soft limit"  # acme spent more than its $0.02 soft limit today
    browser.save_screenshot(f"{SCREENSHOTS}-budgets.png")

    _open(browser, "policy")
    served = site.finance.get("/admin/policies").json()["serving"]
    policy = site.finance.get(f"/admin/policies/{served['name']}").json()
    assert browser.find_element(By.ID, "policy-version").text == str(served["version"]) == str(policy["version"])
    assert browser.find_element(By.ID, "policy-body").get_attribute("textContent") == policy["body"]
    browser.save_screenshot(f"{SCREENSHOTS}-policy.png")

    # A narrower range (yesterday and two days before): only written history, so the totals are known.
    _open(browser, "spend")
    first, last = site.day(3), site.day(1)
    _set_range(browser, first, last)
    _check_spend(browser, site, first, last)
    days = {(r.ts.date().isoformat()) for r in site.history}
    in_range = [r for r in site.history if first <= r.ts.date().isoformat() <= last]
    assert len(days) == HISTORY_DAYS
    assert int(browser.find_element(By.ID, "sum-requests").get_attribute("data-value") or -1) == len(in_range)
    assert float(browser.find_element(By.ID, "sum-cost").get_attribute("data-value") or "nan") == pytest.approx(
        sum(r.cost_nanos for r in in_range) / 1e9, rel=1e-12
    )
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#spend-chart .axis.x text:not(.axis-label)")]
    assert len(labels) == 3

    assert console_errors(browser) == []  # no script error and no Content-Security-Policy violation

    # The page's own session cannot save anything with the finance key.
    script = """
        const done = arguments[arguments.length - 1];
        fetch('/admin/finance/limits', {method: 'PUT', body: JSON.stringify({tenant: 'acme', rpm: 1}),
            headers: {Authorization: 'Bearer ' + sessionStorage.getItem('crossway.dashboard.key')}})
          .then(async (r) => done([r.status, (await r.json()).error.message]));
    """
    status, message = browser.execute_async_script(script)
    assert (status, message) == (
        403,
        "The finance key is read-only: this request changes something and needs the admin key.",
    )

    assert [e for e in console_errors(browser) if "403" not in e] == []

    # Everything the page loaded came from the gateway itself.
    urls = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert urls and all(u.startswith(site.server.url + "/") for u in urls)

    browser.find_element(By.ID, "sign-out").click()
    assert _state(browser) == "signed-out"
    assert browser.execute_script("return sessionStorage.getItem('crossway.dashboard.key')") is None
    _sign_in(browser, ADMIN_KEY)
    wait_for(lambda: _state(browser) == "ready", what="the load with the admin key")
    assert browser.find_element(By.ID, "role").text == "admin"
    browser.refresh()  # the key stays for the tab's session: no second sign-in
    wait_for(lambda: _state(browser) == "ready", what="the load after a reload")
    assert console_errors(browser) == []


def test_dashboard_files_are_served_by_the_gateway_alone(site: Site) -> None:
    """The page, its scripts and its style sheet come from the gateway, name no other host, and forbid others."""
    page = httpx.get(f"{site.server.url}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assets = re.findall(r'(?:src|href)="(/dashboard/[^"]+)"', page.text)
    assert sorted(assets) == [
        "/dashboard/app.js",
        "/dashboard/charts.js",
        "/dashboard/style.css",
        "/dashboard/views.js",
    ]
    for path in assets:
        asset = httpx.get(site.server.url + path)
        assert asset.status_code == 200
        assert asset.headers["content-type"].split(";")[0] in {"text/javascript", "text/css"}
        urls = set(re.findall(r"[a-z]+://[^\s\"')]+", asset.text))
        assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace names no server
    missing = httpx.get(f"{site.server.url}/dashboard/nope.js")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "No dashboard file named 'nope.js'."
