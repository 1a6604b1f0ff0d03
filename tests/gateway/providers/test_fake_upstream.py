"""The fake vendors themselves: exact framing, auth, errors, recording, and the official SDKs accepting them."""

from __future__ import annotations

import base64
import struct
import subprocess
import sys
import threading
from pathlib import Path

import anthropic
import httpx
import msgspec
import openai
import pytest

from tests.fakes.upstream import FakeKeys, FakeUpstream
from tests.gateway.providers.conftest import KEYS

ROOT = Path(__file__).resolve().parents[3]
OPENAI_AUTH = {"authorization": f"Bearer {KEYS.openai}"}
ANTHROPIC_AUTH = {"x-api-key": KEYS.anthropic, "anthropic-version": "2023-06-01"}
GEMINI_AUTH = {"x-goog-api-key": KEYS.gemini}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_fake_openai_stream_is_framed_as_documented(upstream):
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "a b"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(f"{upstream.url}/v1/chat/completions", json=body, headers=OPENAI_AUTH)
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = r.text.split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    chunks = [msgspec.json.decode(f.removeprefix("data: ")) for f in frames[:-2]]
    assert all(f.startswith("data: {") for f in frames[:-2])
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] == ["echo:", " a", " b"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["usage"] is None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3

    r = httpx.post(f"{upstream.url}/v1/chat/completions", json={**body, "stream_options": None}, headers=OPENAI_AUTH)
    assert all("usage" not in msgspec.json.decode(f[6:]) for f in r.text.split("\n\n")[:-2])


def test_fake_anthropic_stream_names_every_event(upstream):
    body = {
        "model": "tool-claude",
        "max_tokens": 100,
        "stream": True,
        "tools": [{"name": "f", "input_schema": {}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    r = httpx.post(f"{upstream.url}/v1/messages", json=body, headers=ANTHROPIC_AUTH)
    events = []
    for frame in r.text.split("\n\n")[:-1]:
        name_line, data_line = frame.split("\n")
        name = name_line.removeprefix("event: ")
        assert msgspec.json.decode(data_line.removeprefix("data: "))["type"] == name
        events.append(name)
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events.count("content_block_start") == 2  # a text block, then the tool_use block


def test_fake_gemini_streams_sse_with_crlf_or_one_json_array(upstream):
    body = {"contents": [{"role": "user", "parts": [{"text": "a b"}]}]}
    url = f"{upstream.url}/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    r = httpx.post(url, params={"alt": "sse"}, json=body, headers=GEMINI_AUTH)
    frames = r.text.split("\r\n\r\n")
    assert frames[-1] == "" and all(f.startswith("data: {") for f in frames[:-1])
    last = msgspec.json.decode(frames[-2][6:])
    assert last["candidates"][0]["finishReason"] == "STOP" and last["usageMetadata"]["candidatesTokenCount"] == 3
    array = httpx.post(url, json=body, headers=GEMINI_AUTH).json()
    assert [c["candidates"][0]["content"]["parts"][0]["text"] for c in array] == ["echo:", " a", " b"]


@pytest.mark.parametrize(
    ("path", "headers", "shape"),
    [
        ("/v1/chat/completions", {"authorization": "Bearer nope"}, {"error": {"message", "type", "param", "code"}}),
        ("/v1/messages", {"anthropic-version": "2023-06-01"}, {"type", "error", "request_id"}),
        ("/v1beta/models/g:generateContent", {"x-goog-api-key": "nope"}, {"error": {"code", "message", "status"}}),
    ],
)
def test_fake_rejects_a_wrong_key_with_401_in_the_vendor_shape(upstream, path, headers, shape):
    r = httpx.post(f"{upstream.url}{path}", json={"model": "m"}, headers=headers)
    assert r.status_code == 401
    doc = r.json()
    if "error" in shape and isinstance(shape, dict):
        assert set(doc["error"]) == shape["error"]
    else:
        assert set(doc) == shape and doc["error"]["type"] == "authentication_error"


def test_fake_anthropic_requires_the_version_header(upstream):
    r = httpx.post(
        f"{upstream.url}/v1/messages",
        json={"model": "m", "max_tokens": 1, "messages": []},
        headers={"x-api-key": KEYS.anthropic},
    )
    assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]


def test_fake_429_carries_retry_after(upstream):
    r = httpx.post(
        f"{upstream.url}/v1/chat/completions", json={"model": "error-429", "messages": []}, headers=OPENAI_AUTH
    )
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"


def test_fake_embeddings_in_base64_decode_to_the_float_vectors(upstream):
    url = f"{upstream.url}/v1/embeddings"
    floats = httpx.post(url, json={"model": "e", "input": ["x"], "dimensions": 4}, headers=OPENAI_AUTH).json()
    packed = httpx.post(
        url, json={"model": "e", "input": ["x"], "dimensions": 4, "encoding_format": "base64"}, headers=OPENAI_AUTH
    ).json()
    decoded = struct.unpack("<4f", base64.b64decode(packed["data"][0]["embedding"]))
    assert decoded == pytest.approx(floats["data"][0]["embedding"], rel=1e-6)


def test_fake_records_every_request(upstream):
    httpx.get(f"{upstream.url}/v1/models?limit=2", headers={**OPENAI_AUTH, "X-Trace": "t1"})
    recorded = upstream.requests[-1]
    assert (recorded.method, recorded.path, recorded.query, recorded.body) == ("GET", "/v1/models", "limit=2", None)
    assert recorded.headers["x-trace"] == "t1"


def test_official_openai_sdk_reads_the_fake(upstream):
    with openai.OpenAI(base_url=f"{upstream.url}/v1", api_key=KEYS.openai, max_retries=0) as client:
        completion = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
        assert completion.choices[0].message.content == "echo: hi" and completion.usage is not None
        stream = client.chat.completions.create(
            model="tool-gpt",
            messages=[{"role": "user", "content": "hi"}],
            tools=[WEATHER],
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[call-overload]
        )
        args = "".join(
            tc.function.arguments or ""
            for c in stream
            if c.choices
            for tc in c.choices[0].delta.tool_calls or ()
            if tc.function
        )
        assert msgspec.json.decode(args) == {"city": "Paris"}
        assert next(m.id for m in client.models.list()) == "gpt-4o-mini"
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="error-429", messages=[{"role": "user", "content": "hi"}])


def test_official_anthropic_sdk_reads_the_fake(upstream):
    with anthropic.Anthropic(base_url=upstream.url, api_key=KEYS.anthropic, max_retries=0) as client:
        message = client.messages.create(model="claude", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].type == "text" and message.content[0].text == "echo: hi"
        with client.messages.stream(
            model="tool-claude",
            max_tokens=50,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        ) as stream:
            final = stream.get_final_message()
        block = final.content[-1]
        assert final.stop_reason == "tool_use"
        assert isinstance(block, anthropic.types.ToolUseBlock) and block.input == {"city": "Paris"}
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(model="error-529", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_fake_upstream_stop_joins_its_thread_and_frees_the_port():
    with FakeUpstream(FakeKeys(openai="k")) as fake:
        assert httpx.get(f"{fake.url}/v1/models", headers={"authorization": "Bearer k"}).status_code == 200
        url, port = fake.url, fake.port
        assert any(t.name == f"fake-upstream-{port}" for t in threading.enumerate())
    assert not any(t.name == f"fake-upstream-{port}" for t in threading.enumerate())
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v1/models")


def test_fake_upstream_runs_as_its_own_process():
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.upstream", "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        for _ in range(200):
            try:
                r = httpx.get(f"{url}/v1/models", headers=OPENAI_AUTH)
                break
            except httpx.ConnectError:
                threading.Event().wait(0.02)
        assert r.status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()
