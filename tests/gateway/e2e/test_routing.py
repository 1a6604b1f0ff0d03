"""Routing end to end: SLO- and price-aware choice, failover, breakers and live policy edits.

A gateway with its own policy runs in front of the fake vendors (scripted latency and failures by
model name, see ``tests.fakes.scenario``) and a port where, at first, nothing listens.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.fakes.upstream import FakeUpstream
from tests.gateway.e2e.conftest import ADMIN_KEY, _free_port, start_gateway

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.gateway.e2e.server import GatewayServer

USER = [{"role": "user", "content": "hi"}]

POLICY = """
providers:
  cheap: {{kind: openai, base_url: "{url}/v1", api_key_env: OPENAI_API_KEY, timeout_s: 5}}
  pricey: {{kind: anthropic, base_url: "{url}", api_key_env: ANTHROPIC_API_KEY, timeout_s: 5}}
  flaky: {{kind: openai, base_url: "http://127.0.0.1:{flaky_port}/v1", api_key_env: OPENAI_API_KEY, connect_timeout_s: 1}}
slo_classes:
  interactive: {{ttft_p95_ms: 800, service_tiers: [priority]}}
  standard: {{}}
default_slo_class: standard
routing: {{explore_share: 0, retries: 0, breaker_failures: 2, breaker_cooldown_s: 1}}
models:
  chat:
    targets:
      - {{provider: cheap, model: slow-900, price: {{input: {cheap_price}, output: {cheap_price}}}}}
      - {{provider: pricey, model: claude-fast, price: {{input: 3, output: 15}}}}
  failover:
    targets:
      - {{provider: flaky, model: m, price: {{input: 0.01, output: 0.01}}}}
      - {{provider: pricey, model: claude-backup, price: {{input: 3, output: 15}}}}
  cutting:
    targets:
      - {{provider: cheap, model: cut-stream, price: {{input: 0.01, output: 0.01}}}}
      - {{provider: pricey, model: claude-never, price: {{input: 3, output: 15}}}}
