"""Prefix hashes, and the provider prompt-cache hints they drive (Anthropic cache_control, OpenAI prompt_cache_key)."""

from __future__ import annotations

from gateway.cache.prefix import (
    PROMPT_CACHE_MIN_CHARS,
    PrefixBlock,
    prefix_blocks,
    prompt_cache_key,
    request_prefix,
    stable_prefix,
)
from gateway.pipeline import PREFIX_MIN_CHARS, workload
from gateway.providers import anthropic, openai
from gateway.types import ChatRequest, Message, TextPart, Tool

LONG = "You are a careful assistant. " * (PROMPT_CACHE_MIN_CHARS // 20)


def make_request(system: str = LONG, turns: tuple[str, ...] = ("hello",), tenant: str = "acme", **kw) -> ChatRequest:
    messages = [Message("system", [TextPart(system)])] if system else []
    for i, text in enumerate(turns):
        messages.append(Message("user" if i % 2 == 0 else "assistant", [TextPart(text)]))
    request = ChatRequest(model="m", messages=messages, **kw)
    request.tenant = tenant
    return request


def test_prefix_hashes_chain_so_shared_leading_blocks_share_hashes():
    a = prefix_blocks(make_request(turns=("q1", "a1", "q2")))
    b = prefix_blocks(make_request(turns=("q1", "a1", "other")))
    assert [x.kind for x in a] == ["system", "user", "assistant", "user"]
    assert [x.hash for x in a[:3]] == [x.hash for x in b[:3]]
    assert a[3].hash != b[3].hash
    assert a[0].chars == len(LONG) and a[-1].chars == len(LONG) + len("q1a1q2")


def test_a_change_in_an_early_block_changes_every_later_hash():
    a = prefix_blocks(make_request(system="one", turns=("q", "a")))
    b = prefix_blocks(make_request(system="two", turns=("q", "a")))
    assert all(x.hash != y.hash for x, y in zip(a, b, strict=True))


def test_stable_prefix_covers_tools_and_system_only():
    blocks = prefix_blocks(make_request(tools=[Tool("f")]))
    stable = stable_prefix(blocks)
    assert stable is not None and stable.kind == "system" and stable is blocks[1]
    assert stable_prefix(prefix_blocks(make_request(system=""))) is None


def test_prompt_cache_key_is_per_tenant_and_only_for_long_stable_prefixes():
    key = prompt_cache_key(make_request(turns=("a",)))
    assert key is not None and key.startswith("cw-") and len(key) <= 64
    assert key == prompt_cache_key(make_request(turns=("a different question",)))
    assert key != prompt_cache_key(make_request(tenant="other"))
    assert prompt_cache_key(make_request(system="short")) is None


def test_openai_body_carries_prompt_cache_key_unless_the_caller_set_one():
    body = openai.build_body(make_request(), "gpt-4o-mini", stream=False)
    assert body["prompt_cache_key"] == prompt_cache_key(make_request())
    mine = make_request(extra={"prompt_cache_key": "mine"})
    assert openai.build_body(mine, "gpt-4o-mini", stream=False)["prompt_cache_key"] == "mine"
    assert "prompt_cache_key" not in openai.build_body(make_request(system="short"), "gpt-4o-mini", stream=False)


def test_anthropic_long_system_prompt_carries_cache_control_on_its_last_block():
    body = anthropic.build_body(make_request(), "claude-sonnet-4-5", stream=False)
    assert body["system"] == [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    assert "cache_control" not in str(body["messages"])  # one turn: no conversation mark


def test_anthropic_short_prompt_is_left_as_it_was():
    body = anthropic.build_body(make_request(system="Be terse."), "claude-sonnet-4-5", stream=False)
    assert body["system"] == "Be terse."
    assert "cache_control" not in str(body)


def test_anthropic_long_tools_without_system_mark_the_last_tool():
    big = Tool("search", description=LONG)
    body = anthropic.build_body(make_request(system="", tools=[Tool("a"), big]), "claude-sonnet-4-5", stream=False)
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == {"type": "ephemeral"}


def test_anthropic_long_conversation_marks_the_last_message_too_and_never_more_than_four():
    body = anthropic.build_body(make_request(turns=("q1", "a1", "q2")), "claude-sonnet-4-5", stream=True)
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1] == {"type": "text", "text": "q2", "cache_control": {"type": "ephemeral"}}
    assert "cache_control" not in str(body["messages"][:-1])
    assert str(body).count("cache_control") == 2


def test_request_prefix_is_the_stable_block_computed_once_and_kept_on_the_request():
    request = make_request(turns=("q1", "a1", "q2"), tools=[Tool("f")])
    stable = request_prefix(request)
    assert stable == stable_prefix(prefix_blocks(make_request(turns=("q1", "a1", "q2"), tools=[Tool("f")])))
    assert request.stable_prefix is stable and request_prefix(request) is stable
    assert request_prefix(make_request(system="")) is None


def test_prompt_cache_key_and_router_affinity_read_the_prefix_the_pipeline_kept():
    """Both derive from ``request.stable_prefix``: a block set there is not recomputed from the messages."""
    request = make_request()
    work = workload(request)
    assert request.stable_prefix is not None and work.prefix_key == request.stable_prefix.hash
    request.stable_prefix = PrefixBlock("system", "f" * 64, PROMPT_CACHE_MIN_CHARS)
    elsewhere = make_request(system="an unrelated prompt " * 300)
    elsewhere.stable_prefix = request.stable_prefix
    assert prompt_cache_key(request) == prompt_cache_key(elsewhere)
    assert workload(elsewhere).prefix_key == "f" * 64


def test_router_affinity_needs_a_stable_prefix_of_prefix_min_chars():
    assert workload(make_request(system="x" * (PREFIX_MIN_CHARS - 1))).prefix_key is None
    assert workload(make_request(system="x" * PREFIX_MIN_CHARS)).prefix_key is not None
    assert workload(make_request(system="")).prefix_key is None
