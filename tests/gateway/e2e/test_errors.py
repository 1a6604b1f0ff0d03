"""Bad input and upstream faults: the right status, the caller's error shape, and the gateway keeps serving."""

from __future__ import annotations

import anthropic
import httpx
import msgspec
import openai
import pytest

from tests.gateway.e2e.openai_schema import validate

USER = [{"role": "user", "content": "hi"}]


def _post(gateway, path: str, content: bytes, key: str | None = "default", **headers: str) -> httpx.Response:
    auth = {"authorization": f"Bearer {gateway.key if key == 'default' else key}"} if key else {}
    return httpx.post(
        f"{gateway.url}{path}",
        content=content,
        timeout=10,
        headers={"content-type": "application/json", **auth, **headers},
    )


def _assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    validate("ErrorResponse", r.json())
    assert r.headers["x-request-id"]
    return r.json()["error"]


def _assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


VALID = msgspec.json.encode({"model": "gpt-test", "messages": USER})


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"model": "gpt-test", "messages": [', "parse the JSON"),
        (b'{"model": "gpt-test", "messages": "hi"}', "Expected `array`"),
        (b'{"model": 5, "messages": []}', "Expected `str`"),
        (
            b'{"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "colour": "red"}',
            "Unrecognized request argument supplied: colour",
        ),
        (b'{"model": "gpt-test", "messages": [{"role": "user", "content": "\xc3\x28"}]}', "UTF-8"),
        (b"", "parse the JSON"),
    ],
)
def test_openai_route_rejects_bad_bodies_with_400(gateway, content, fragment):
    error = _assert_openai_error(_post(gateway, "/v1/chat/completions", content), 400)
    assert error["type"] == "invalid_request_error" and fragment in error["message"]


@pytest.mark.parametrize(
    "content",
    [b"{", b'{"model": "claude-test", "messages": []}', b'{"model": "c", "max_tokens": 1, "messages": [], "x": 1}'],
)
def test_anthropic_route_rejects_bad_bodies_with_400(gateway, content):
    _assert_anthropic_error(_post(gateway, "/v1/messages", content), 400, "invalid_request_error")


def test_huge_body_gets_413_in_each_format(gateway):
    huge = b'{"model": "gpt-test", "messages": [{"role": "user", "content": "' + b"x" * 2_000_000 + b'"}]}'
    assert _assert_openai_error(_post(gateway, "/v1/chat/completions", huge), 413)["type"] == "request_too_large"
    _assert_anthropic_error(_post(gateway, "/v1/messages", huge), 413, "request_too_large")


def test_missing_or_wrong_key_gets_401_before_the_body_is_read(gateway):
    assert (
        _assert_openai_error(_post(gateway, "/v1/chat/completions", b"{", key=None), 401)["type"]
        == "authentication_error"
    )
    _assert_openai_error(_post(gateway, "/v1/chat/completions", VALID, key="cw-wrong"), 401)
    _assert_anthropic_error(_post(gateway, "/v1/messages", b"{}", key="cw-wrong"), 401, "authentication_error")
    with (
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="cw-nope", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()
    with (
        anthropic.Anthropic(base_url=gateway.url, api_key="cw-nope", max_retries=0) as client2,
        pytest.raises(anthropic.AuthenticationError),
    ):
        client2.messages.create(model="claude-test", max_tokens=5, messages=USER)


def test_unknown_model_and_unknown_route_get_404(gateway):
    with pytest.raises(openai.NotFoundError) as info:
        gateway.openai().chat.completions.create(model="no-such-model", messages=USER)
    assert info.value.code == "model_not_found"
    with pytest.raises(anthropic.NotFoundError):
        gateway.anthropic().messages.create(model="nowhere-test", max_tokens=5, messages=USER)
    _assert_openai_error(httpx.get(f"{gateway.url}/v1/nothing-here"), 404)
    _assert_openai_error(httpx.get(f"{gateway.url}/v1/chat/completions"), 405)


@pytest.mark.parametrize(
    ("upstream_model", "status", "openai_error", "anthropic_type"),
    [
        ("error-429", 429, openai.RateLimitError, "rate_limit_error"),
        ("error-500", 503, openai.InternalServerError, "overloaded_error"),
        ("error-503", 503, openai.InternalServerError, "overloaded_error"),
        ("slow-5000", 504, openai.InternalServerError, "timeout_error"),
        ("error-401", 502, openai.InternalServerError, "api_error"),
    ],
)
@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_upstream_faults_map_to_clear_errors_in_each_format(
    gateway, provider, upstream_model, status, openai_error, anthropic_type
):
    model = f"{provider}/{upstream_model}"
    with pytest.raises(openai_error) as info:
        gateway.openai().chat.completions.create(model=model, messages=USER)
    assert info.value.status_code == status
    assert "sk-" not in str(info.value.body) and "gm-fake" not in str(info.value.body)
    r = _post(gateway, "/v1/messages", msgspec.json.encode({"model": model, "max_tokens": 5, "messages": USER}))
    _assert_anthropic_error(r, status, anthropic_type)
    if status == 429:
        assert int(r.headers["retry-after"]) >= 1


def test_connection_refused_is_503_and_fallback_reaches_the_next_target(gateway):
    with pytest.raises(openai.InternalServerError) as info:
        gateway.openai().chat.completions.create(model="dead/m", messages=USER)
    assert info.value.status_code == 503
    raw = gateway.openai().chat.completions.with_raw_response.create(model="fallback-test", messages=USER)
    assert raw.parse().choices[0].message.content == "echo: hi"
    assert raw.headers["x-crossway-provider"] == "anthropic"
    # which target is tried first depends on what the router has learned by now; every failure
    # before the answer is listed, and the answer comes from the one target that works
    attempts = raw.headers["x-crossway-attempts"].split(",")
    assert attempts[-1] == "anthropic/claude-fallback:ok"
    assert set(attempts[:-1]) <= {"openai/error-503:ProviderUnavailable", "dead/m:ProviderUnavailable"}


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_stream_cut_after_first_byte_ends_with_error_not_clean_close(gateway, provider):
    stream = gateway.openai().chat.completions.create(model=f"{provider}/cut-stream", messages=USER, stream=True)
    received: list[object] = []
    with pytest.raises(openai.APIError):
        received.extend(stream)
    assert received  # the failure came after the first byte
    with (
        pytest.raises(anthropic.APIStatusError),
        gateway.anthropic().messages.stream(model=f"{provider}/cut-stream", max_tokens=5, messages=USER) as s,
    ):
        s.get_final_message()


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_stream_fault_before_first_byte_is_a_plain_http_error(gateway, provider):
    with pytest.raises(openai.RateLimitError):
        gateway.openai().chat.completions.create(model=f"{provider}/error-429", messages=USER, stream=True)


def test_gateway_keeps_serving_after_faults(gateway):
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    assert (
        gateway.openai().chat.completions.create(model="gpt-test", messages=USER).choices[0].message.content
        == "echo: hi"
    )