"""


class Routed:
    """The routing gateway, its policy file and the port of the deployment that starts out down."""

    def __init__(self, server: GatewayServer, key: str, policy: Path, flaky_port: int, upstream: FakeUpstream) -> None:
        self.server, self.key, self.policy, self.flaky_port, self.upstream = server, key, policy, flaky_port, upstream
        self.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=20)
        self.admin = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20)

    def chat(self, model: str, **kw: Any) -> Any:
        return self.client.chat.completions.with_raw_response.create(model=model, messages=USER, **kw)

    def policy_text(self, cheap_price: float = 0.1) -> str:
        return POLICY.format(url=self.upstream.url, flaky_port=self.flaky_port, cheap_price=cheap_price)


@pytest.fixture(scope="module")
def routed(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    workdir = tmp_path_factory.mktemp("routing")
    flaky_port = _free_port()
    text = POLICY.format(url=upstream.url, flaky_port=flaky_port, cheap_price=0.1)
    server, key = start_gateway(upstream, workdir, text)
    routed = Routed(server, key, workdir / "policy.yaml", flaky_port, upstream)
    yield routed
    routed.client.close()
    routed.admin.close()
    server.stop()


def test_cheapest_deployment_serves_until_it_would_miss_the_requests_slo(routed: Routed):
    for _ in range(5):  # enough samples for the router to trust what it measured
        raw = routed.chat("chat")
        assert raw.headers["x-crossway-deployment"] == "cheap/slow-900"
        assert raw.headers["x-crossway-route-reason"] == "cheapest-meeting-slo"
        assert raw.headers["x-crossway-slo-class"] == "standard"
    fast = routed.chat("chat", extra_headers={"x-crossway-slo": "interactive"})
    assert fast.headers["x-crossway-deployment"] == "pricey/claude-fast"
    assert fast.headers["x-crossway-slo-class"] == "interactive"
    explained = routed.admin.post(
        "/admin/route/explain", json={"model": "chat", "messages": USER}, headers={"x-crossway-slo": "interactive"}
    ).json()
    by_name = {c["deployment"]: c for c in explained["candidates"]}
    assert explained["order"] == ["pricey/claude-fast", "cheap/slow-900"]
    assert by_name["cheap/slow-900"]["qualified"] is False
    assert "TTFT p95" in by_name["cheap/slow-900"]["reason"]
    assert by_name["cheap/slow-900"]["predicted_ttft_ms"] > 800
    assert by_name["pricey/claude-fast"]["reason"].startswith("chosen: cheapest-meeting-slo")
    assert by_name["cheap/slow-900"]["cost_usd"] < by_name["pricey/claude-fast"]["cost_usd"]


def test_service_tier_that_a_class_claims_picks_that_class(routed: Routed):
    raw = routed.chat("chat", service_tier="priority")
    assert raw.headers["x-crossway-slo-class"] == "interactive"
    assert routed.chat("chat").headers["x-crossway-slo-class"] == "standard"


def test_unknown_slo_class_is_a_400_naming_the_header(routed: Routed):
    with pytest.raises(openai.BadRequestError) as info:
        routed.chat("chat", extra_headers={"x-crossway-slo": "warp-speed"})
    assert info.value.code == "unknown_slo_class"
    assert "warp-speed" in info.value.message


def test_stream_fails_over_before_the_first_byte(routed: Routed):
    with routed.client.chat.completions.with_streaming_response.create(
        model="failover", messages=USER, stream=True
    ) as response:
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
        attempts = response.headers["x-crossway-attempts"].split(",")
    assert text == "echo: hi"
    assert attempts[0] in {"flaky/m:ProviderUnavailable", "flaky/m:skipped:breaker_open"}
    assert attempts[-1] == "pricey/claude-backup:ok"


def test_stream_that_breaks_after_the_first_byte_ends_with_an_error_and_no_second_target(routed: Routed):
    with routed.client.chat.completions.with_streaming_response.create(
        model="cutting", messages=USER, stream=True
    ) as response:
        assert response.headers["x-crossway-attempts"] == "cheap/cut-stream:ok"
        received: list[object] = []
        with pytest.raises(openai.APIError):
            received.extend(response.parse())
    assert received  # the failure came after content had been sent
    assert not any(isinstance(r.body, dict) and r.body.get("model") == "claude-never" for r in routed.upstream.requests)


def test_breaker_opens_after_failures_then_a_probe_closes_it_once_the_deployment_is_back(routed: Routed):
    for _ in range(3):  # two failures open the breaker (threshold 2); after that it is skipped
        routed.chat("failover")
    skipped = routed.chat("failover")
    assert skipped.headers["x-crossway-attempts"] == "pricey/claude-backup:ok"  # open: not even tried
    explained = routed.admin.post("/admin/route/explain", json={"model": "failover", "messages": USER}).json()
    flaky = next(c for c in explained["candidates"] if c["deployment"] == "flaky/m")
    assert flaky["usable"] is False and flaky["reason"] == "breaker open"
    with FakeUpstream(port=routed.flaky_port):
        time.sleep(1.1)  # the cooldown: the breaker is half-open now
        probe = routed.chat("failover")
        assert probe.headers["x-crossway-attempts"] == "flaky/m:ok"
        after = routed.chat("failover")
        assert after.headers["x-crossway-deployment"] == "flaky/m"


def _put(routed: Routed, text: str, comment: str) -> httpx.Response:
    return routed.admin.put(
        f"/admin/policies/{routed.policy.stem}", json={"body": text, "comment": comment, "author": "ops@example.com"}
    )


def test_policy_edit_through_the_admin_api_changes_routing_on_the_next_request(routed: Routed):
    name = routed.policy.stem
    before = routed.admin.get(f"/admin/policies/{name}").json()
    assert routed.chat("chat").headers["x-crossway-deployment"] == "cheap/slow-900"
    saved = _put(routed, routed.policy_text(cheap_price=100), "make cheap expensive")
    assert saved.status_code == 200, saved.text
    assert saved.json()["version"] == before["version"] + 1
    assert "-      - {provider: cheap, model: slow-900, price: {input: 0.1, output: 0.1}}" in saved.json()["diff"]
    assert routed.chat("chat").headers["x-crossway-deployment"] == "pricey/claude-fast"
    history = routed.admin.get(f"/admin/policies/{name}/history").json()["data"]
    assert [h["version"] for h in history][:2] == [before["version"] + 1, before["version"]]
    assert history[0]["author"] == "ops@example.com" and history[0]["comment"] == "make cheap expensive"
    rolled = routed.admin.post(f"/admin/policies/{name}/rollback", json={"version": before["version"]})
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["comment"] == f"rollback to version {before['version']}"
    assert routed.chat("chat").headers["x-crossway-deployment"] == "cheap/slow-900"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("provider: pricey, model: claude-fast", "provider: nobody, model: x"), "unknown provider"),
        (lambda t: t.replace("input: 3, output: 15}}", "input: -3, output: 15}}", 1), "chat.targets[1].price.input"),
        (
            lambda t: (
                t + "  loop-a: {targets: [{provider: cheap, model: a}], fallbacks: [loop-b]}\n"
                "  loop-b: {targets: [{provider: cheap, model: b}], fallbacks: [loop-a]}\n"
            ),
            "cyclic fallbacks",
        ),
        (lambda t: t.replace("default_slo_class: standard", "default_slo_class: ludicrous"), "unknown SLO class"),
        (lambda t: t + "models: [unclosed\n", "not valid YAML"),
    ],
    ids=["unknown-provider", "negative-price", "cyclic-fallbacks", "unknown-slo-class", "yaml-syntax"],
)
def test_bad_policy_is_rejected_with_a_precise_message_and_the_running_one_stays(routed: Routed, edit, message):
    name = routed.policy.stem
    before = routed.admin.get(f"/admin/policies/{name}").json()["version"]
    bad = edit(routed.policy_text())
    checked = routed.admin.post("/admin/policies/validate", json={"body": bad})
    saved = _put(routed, bad, "broken")
    for response in (checked, saved):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid_policy" and message in error["message"], error
    assert routed.admin.get(f"/admin/policies/{name}").json()["version"] == before
    assert routed.chat("chat").headers["x-crossway-deployment"] == "cheap/slow-900"


def test_policy_edit_does_not_disturb_a_request_in_flight(routed: Routed):
    name = routed.policy.stem
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(routed.chat, "chat")  # cheap/slow-900 answers after 0.9 s
        time.sleep(0.3)
        edited = routed.policy_text().replace("timeout_s: 5}", "timeout_s: 6}", 1)  # rebuilds the `cheap` adapter
        assert _put(routed, edited, "longer timeout").status_code == 200
        raw = in_flight.result(timeout=10)
    assert raw.status_code == 200 and raw.headers["x-crossway-deployment"] == "cheap/slow-900"
    assert raw.parse().choices[0].message.content == "echo: hi"
    current = routed.admin.get(f"/admin/policies/{name}").json()
    assert "timeout_s: 6}" in current["body"]
    assert routed.chat("chat").headers["x-crossway-deployment"] == "cheap/slow-900"
