from pathlib import Path

import pytest

from gateway.errors import InvalidRequest, PermissionDenied, UnknownModel
from gateway.policy import DEFERRABLE_ENGINE_RESERVE, PolicyError, Target, load_policy, parse_policy
from gateway.settings import DEFAULT_POLICY

POLICY = """
providers:
  oa: {kind: openai, api_key_env: OA_KEY, base_url_env: OA_URL}
  an: {kind: anthropic, api_key_env: AN_KEY}
  local: {kind: openai, base_url: "http://127.0.0.1:9/v1", api_key_required: false}
models:
  fast:
    targets: [{provider: oa, model: gpt-x}, {provider: an, model: claude-x}]
  only-anthropic:
    targets: [{provider: an, model: claude-x}]
"""


def test_resolve_keeps_policy_order_and_drops_unconfigured_providers():
    policy = parse_policy(POLICY, {"OA_KEY": "k"})
    assert policy.resolve("fast").targets == (Target("oa", "gpt-x"),)
    both = parse_policy(POLICY, {"OA_KEY": "k", "AN_KEY": "k2"})
    assert both.resolve("fast").targets == (Target("oa", "gpt-x"), Target("an", "claude-x"))


def test_resolve_raises_unknown_model_naming_missing_provider():
    policy = parse_policy(POLICY, {"OA_KEY": "k"})
    with pytest.raises(UnknownModel, match="configure an"):
        policy.resolve("only-anthropic")
    with pytest.raises(UnknownModel, match="does not exist"):
        policy.resolve("nope")


def test_resolve_passthrough_reaches_provider_model_directly():
    policy = parse_policy(POLICY, {})
    assert policy.resolve("local/my-model").targets == (Target("local", "my-model"),)
    with pytest.raises(UnknownModel):
        policy.resolve("unknown/my-model")
    closed = parse_policy(POLICY + "\npassthrough: false\n", {})
    with pytest.raises(UnknownModel):
        closed.resolve("local/my-model")


def test_provider_credentials_come_from_the_environment_snapshot():
    policy = parse_policy(POLICY, {"OA_KEY": "secret", "OA_URL": "http://127.0.0.1:1/v1/"})
    oa = policy.providers["oa"]
    assert oa.api_key == "secret" and oa.base_url == "http://127.0.0.1:1/v1"
    assert "secret" not in repr(oa)
    assert policy.providers["an"].base_url == "https://api.anthropic.com"
    assert policy.available_models() == ["fast"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "models: {a: {targets: [{provider: nope, model: m}]}}",
            "`$.models.a.targets[0].provider`: unknown provider 'nope'",
        ),
        ("providers: {p: {kind: cohere}}", "$.providers.p.kind"),
        ("providers: {p: {kind: openai, colour: blue}}", "unknown field `colour`"),
        ("models: {a: {targets: []}}", "`$.models.a.targets` must name at least one target"),
        ("models: [1, 2", "not valid YAML"),
        ("slo_classes: {standard: {ttft_p95_ms: 2500, engine_reserve: -0.1}}", "$.slo_classes.standard.engine_reserve"),
        ("slo_classes: {batch: {deadline_s: 60, engine_reserve: 1.0}}", "$.slo_classes.batch.engine_reserve"),
    ],
)
def test_parse_policy_errors_name_the_file_and_key_path(text, fragment):
    with pytest.raises(PolicyError) as info:
        parse_policy(text, {}, source="policies/x.yaml")
    assert str(info.value).startswith("policies/x.yaml: ")
    assert fragment in str(info.value)


def test_engine_reserve_defaults_to_deadline_only_classes_and_can_be_set_per_class():
    text = (
        "slo_classes:\n"
        "  interactive: {ttft_p95_ms: 800, tpot_p95_ms: 60}\n"
        "  standard: {ttft_p95_ms: 2500, tpot_p95_ms: 100, engine_reserve: 0.2}\n"
        "  batch: {deadline_s: 86400}\n"
        "  overnight: {deadline_s: 86400, engine_reserve: 0.5}\n"
    )
    classes = parse_policy(text, {}).slo_classes
    reserves = {name: c.engine_reserve for name, c in classes.items()}
    assert reserves == {"interactive": 0.0, "standard": 0.2, "batch": DEFERRABLE_ENGINE_RESERVE, "overnight": 0.5}


