"""The real SmolLM2 on the in-process engine, reached through the gateway with both SDKs."""

from __future__ import annotations

import anthropic
import openai
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]

pytestmark = pytest.mark.slow


def test_openai_client_gets_greedy_answer_with_exact_usage(gateway):
    raw = gateway.openai().chat.completions.with_raw_response.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=12
    )
    completion = raw.parse()
    assert "Paris" in completion.choices[0].message.content
    assert raw.headers["x-crossway-provider"] == "local"
    assert completion.usage.prompt_tokens > 10 and 0 < completion.usage.completion_tokens <= 12


def test_stream_and_non_stream_give_the_same_greedy_text(gateway):
    client = gateway.openai()
    whole = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=16)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=QUESTION,
            temperature=0,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_anthropic_client_streams_from_the_engine(gateway):
    with gateway.anthropic().messages.stream(
        model="smollm2", max_tokens=12, messages=QUESTION, extra_body={"temperature": 0}
    ) as stream:
        final = stream.get_final_message()
    assert "Paris" in final.content[0].text and final.usage.output_tokens > 0


def test_prefix_cache_is_shared_within_a_tenant_and_not_across(gateway):
    long_question = [{"role": "system", "content": "You are a geography tutor. " * 8}, *QUESTION]
    client = gateway.openai()
    client.chat.completions.create(model="smollm2", messages=long_question, temperature=0, max_tokens=2)
    again = client.chat.completions.create(model="smollm2", messages=long_question, temperature=0, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 32
    with openai.OpenAI(base_url=f"{gateway.url}/v1", max_retries=0, api_key=_other_tenant_key(gateway)) as other:
        theirs = other.chat.completions.create(model="smollm2", messages=long_question, temperature=0, max_tokens=2)
    assert theirs.usage.prompt_tokens_details.cached_tokens == 0


def test_unsupported_features_get_a_clear_400(gateway):
    with pytest.raises(openai.BadRequestError, match="tool calling"):
        gateway.openai().chat.completions.create(
            model="smollm2",
            messages=QUESTION,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        )
    with pytest.raises(anthropic.BadRequestError, match="context"):
        gateway.anthropic().messages.create(model="smollm2", max_tokens=100_000, messages=QUESTION)


def _other_tenant_key(gateway) -> str:
    import httpx

    from tests.gateway.e2e.conftest import ADMIN_KEY

    r = httpx.post(
        f"{gateway.url}/admin/keys", json={"tenant": "other-co"}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    return str(r.json()["key"])