TENANTS = """
providers:
  cheap: {kind: openai, base_url: "http://127.0.0.1:9/v1", api_key_required: false}
  dear: {kind: openai, base_url: "http://127.0.0.1:8/v1", api_key_required: false}
models:
  chat:
    targets:
      - {provider: cheap, model: m, price: {input: 0.5, output: 1.5}}
      - {provider: dear, model: m, price: {input: 3.0, output: 15.0}}
  premium-only:
    targets: [{provider: dear, model: m, price: {input: 3.0, output: 15.0}}]
slo_classes:
  interactive: {ttft_p95_ms: 800, service_tiers: [priority]}
  standard: {ttft_p95_ms: 2500}
  batch: {deadline_s: 86400, service_tiers: [flex]}
default_slo_class: standard
tenants:
  thrifty: {max_input_price: 1.0, max_output_price: 2.0, default_slo_class: batch}
  narrow: {allowed_models: [chat]}
"""


def test_tenant_price_caps_drop_dearer_deployments_and_refuse_when_none_is_left():
    policy = parse_policy(TENANTS, {})
    assert [t.provider for t in policy.resolve("chat").targets] == ["cheap", "dear"]
    assert [t.provider for t in policy.resolve("chat", tenant="thrifty").targets] == ["cheap"]
    with pytest.raises(PermissionDenied) as info:
        policy.resolve("premium-only", tenant="thrifty")
    assert info.value.code == "price_cap"
    assert "`thrifty`'s price caps" in str(info.value)


def test_tenant_allowed_models_limit_what_it_may_call_and_list():
    policy = parse_policy(TENANTS, {})
    with pytest.raises(PermissionDenied) as info:
        policy.resolve("premium-only", tenant="narrow")
    assert info.value.code == "model_not_allowed"
    assert policy.available_models("narrow") == ["chat"]
    assert policy.available_models() == ["chat", "premium-only"]


@pytest.mark.parametrize(
    ("asked", "tenant", "expected"),
    [
        (None, None, "standard"),  # the policy's default
        (None, "thrifty", "batch"),  # the tenant's default
        ("interactive", "thrifty", "interactive"),  # the request's choice wins
        ("priority", None, "interactive"),  # a service_tier that a class claims
        ("flex", "narrow", "batch"),
    ],
)
def test_slo_class_is_the_requests_choice_else_the_tenants_default_else_the_policys(asked, tenant, expected):
    policy = parse_policy(TENANTS, {})
    assert policy.resolve("chat", tenant=tenant, slo=asked).slo.name == expected


def test_unknown_slo_class_is_an_invalid_request_listing_the_known_ones():
    with pytest.raises(InvalidRequest) as info:
        parse_policy(TENANTS, {}).resolve("chat", slo="ludicrous")
    assert info.value.code == "unknown_slo_class"
    assert "known: batch, interactive, standard" in str(info.value)


def test_load_policy_reports_missing_file(tmp_path: Path):
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "absent.yaml", {})


def test_default_policy_loads_and_enables_providers_by_sdk_variables():
    policy = load_policy(DEFAULT_POLICY, {"ANTHROPIC_API_KEY": "k"})
    assert policy.available_models() == ["claude-haiku-4-5", "claude-sonnet-4-5", "smollm2", "smollm2-cpu"]
    assert load_policy(DEFAULT_POLICY, {}).available_models() == ["smollm2", "smollm2-cpu"]  # the engine needs no key


def test_keyless_provider_is_enabled_only_once_its_address_is_known():
    text = "providers: {e: {kind: openai, base_url_env: ENGINE_URL, api_key_required: false}}"
    assert not parse_policy(text, {}).providers["e"].enabled
    on = parse_policy(text, {"ENGINE_URL": "http://127.0.0.1:8001/v1"}).providers["e"]
    assert on.enabled and on.base_url == "http://127.0.0.1:8001/v1"


def test_default_policy_prefers_the_engine_server_then_falls_back_to_the_in_process_engine():
    alone = load_policy(DEFAULT_POLICY, {}).resolve("smollm2")
    assert [t.key for t in alone.targets] == ["local/smollm2"] and alone.fallbacks == ()
    both = load_policy(DEFAULT_POLICY, {"CROSSWAY_ENGINE_URL": "http://engine:8000/v1"}).resolve("smollm2")
    assert [t.key for t in both.targets] == ["engine/smollm2"]
    assert [t.key for t in both.fallbacks] == ["local/smollm2"]
